"""The FP64 oracle: exact attention computed in query chunks (memory O(L * chunk), never L x L)."""

from __future__ import annotations

import torch

from flashcheck.kernels.masks import check_mask, check_qkv, tile_bias


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

    q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] -> out [B, H, Lq, Dv] float64 (and, with
    `return_lse`, the log-sum-exp [B, H, Lq]). `mask`: bool (True = keep) or additive, broadcastable
    to [B, H, Lq, Lk]. Fully masked rows give 0 and lse -inf. Differentiable."""
    check_qkv(q, k, v)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    check_mask(mask, lq, lk)
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be a positive integer")
    s = d**-0.5 if scale is None else float(scale)
    outs, lses = [], []
    with torch.autocast(device_type=q.device.type, enabled=False):
        q64, k64, v64 = q.to(torch.float64), k.to(torch.float64), v.to(torch.float64)
        for r0 in range(0, lq, chunk):
            r1 = min(lq, r0 + chunk)
            scores = torch.matmul(q64[..., r0:r1, :], k64.transpose(-1, -2)) * s
            bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=torch.float64)
            if bias is not None:
                scores = scores + bias
            m = scores.amax(dim=-1, keepdim=True)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(scores - m_safe)
            denom = e.sum(dim=-1, keepdim=True)
            dead = denom == 0
            p = e / torch.where(dead, torch.ones_like(denom), denom)
            outs.append(torch.matmul(p, v64))
            lses.append(
                torch.where(dead, torch.full_like(denom, float("-inf")), m_safe + torch.log(denom)).squeeze(
                    -1
                )
            )
    out = torch.cat(outs, dim=-2)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out
