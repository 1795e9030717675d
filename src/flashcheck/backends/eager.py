"""Plain PyTorch attention in the input dtype: the peers' same-precision baseline (flash-attn's out_pt)."""

from __future__ import annotations

import torch

from flashcheck.backends.base import Backend
from flashcheck.backends.profiling import CUDA_SOFTMAX
from flashcheck.kernels.sim.masks import tile_bias
from flashcheck.kernels.sim.validation import expand_kv_heads


def eager_attention(q, k, v, *, causal=False, scale=None, mask=None, nan_to_zero=True) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v with every op in q's dtype; [B, H, L, D] (K/V [B, Hkv, L, D] with
    grouped-query heads). Rows with no visible key give 0, in the output and in the gradients (their scores are
    zeroed before the softmax and P after it, so no NaN reaches autograd). `nan_to_zero`: a NaN P left in a row
    that has keys (scores that overflow the dtype: inf - inf) becomes 0 too, as the peers' baseline does; False
    keeps it (the hunt's baseline: a non-finite baseline marks an overflow, hunt/judge.py)."""
    k, v = expand_kv_heads(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    s = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * s
    bias = tile_bias((0, lq), (0, lk), lq, lk, causal=causal, mask=mask, dtype=scores.dtype)
    if bias is not None:
        scores = scores + bias.to(scores.device)
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    keyless = bool(dead.any())  # no copy of the L x L scores where every row has a key
    p = torch.softmax(scores.masked_fill(dead, 0.0) if keyless else scores, dim=-1)
    p = p.masked_fill(dead, 0.0) if keyless else p
    return torch.nan_to_num(p, nan=0.0).matmul(v) if nan_to_zero else torch.matmul(p, v)


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
