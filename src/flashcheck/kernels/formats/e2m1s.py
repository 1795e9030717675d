"""The "e2m1s" operand values of the tensor-core model: block-scaled FP4, e2m1 times an e4m3 scale (NVFP4's and
SageAttention3's operands, no tensor scale): 0 or 2^-10 <= |x| <= 2688 with at most 6 significant bits
(kernels.tensorcore.mma's EMIN["e2m1s"] says why)."""

from __future__ import annotations

import torch


def fits_e2m1s(x: torch.Tensor, x32: torch.Tensor) -> bool:
    """Whether x (and x32, its float32 copy) hold only "e2m1s" operand values (kernels.sim.mma_ops' _fp4_scaled),
    on float32 bits."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) and not bool((x32 == x).all()):
        return False
    u = x32.view(torch.int32)
    e = ((u >> 23) & 0xFF) - 127  # the exponent: -10 .. 11 (2^-10 .. 2^11)
    mant = u & 0x7FFFFF  # at most 0x700000 (1.875) with its low 18 bits 0 (5 fraction bits)
    bad = ((u & 0x7FFFFFFF) != 0) & ((e < -10) | (e > 11) | (mant > 0x700000) | ((mant & 0x3FFFF) != 0))
    return not bool(bad.any())
