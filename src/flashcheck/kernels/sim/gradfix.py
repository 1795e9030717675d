"""Backward-pass knobs of the FA2 backward: which O feeds delta, and removing the row sums of rounded dS.

Shapes: q [B, H, Lq, D], k [B, H, Lk, D] (K/V heads already expanded), o [B, H, Lq, Dv]; a tile is query
rows r0: and key columns c0:c1. Exact dS rows sum to zero (sum_j P_ij (dP_ij - delta_i) = 0); rounded to
bf16 they do not, and the row sum r_i times the mean key leaks into dQ_i (arXiv 2609.34272). Projecting
each row of dS onto zero sum over its visible keys, dS' = dS - r_i / n_i, changes nothing exactly and
amounts to two rank-one corrections: dQ -= s r kbar^T and dK -= s vis^T (r / n * Q).
"""

from __future__ import annotations

import torch

from flashcheck.core.numerics import Policy, round_to
from flashcheck.kernels.sim.masks import tile_bias
from flashcheck.kernels.sim.ops import mm, rnd


def delta_operand(out_hi: torch.Tensor, pol: Policy) -> torch.Tensor:
    """The O in delta = rowsum(dO * O) under pol.delta_source (arXiv 2609.39813): "forward" rounds the
    unrounded output `out_hi` [B, H, Lq, Dv] to the delta stage (by default the forward's own rounded O),
    "unrounded" keeps it, "fresh" rounds it stochastically to the delta stage (seeded by delta_seed)."""
    if pol.delta_source == "unrounded":
        return out_hi
    if pol.delta_source == "fresh":
        g = torch.Generator(device=out_hi.device).manual_seed(pol.delta_seed)
        return round_to(out_hi, pol.delta, stochastic=True, generator=g)
    return rnd(out_hi, pol, "delta")


def visible(rows: tuple[int, int], cols: tuple[int, int], lq: int, lk: int, *, causal, mask, dtype) -> torch.Tensor:
    """1 where a query row sees a key (the mask's bias is finite), else 0; broadcasts to the tile."""
    bias = tile_bias(rows, cols, lq, lk, causal=causal, mask=mask, dtype=dtype)
    if bias is None:
        return torch.ones(1, 1, rows[1] - rows[0], cols[1] - cols[0], dtype=dtype)
    return torch.isfinite(bias).to(dtype).expand(*bias.shape[:-2], rows[1] - rows[0], cols[1] - cols[0])


class RowSumFix:
    """Accumulates, over the key tiles, each query row's dS row sum r, visible key sum and count; then
    removes r from dQ and dK (the projection in the module docstring)."""

    def __init__(self, q: torch.Tensor) -> None:
        b, h, lq, d = q.shape
        self.r = torch.zeros(b, h, lq, 1, dtype=q.dtype)
        self.ksum = torch.zeros(b, h, lq, d, dtype=q.dtype)
        self.count = torch.zeros(b, h, lq, 1, dtype=q.dtype)

    def add(self, r0: int, ds: torch.Tensor, k_j: torch.Tensor, vis: torch.Tensor) -> None:
        """One tile: ds [B, H, Lq - r0, Bc] as rounded for its products, vis its visibility."""
        self.r[..., r0:, :] += ds.sum(dim=-1, keepdim=True)
        self.ksum[..., r0:, :] += torch.matmul(vis, k_j)
        self.count[..., r0:, :] += vis.sum(dim=-1, keepdim=True)

    def row_weights(self) -> torch.Tensor:
        """r / n per query row [B, H, Lq, 1] (0 for rows with no visible key)."""
        return self.r / torch.clamp(self.count, min=1)

    def fix_dq(self, dq: torch.Tensor, scale: float, pol: Policy) -> torch.Tensor:
        """dQ - scale * r * kbar, kbar each row's mean visible key."""
        kbar = self.ksum / torch.clamp(self.count, min=1)
        return rnd(dq - rnd(self.r * kbar * scale, pol, "grad_accum"), pol, "grad_accum")

    def fix_dk_tile(
        self, dk_j: torch.Tensor, q_r: torch.Tensor, r0: int, vis: torch.Tensor, scale: float, pol: Policy
    ) -> torch.Tensor:
        """dK_j - scale * vis^T (r / n * Q) for one key tile."""
        w = self.row_weights()[..., r0:, :]
        corr = mm(vis.transpose(-1, -2).expand(*q_r.shape[:2], -1, -1), w * q_r, pol) * scale
        return rnd(dk_j - rnd(corr, pol, "grad_accum"), pol, "grad_accum")
