"""flashcheck: is Flash Attention stable? Measure attention numerics against an exact FP64 reference."""

from flashcheck.inputs import InputSpec, make_qkv
from flashcheck.kernels import flash_attention, reference_attention, standard_attention
from flashcheck.numerics import Format, Policy, parse_policy, round_to

__version__ = "0.1.0"

__all__ = [
    "Format",
    "InputSpec",
    "Policy",
    "__version__",
    "flash_attention",
    "make_qkv",
    "parse_policy",
    "reference_attention",
    "round_to",
    "standard_attention",
]
