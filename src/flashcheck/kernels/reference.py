"""The FP64 oracle: exact attention computed in query chunks (memory O(L * chunk), never L x L)."""

from __future__ import annotations

import torch

from flashcheck.kernels.masks import tile_bias
from flashcheck.kernels.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty

REFERENCE_BLOCK_BYTES = 64 * 2**20  # cap on one query chunk's FP64 scores [B, H, rows, Lk]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    chunk: int = 1024,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v in float64.

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (Hkv divides H) -> out [B, H, Lq, Dv]
    float64 (and, with `return_lse`, the log-sum-exp [B, H, Lq]). `mask`: bool (True = keep) or
    additive, broadcastable to [B, H, Lq, Lk]. Fully masked rows, and every row when Lk = 0, give 0
    and lse -inf (kernels.validation has the input rule). Differentiable."""
    scale = check_attention_inputs(q, k, v, mask=mask, scale=scale)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be a positive integer")
    if is_empty(q, k, v):
        out, lse = empty_attention(q, k, v, dtype=torch.float64)
        return (out, lse) if return_lse else out
    k, v = expand_kv_heads(q, k, v)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = d**-0.5 if scale is None else scale
    rows = _chunk_rows(chunk, q.shape[0] * q.shape[1] * lk)
    inplace = not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    outs, lses = [], []
    with torch.autocast(device_type=q.device.type, enabled=False):
        q64, k64, v64 = q.to(torch.float64), k.to(torch.float64), v.to(torch.float64)
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            scores = torch.matmul(q64[..., r0:r1, :], k64.transpose(-1, -2))
            scores = scores.mul_(s) if inplace else scores * s
            bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=torch.float64)
            if bias is not None:
                bias = bias.to(scores.device)
                scores = scores.add_(bias) if inplace else scores + bias
            m = scores.detach().amax(dim=-1, keepdim=True)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = scores.sub_(m_safe).exp_() if inplace else torch.exp(scores - m_safe)
            denom = e.sum(dim=-1, keepdim=True)
            dead = denom == 0
            outs.append(torch.matmul(e, v64) / torch.where(dead, torch.ones_like(denom), denom))
            lses.append(torch.where(dead, torch.full_like(denom, float("-inf")), m_safe + torch.log(denom)).squeeze(-1))
    out = torch.cat(outs, dim=-2)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out


def _chunk_rows(chunk: int, row_elems: int, max_bytes: int = REFERENCE_BLOCK_BYTES) -> int:
    """Query rows per chunk: at most `chunk`, and few enough that one fp64 score block fits max_bytes."""
    return max(1, min(chunk, max_bytes // (8 * row_elems)))
