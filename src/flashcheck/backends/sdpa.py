"""torch scaled_dot_product_attention pinned to one backend (math, flash, efficient, cudnn)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcheck.backends.base import Availability, Backend


@dataclass
class SdpaBackend(Backend):
    """SDPA with `sdpa_kernel([which])`, so an unsupported case raises instead of falling back."""

    which: str = "MATH"
    lowp_math: bool = False

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.which)
        prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(self.lowp_math)
        try:
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=_sdpa_mask(mask, causal, q, k),
                    is_causal=causal and mask is None and q.shape[-2] == k.shape[-2],
                    scale=scale,
                )
        finally:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)

    def _available(self) -> Availability:
        if self.which in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION") and not torch.cuda.is_available():
            return Availability(False, "runs on CUDA only (CPU SDPA has MATH and FLASH_ATTENTION)")
        return Availability(True)


def _sdpa_mask(mask, causal, q, k):
    """SDPA's is_causal is top-left aligned; for Lq != Lk or with a mask, pass the bottom-right mask."""
    lq, lk = q.shape[-2], k.shape[-2]
    if not causal and mask is None:
        return None
    if causal and mask is None and lq == lk:
        return None
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.tril(keep, diagonal=lk - lq)
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask.to(q.device) & keep
    return mask.to(q.device, q.dtype).masked_fill(~keep, float("-inf"))


def sdpa_backends() -> list[Backend]:
    return [
        SdpaBackend(
            "sdpa-math",
            "torch SDPA, MATH backend (bf16/fp16 upcast to fp32 inside)",
            ops=("_scaled_dot_product_attention_math",),
            which="MATH",
            dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
        ),
        SdpaBackend(
            "sdpa-math-lowp",
            "torch SDPA MATH in true low precision (allow_fp16_bf16_reduction_math_sdp)",
            ops=("_scaled_dot_product_attention_math",),
            which="MATH",
            lowp_math=True,
        ),
        SdpaBackend(
            "sdpa-flash",
            "torch SDPA FLASH_ATTENTION (CPU flash kernel here, FA2 on CUDA)",
            ops=("_scaled_dot_product_flash_attention",),
            which="FLASH_ATTENTION",
        ),
        SdpaBackend(
            "sdpa-efficient",
            "torch SDPA EFFICIENT_ATTENTION (xformers-derived, CUDA)",
            ops=("_efficient_attention",),
            which="EFFICIENT_ATTENTION",
            needs_cuda=True,
        ),
        SdpaBackend(
            "sdpa-cudnn",
            "torch SDPA CUDNN_ATTENTION (cuDNN fused attention, CUDA)",
            ops=("_cudnn_attention",),
            which="CUDNN_ATTENTION",
            needs_cuda=True,
            dtypes=(torch.bfloat16, torch.float16),
        ),
    ]
