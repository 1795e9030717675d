"""Attention kernels: the FP64 oracle, and the standard and Flash simulators under numerics policies."""

from flashcheck.kernels.flash import FlashConfig, flash_attention
from flashcheck.kernels.reference import reference_attention
from flashcheck.kernels.standard import standard_attention

__all__ = ["FlashConfig", "flash_attention", "reference_attention", "standard_attention"]
