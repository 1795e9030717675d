"""Plain PyTorch attention in the input dtype: the peers' same-precision baseline (flash-attn's out_pt)."""

from __future__ import annotations

import torch

from flashcheck.backends.base import Backend
from flashcheck.backends.profiling import CUDA_SOFTMAX
from flashcheck.kernels.masks import tile_bias
from flashcheck.kernels.validation import expand_kv_heads


def eager_attention(q, k, v, *, causal=False, scale=None, mask=None) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v with every op in q's dtype; [B, H, L, D] (K/V [B, Hkv, L, D] with
    grouped-query heads); fully masked rows 0."""
    k, v = expand_kv_heads(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    s = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * s
    bias = tile_bias((0, lq), (0, lk), lq, lk, causal=causal, mask=mask, dtype=scores.dtype)
    if bias is not None:
        scores = scores + bias.to(scores.device)
    p = torch.softmax(scores, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no key left
    return torch.matmul(p, v)


class EagerBackend(Backend):
    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        return eager_attention(q, k, v, causal=causal, scale=scale, mask=mask)


def eager_backends() -> list[Backend]:
    return [
        EagerBackend(
            "eager",
            "plain PyTorch ops in the input dtype (the peers' same-precision baseline)",
            proof={"cpu": (r"^aten::_?softmax$",), "cuda": (r"^aten::_?softmax$", CUDA_SOFTMAX)},
            dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
            supports_gqa=True,
        )
    ]
