"""flashcheck: is Flash Attention stable? Measure attention numerics against an exact FP64 reference."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from flashcheck.core import VERSION as __version__

# The public names, each loaded at first use (PEP 562): `flashcheck --help` runs the CLI, a subpackage, without
# importing torch; `import flashcheck` then `flashcheck.flash_attention` works as before.
_PUBLIC = {
    "check_budget": "flashcheck.core.budget",
    "InputSpec": "flashcheck.core.inputs",
    "make_qkv": "flashcheck.core.inputs",
    "Format": "flashcheck.core.numerics",
    "Policy": "flashcheck.core.numerics",
    "parse_policy": "flashcheck.core.numerics",
    "round_to": "flashcheck.core.numerics",
    "flash_attention": "flashcheck.kernels",
    "reference_attention": "flashcheck.kernels",
    "standard_attention": "flashcheck.kernels",
}

if TYPE_CHECKING:
    from flashcheck.core.budget import check_budget
    from flashcheck.core.inputs import InputSpec, make_qkv
    from flashcheck.core.numerics import Format, Policy, parse_policy, round_to
    from flashcheck.kernels import flash_attention, reference_attention, standard_attention


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'flashcheck' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


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
