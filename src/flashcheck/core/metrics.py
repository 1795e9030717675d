"""Error metrics between an output and a reference: pure functions of two tensors, computed in fp64.

`mask` (optional, bool, broadcastable to the tensors' shape, True = counted) restricts a metric to some
positions, e.g. the query rows that are not padding ([B, 1, Lq, 1] for outputs [B, H, Lq, D])."""

from __future__ import annotations

import math

import torch

from flashcheck.core.numerics import Format, spacing


def _pair(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if mask is None:
        return a, b
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = counted); got {getattr(mask, 'dtype', type(mask))}")
    try:
        keep = torch.broadcast_to(mask.to(a.device), a.shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {tuple(a.shape)}") from None
    return a[keep], b[keep]


def max_abs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |a - b| (nan if any difference is nan)."""
    a, b = _pair(a, b, mask)
    d = torch.sub(a, b).abs_()  # one temporary of the inputs' size (here and below), never two
    if d.numel() == 0:
        return 0.0
    return float("nan") if torch.isnan(d).any() else float(d.max())


def mean_abs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """mean |a - b|."""
    a, b = _pair(a, b, mask)
    return float(torch.sub(a, b).abs_().mean()) if a.numel() else 0.0


def std_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Standard deviation of the signed difference a - b."""
    a, b = _pair(a, b, mask)
    return float((a - b).std(unbiased=False)) if a.numel() else 0.0


def rmse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """sqrt(mean((a - b)^2))."""
    a, b = _pair(a, b, mask)
    if not a.numel():
        return 0.0
    d = torch.sub(a, b)
    return float(torch.sqrt(d.mul_(d).mean()))  # d * d: what ** 2 computes, without a second temporary


def rel_l2(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """||a - b||_2 / ||b||_2 with b the reference (inf when b is zero and a is not)."""
    a, b = _pair(a, b, mask)
    num, den = torch.linalg.vector_norm(a - b), torch.linalg.vector_norm(b)
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


def rel_l1(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """sum |a - b| / sum |b| with b the reference (SageAttention's "relative L1"; inf when b is zero and a is not)."""
    a, b = _pair(a, b, mask)
    num, den = torch.sub(a, b).abs_().sum(), b.abs().sum()
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


def cos_sim(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Cosine similarity of the flattened a and b (SageAttention's "CosSim"; 1 when both are zero, 0 when one is)."""
    a, b = _pair(a, b, mask)
    return cosine(a, b)


def max_ulp(
    a: torch.Tensor, b: torch.Tensor, fmt: Format | str = Format.FP32, mask: torch.Tensor | None = None
) -> float:
    """max |a - b| in units of the last place of `fmt` at the reference b's magnitude."""
    a, b = _pair(a, b, mask)
    if a.numel() == 0:
        return 0.0
    d = torch.sub(a, b).abs_().div_(spacing(b, fmt))
    return float("nan") if torch.isnan(d).any() else float(d.max())


def cosine(a: torch.Tensor, b: torch.Tensor, dim: int | None = None) -> float | torch.Tensor:
    """Cosine similarity of the flattened tensors, or per slice along `dim` (a tensor) when given."""
    a, b = _pair(a, b)
    if dim is not None:
        return torch.nn.functional.cosine_similarity(a, b, dim=dim, eps=1e-300)
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(torch.dot(a.flatten(), b.flatten()) / (na * nb))


def wasserstein1(a: torch.Tensor, b: torch.Tensor) -> float:
    """Exact 1-D Wasserstein-1 distance between the value distributions of a and b (any sizes).

    Equal sizes: mean |sort(a) - sort(b)|. Otherwise the integral of |F_a - F_b| over the merged
    support, as scipy.stats.wasserstein_distance computes it."""
    x = a.detach().to(torch.float64).flatten()
    y = b.detach().to(torch.float64).flatten()
    if x.numel() == 0 or y.numel() == 0:
        raise ValueError("wasserstein1 needs two non-empty tensors")
    xs, _ = torch.sort(x)
    ys, _ = torch.sort(y)
    if xs.numel() == ys.numel():
        return float((xs - ys).abs().mean())
    allv, _ = torch.sort(torch.cat([xs, ys]))
    deltas = allv[1:] - allv[:-1]
    fx = torch.searchsorted(xs, allv[:-1], right=True).to(torch.float64) / xs.numel()
    fy = torch.searchsorted(ys, allv[:-1], right=True).to(torch.float64) / ys.numel()
    return float(((fx - fy).abs() * deltas).sum())


ERROR_METRICS = {"max_abs": max_abs, "mean_abs": mean_abs, "rmse": rmse, "rel_l2": rel_l2}


def error_summary(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """The four headline errors of `out` against `ref`: max_abs, mean_abs, rmse, rel_l2 (over `mask`)."""
    return {name: fn(out, ref, mask) for name, fn in ERROR_METRICS.items()}


def ratio(num: dict[str, float], den: dict[str, float]) -> dict[str, float]:
    """Element-wise num / den of two metric dicts (inf where den is 0 and num is not; 1 where both 0)."""
    out = {}
    for key, n in num.items():
        d = den[key]
        out[key] = (1.0 if n == 0 else math.inf) if d == 0 else n / d
    return out


def wasserstein1_weighted(xa: torch.Tensor, wa: torch.Tensor, xb: torch.Tensor, wb: torch.Tensor) -> float:
    """Exact W1 between two weighted discrete distributions (atoms x with weights w, each normalised)."""
    xa, wa, xb, wb = (t.detach().to(torch.float64).flatten() for t in (xa, wa, xb, wb))
    if xa.numel() == 0 or xb.numel() == 0:
        raise ValueError("wasserstein1_weighted needs two non-empty distributions")
    oa, ob = torch.argsort(xa), torch.argsort(xb)
    xa, wa, xb, wb = xa[oa], wa[oa] / wa.sum(), xb[ob], wb[ob] / wb.sum()
    allv, _ = torch.sort(torch.cat([xa, xb]))
    ca, cb = torch.cumsum(wa, 0), torch.cumsum(wb, 0)
    ia = torch.searchsorted(xa, allv[:-1], right=True)
    ib = torch.searchsorted(xb, allv[:-1], right=True)
    fa = torch.where(ia > 0, ca[(ia - 1).clamp(min=0)], torch.zeros_like(allv[:-1]))
    fb = torch.where(ib > 0, cb[(ib - 1).clamp(min=0)], torch.zeros_like(allv[:-1]))
    return float(((fa - fb).abs() * (allv[1:] - allv[:-1])).sum())
