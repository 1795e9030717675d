"""Statistics of one input set that the error model (measure.predict) reads (from a study record, or drawn).

For a row with softmax weights p over keys (scores s, values v, exact output o), independent relative
roundings of size u of every score, or of every weight, move o by a vector whose expected squared norm is
u^2/3 times sum_j p_j^2 s_j^2 |v_j - o|^2, or sum_j p_j^2 |v_j - o|^2. Summed over rows and divided by
sum |o|^2 these give `f_score` and `f_p`, the sensitivities of the relative L2 error to score and P rounding.

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; mask [B, 1, Lq, Lk] bool."""

from __future__ import annotations

import torch

from flashcheck.kernels.masks import tile_bias
from flashcheck.kernels.validation import expand_kv_heads

ROWS = 8  # rows per sampled slice
SLICES = 4  # slices spread over the queries
HEADS = 4  # heads sampled


def _visible_mean(lq: int, lk: int, causal: bool, mask: torch.Tensor | None) -> float:
    """Mean number of keys a query row sees (bottom-right causal; the padding mask where given)."""
    if mask is not None:
        keep = mask.expand(mask.shape[0], 1, lq, lk)
        if causal:
            i = torch.arange(lq)[:, None] + (lk - lq)
            keep = keep & (torch.arange(lk)[None, :] <= i)
        return float(keep.sum(dim=-1).double().mean())
    if not causal:
        return float(lk)
    vis = (torch.arange(lq) + (lk - lq) + 1).clamp(0, lk)
    return float(vis.double().mean())


def _slices(lq: int) -> list[tuple[int, int]]:
    if lq <= ROWS * SLICES:
        return [(0, lq)]
    starts = torch.linspace(0, lq - ROWS, SLICES).round().long().tolist()
    return [(s, s + ROWS) for s in starts]


def _row_sums(qs, ks, vs, r0: int, r1: int, causal: bool, mask) -> tuple[float, ...]:
    """Sums over rows r0..r1 of: p^2 s^2 |v - o|^2, p^2 |v - o|^2, |o|^2, 1 / sum p^2, mean s^2; live rows."""
    lq, lk, d = qs.shape[-2], ks.shape[-2], qs.shape[-1]
    s = qs[..., r0:r1, :] @ ks.transpose(-1, -2) * d**-0.5
    bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=s.dtype)
    p = torch.softmax(s if bias is None else s + bias, dim=-1).nan_to_num(0.0)
    o = p @ vs
    live = p.sum(-1) > 0
    v2 = vs.square().sum(-1).unsqueeze(-2)  # [B, h, 1, Lk]
    dv2 = (v2 - 2 * o @ vs.transpose(-1, -2) + o.square().sum(-1, keepdim=True)).clamp_min(0)  # |v_j - o|^2
    p2 = p.square()
    return (
        float((p2 * s.square() * dv2).sum()),
        float((p2 * dv2).sum()),
        float(o.square().sum()),
        float((1.0 / p2.sum(-1).clamp_min(1e-300))[live].sum()),
        float(s.square().mean(-1).sum()),
        int(live.sum()),
    )


def input_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, mask: torch.Tensor | None = None
) -> dict[str, float]:
    """q_std, k_std, v_std, logit_std, f_score, f_p, n_eff (1 / sum p^2), k_mean_norm, visible (mean keys per
    row), from a sample of heads and rows (FP64)."""
    k, v = expand_kv_heads(q, k, v)
    h = min(HEADS, q.shape[1])
    qs, ks, vs = q[:, :h], k[:, :h], v[:, :h]
    sums = [_row_sums(qs, ks, vs, r0, r1, causal, mask) for r0, r1 in _slices(q.shape[-2])]
    num_s, num_p, den, neff, logit2, rows = (sum(x[i] for x in sums) for i in range(6))
    den, rows = max(den, 1e-300), max(rows, 1)
    return {
        "q_std": float(q.std()),
        "k_std": float(k.std()),
        "v_std": float(v.std()),
        "logit_std": (logit2 / rows) ** 0.5,
        "f_score": num_s / den,
        "f_p": num_p / den,
        "n_eff": neff / rows,
        "k_mean_norm": float(k.mean(dim=-2).norm(dim=-1).mean()),
        "visible": _visible_mean(q.shape[-2], k.shape[-2], causal, mask),
    }
