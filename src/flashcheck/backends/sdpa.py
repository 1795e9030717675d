"""torch scaled_dot_product_attention pinned to one backend (math, flash, efficient, cudnn)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashcheck.backends.base import Backend
from flashcheck.backends.profiling import CUDA_SOFTMAX
from flashcheck.kernels.sim.validation import expand_kv_heads

SDPA_WHICH = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


@dataclass
class SdpaBackend(Backend):
    """torch SDPA's `which` backend, called as its own aten op (the one scaled_dot_product_attention
    dispatches to, with the same preprocessing), so an unsupported case raises instead of falling back.

    No `sdpa_kernel()` and no `allow_fp16_bf16_reduction_math_sdp()`: both set process-wide flags, which
    would change the kernel of every other thread's plain SDPA call while one of ours runs."""

    which: str = "MATH"
    lowp_math: bool = False
    supports_gqa: bool = True  # enable_gqa for MATH and FLASH_ATTENTION; K/V heads repeated for the others

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
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
        is_causal = causal and mask is None and q.shape[-2] == k.shape[-2]
        if self.which == "MATH":
            return sdpa_math(q, k, v, attn_mask, is_causal, scale, gqa, lowp=self.lowp_math)
        if self.which == "FLASH_ATTENTION":
            return sdpa_flash(q, k, v, attn_mask, is_causal, scale)
        if self.which == "EFFICIENT_ATTENTION":
            return sdpa_efficient(q, k, v, attn_mask, is_causal, scale)
        if self.which == "CUDNN_ATTENTION":
            return sdpa_cudnn(q, k, v, attn_mask, is_causal, scale)
        raise ValueError(f"SDPA backend {self.which!r}; expected one of {', '.join(SDPA_WHICH)}")


# Each SDPA backend as torch's scaled_dot_product_attention runs it once that backend is chosen
# (aten/src/ATen/native/transformers/attention.cpp): the same op, the same mask conversion and padding, so
# the bits are those of F.scaled_dot_product_attention under sdpa_kernel([backend]) (tests/test_backends.py
# compares them), without the process-wide flags. q [B, H, Lq, D], k, v [B, Hkv, Lk, D] -> [B, H, Lq, Dv].
_ATEN = torch.ops.aten
_LOWP = (torch.bfloat16, torch.float16)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype, finite: bool = False) -> torch.Tensor | None:
    """SDPA's conversion of a bool mask (True = keep) to an additive one in `dtype`: 0 / -inf."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), -65504.0 if finite else float("-inf"), zero)


def _grad_wanted(*ts: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def sdpa_math(q, k, v, mask, is_causal: bool, scale, gqa: bool, *, lowp: bool = False) -> torch.Tensor:
    """MATH: aten::_scaled_dot_product_attention_math. bf16/fp16 inputs are upcast to fp32 and the output
    cast back, as the op does with allow_fp16_bf16_reduction_math_sdp off; with `lowp`, the op's steps in
    the inputs' own format (what it does with that flag on), written out so that no flag is set."""
    mask = _additive(mask, q.dtype)
    if lowp and q.dtype in _LOWP:
        return _math_in_own_format(q, k, v, mask, is_causal, scale, gqa)
    up = q.dtype in _LOWP
    qa, ka, va = (t.float() if up else t for t in (q, k, v))
    out = _ATEN._scaled_dot_product_attention_math(qa, ka, va, mask, 0.0, is_causal, None, scale=scale, enable_gqa=gqa)
    return out[0].to(q.dtype)


def _math_in_own_format(q, k, v, mask, is_causal: bool, scale, gqa: bool) -> torch.Tensor:
    """_scaled_dot_product_attention_math's body without its fp32 upcast, step for step: q and k each
    scaled by sqrt(|scale|) (the sign on q), scores + mask, _safe_softmax (fully masked rows 0), then P V."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    root = math.sqrt(abs(s))
    qs = q * (-root if s < 0 else root)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = _additive(keep, q.dtype)
    if gqa:
        k, v = expand_kv_heads(q, k, v)
    attn = torch.matmul(qs, k.transpose(-2, -1) * root)
    if mask is not None:
        attn = attn.add_(mask)
    return torch.matmul(_ATEN._safe_softmax(attn, -1), v)


def sdpa_flash(q, k, v, mask, is_causal: bool, scale) -> torch.Tensor:
    """FLASH_ATTENTION: the CPU flash kernel (aten::_scaled_dot_product_flash_attention_for_cpu, which takes
    grouped K/V heads and a mask), or FlashAttention-2 on CUDA with the head dim padded to a multiple of 8."""
    if q.device.type != "cuda":
        return _ATEN._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=_additive(mask, q.dtype), scale=scale
        )[0]
    d = q.shape[-1]
    s = d**-0.5 if scale is None else scale  # from the head dim before padding
    pad = (-d) % 8
    qp, kp, vp = (torch.nn.functional.pad(t, (0, pad)) if pad else t for t in (q, k, v))
    out = _ATEN._scaled_dot_product_flash_attention(qp, kp, vp, 0.0, is_causal, False, scale=s)[0]
    return out[..., :d] if pad else out


def sdpa_efficient(q, k, v, mask, is_causal: bool, scale) -> torch.Tensor:
    """EFFICIENT_ATTENTION (CUDA): the CUTLASS kernel; its bias padded to an aligned last dim, then
    expanded to [B, H, Lq, Lk]; the log-sum-exp kept only where a backward will need it."""
    bias = _additive(mask, q.dtype)
    if bias is not None:
        aligned = bias.stride(-1) == 1 and all(bias.stride(i) % 8 == 0 for i in range(bias.dim() - 1))
        if not aligned:
            n = bias.shape[-1]
            bias = torch.nn.functional.pad(bias, (0, 8 - n % 8))[..., :n]
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    lse = _grad_wanted(q, k, v)
    return _ATEN._scaled_dot_product_efficient_attention(q, k, v, bias, lse, 0.0, is_causal, scale=scale)[0]


def sdpa_cudnn(q, k, v, mask, is_causal: bool, scale) -> torch.Tensor:
    """CUDNN_ATTENTION (CUDA): cuDNN's fused kernel; a bool mask becomes 0 / -65504 as SDPA converts it
    for cuDNN (which mishandled -inf)."""
    bias = _additive(mask, q.dtype, finite=True)
    lse = _grad_wanted(q, k, v)
    return _ATEN._scaled_dot_product_cudnn_attention(q, k, v, bias, lse, 0.0, is_causal, False, scale=scale)[0]


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
# sdpa-math-lowp runs the MATH op's steps itself (the op upcasts unless a process-wide flag is set): its
# proof is their softmax, aten::_safe_softmax, which plain eager attention (aten::softmax) does not run.
_LOWP_PROOF = {"cpu": (r"^aten::_safe_softmax$",), "cuda": (r"^aten::_safe_softmax$", CUDA_SOFTMAX)}
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
            "torch SDPA MATH in true low precision (its steps in bf16/fp16, no fp32 upcast)",
            proof=_LOWP_PROOF,
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
