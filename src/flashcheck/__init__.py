"""flashcheck: is Flash Attention stable? Measure attention numerics against an exact FP64 reference."""

from flashcheck.core import VERSION as __version__
from flashcheck.core.budget import check_budget
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.numerics import Format, Policy, parse_policy, round_to
from flashcheck.kernels import flash_attention, reference_attention, standard_attention

__all__ = [
    "Format",
    "InputSpec",
    "Policy",
    "__version__",
    "check_budget",
    "flash_attention",
    "make_qkv",
    "parse_policy",
    "reference_attention",
    "round_to",
    "standard_attention",
]
