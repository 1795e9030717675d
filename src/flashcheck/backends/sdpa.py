"""torch scaled_dot_product_attention pinned to one backend (math, flash, efficient, cudnn)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcheck.backends.base import Backend
from flashcheck.backends.profiling import CUDA_SOFTMAX
from flashcheck.kernels.validation import expand_kv_heads


@dataclass
class SdpaBackend(Backend):
    """SDPA with `sdpa_kernel([which])`, so an unsupported case raises instead of falling back."""

    which: str = "MATH"
    lowp_math: bool = False
    supports_gqa: bool = True  # enable_gqa for MATH and FLASH_ATTENTION; K/V heads repeated for the others

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.which)
        attn_mask = _sdpa_mask(mask, causal, q, k)
        if attn_mask is not None and self.which == "FLASH_ATTENTION" and q.device.type == "cuda":
            raise ValueError(
                f"{self.name} on cuda takes no mask: causal only with Lq == Lk (got Lq={q.shape[-2]}, "
                f"Lk={k.shape[-2]}, mask {'given' if mask is not None else 'none'})"
            )
        gqa = q.shape[1] != k.shape[1]
        if gqa and self.which not in ("MATH", "FLASH_ATTENTION"):
            k, v = expand_kv_heads(q, k, v)
            gqa = False
        prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(self.lowp_math)
        try:
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=attn_mask,
                    is_causal=causal and mask is None and q.shape[-2] == k.shape[-2],
                    scale=scale,
                    enable_gqa=gqa,
                )
        finally:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)


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


# Proofs per device. On the CPU: the dispatcher op, exactly (the CPU flash op is "..._for_cpu"). On CUDA:
# the CUDA op and the CUDA kernel: PyTorch's vendored FlashAttention-2 (`pytorch_flash::flash_fwd_kernel`,
# `..._splitkv_kernel`), the CUTLASS memory-efficient kernel (`fmha_cutlassF_<dtype>_aligned_64x64_rf_sm80`),
# cuDNN's generated kernel (`cudnn_generated_fort_native_sdpa_sm80_flash_fprop_...`); MATH decomposes into
# generic kernels, so its CUDA proof is the op plus a CUDA softmax kernel (`softmax_warp_forward`,
# `cunn_SoftMaxForward`).
_MATH = r"^aten::_scaled_dot_product_attention_math$"
_MATH_PROOF = {"cpu": (_MATH,), "cuda": (_MATH, CUDA_SOFTMAX)}
_LOW = (torch.bfloat16, torch.float16)


def sdpa_backends() -> list[Backend]:
    return [
        SdpaBackend(
            "sdpa-math",
            "torch SDPA, MATH backend (bf16/fp16 upcast to fp32 inside)",
            proof=_MATH_PROOF,
            which="MATH",
            dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
        ),
        SdpaBackend(
            "sdpa-math-lowp",
            "torch SDPA MATH in true low precision (allow_fp16_bf16_reduction_math_sdp)",
            proof=_MATH_PROOF,
            which="MATH",
            lowp_math=True,
        ),
        SdpaBackend(
            "sdpa-flash",
            "torch SDPA FLASH_ATTENTION: CPU flash kernel on cpu, FlashAttention-2 on cuda",
            proof={
                "cpu": (r"^aten::_scaled_dot_product_flash_attention_for_cpu$",),
                "cuda": (r"^aten::_scaled_dot_product_flash_attention$", r"pytorch_flash::flash_fwd"),
            },
            which="FLASH_ATTENTION",
            cuda_dtypes=_LOW,
        ),
        SdpaBackend(
            "sdpa-efficient",
            "torch SDPA EFFICIENT_ATTENTION (xformers-derived CUTLASS kernel, CUDA)",
            proof={"cuda": (r"^aten::_scaled_dot_product_efficient_attention$", r"fmha_cutlassF")},
            which="EFFICIENT_ATTENTION",
            devices=("cuda",),
        ),
        SdpaBackend(
            "sdpa-cudnn",
            "torch SDPA CUDNN_ATTENTION (cuDNN fused attention, CUDA)",
            proof={"cuda": (r"^aten::_scaled_dot_product_cudnn_attention$", r"^(?!aten::).*(cudnn|flash_fprop)")},
            which="CUDNN_ATTENTION",
            devices=("cuda",),
            dtypes=_LOW,
        ),
    ]
