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


NVFP4_BLOCK, E2M1_MAX = 16, 6.0  # NVFP4: 16-element blocks whose max maps to e2m1's 6 (core.quant)


def narrow_p(policy) -> bool:
    """True when P's format has so few bits or so little range that range_stats describes its cast (fp8, fp6,
    fp4, or a scaled P): the error model's range terms apply to the flash kernel under this policy."""
    from flashcheck.core.numerics import Format, info

    return policy.p != Format.FP64 and (info(policy.p).precision < 5 or bool(policy.p_scaling))


def _running_max(s: torch.Tensor, block_k: int, order: str) -> torch.Tensor:
    """The running max each key's P~ = exp(s - m) is taken against in the flash kernel: the max over the key
    blocks processed up to and including the key's own block (forward: blocks 0..b, reverse: b..last)."""
    lk = s.shape[-1]
    nb = -(-lk // block_k)
    pad = torch.full((*s.shape[:-1], nb * block_k - lk), -torch.inf, dtype=s.dtype)
    bm = torch.cat([s, pad], -1).unflatten(-1, (nb, block_k)).amax(-1)
    run = bm.flip(-1).cummax(-1).values.flip(-1) if order == "reverse" else bm.cummax(-1).values
    return run.repeat_interleave(block_k, -1)[..., :lk]


def _p_cast(x: torch.Tensor, policy, block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(flushed, exact, r) for P~ * p_scale values x [..., Lk] (0 where masked) as the p stage casts them:
    flushed, the values that round to 0 (below half the smallest subnormal; with p_scaling nvfp4, of their
    16-key block's scale max/6); exact, each value that lands on the format's top (x = p_scale: P~ = 1, the
    running max; nvfp4: each key block's max, mapped to 448 x 6 by the row scale); r, the squared ratio of
    the value's spacing to the spacing an unbounded exponent would give (1 for normal values, 4^k for k
    binades into the subnormals)."""
    from flashcheck.core.numerics import info

    fi = info(policy.p)
    y = x
    if policy.p_scaling == "nvfp4":
        lk = x.shape[-1]
        nb = -(-lk // NVFP4_BLOCK)
        xp = torch.cat([x, x.new_zeros(*x.shape[:-1], nb * NVFP4_BLOCK - lk)], -1).unflatten(-1, (nb, NVFP4_BLOCK))
        bmax = xp.amax(-1, keepdim=True).expand_as(xp).flatten(-2)[..., :lk]
        y = torch.where(bmax > 0, x / bmax.clamp_min(1e-300) * E2M1_MAX, x)
        nt = -(-lk // block_k)
        xt = torch.cat([x, x.new_zeros(*x.shape[:-1], nt * block_k - lk)], -1).unflatten(-1, (nt, block_k))
        tmax = xt.amax(-1, keepdim=True).expand_as(xt).flatten(-2)[..., :lk]
        exact = (x == tmax) & (x > 0)
    else:
        exact = x == policy.p_scale
    tiny = 2.0 ** (fi.min_exp - fi.precision)  # smallest subnormal
    flushed = (y < tiny / 2) & (x > 0)
    e = torch.frexp(y.clamp_min(tiny / 4)).exponent.to(y.dtype)  # the kept values: y >= tiny / 2
    r = torch.pow(4.0, (fi.min_exp - e).clamp_min(0))
    return flushed, exact, r


def range_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    policy,
    *,
    block_k: int,
    order: str = "forward",
    causal: bool = False,
    mask: torch.Tensor | None = None,
    kernel: str = "flash",
) -> dict[str, float]:
    """What a kernel's cast of P to a narrow format does on these inputs (the error model's range terms;
    sampled rows as input_stats), from the scores alone, no kernel run. flash: each key's P~ = exp(s - m)
    against the running max m of the key blocks processed so far (block_k, order forward or reverse), times
    p_scale, as the p format rounds it (_p_cast); the output divides by the l of the unrounded P~, so a
    rounding of P~_j moves o by its share of p_j v_j, and a flushed key loses p_j v_j. standard: two casts,
    e = exp(s - row max) (renormalised by the sum of the rounded e: a rounding moves o by p_j (v_j - o), a
    flushed key's mass is redistributed) and the normalised P (not renormalised: p_j v_j, as flash). Returns
    f_p_range: sum over each cast's kept, inexact keys of p^2 |v (- o)|^2 r / sum |o|^2 (r: _p_cast; > 1 for
      subnormal values), the P-rounding sensitivity that replaces f_p (both casts of standard in one);
    f_flush: sum over rows of |the output error of the flushed keys|^2 / sum |o|^2, the squared relative
      error of the probability mass lost to underflow (a deterministic error, not a variance);
    flushed: the flushed share of the visible keys; flushed_mass: their mean probability mass per row."""
    if kernel not in ("flash", "standard"):
        raise ValueError(f"kernel={kernel!r}; range_stats covers flash and standard")
    k, v = expand_kv_heads(q, k, v)
    h = min(HEADS, q.shape[1])
    qs, ks, vs = (t[:, :h].to(torch.float64) for t in (q, k, v))
    lq, lk, d = qs.shape[-2], ks.shape[-2], qs.shape[-1]
    keep = flush = den = nflushed = nvis = mass = 0.0
    rows = 0
    v2 = vs.square().sum(-1).unsqueeze(-2)  # [B, h, 1, Lk]
    for r0, r1 in _slices(lq):
        s = qs[..., r0:r1, :] @ ks.transpose(-1, -2) * d**-0.5
        bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=s.dtype)
        if bias is not None:
            s = s + bias
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        o = p @ vs
        m = _running_max(s, block_k if kernel == "flash" else lk, order)
        x = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m))).nan_to_num(0.0)
        x = x * (policy.p_scale if kernel == "flash" else 1.0)
        cast = _flash_terms if kernel == "flash" else _standard_terms
        k_add, lost, gone = cast(x, p, o, vs, v2, policy, block_k)
        keep += k_add
        flush += float(lost.square().sum())
        den += float(o.square().sum())
        nflushed += float(gone.sum())
        nvis += float((x > 0).sum())
        mass += float((p * gone).sum())
        rows += int((p.sum(-1) > 0).sum())
    den = max(den, 1e-300)
    return {
        "f_p_range": keep / den,
        "f_flush": flush / den,
        "flushed": nflushed / max(nvis, 1.0),
        "flushed_mass": mass / max(rows, 1),
    }


def _flash_terms(x, p, o, vs, v2, policy, block_k: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """range_stats' terms of flash's one cast of P~ = x: (the kept, inexact keys' sensitivity sum, the output
    error of the flushed keys [.., rows, D], the flushed keys [.., rows, Lk])."""
    fl, ex, r = _p_cast(x, policy, block_k)
    kept = (x > 0) & ~fl & ~ex
    return float((p.square() * v2 * r * kept).sum()), (p * fl) @ vs, fl


def _standard_terms(x, p, o, vs, v2, policy, block_k: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """range_stats' terms of standard's two casts: e = exp(s - row max), renormalised by the rounded sum (a
    rounding moves o by p_j (v_j - o), a flushed key's mass is redistributed), then the normalised P."""
    fl, ex, r = _p_cast(x, policy, block_k)
    kept = (x > 0) & ~fl & ~ex
    dv2 = (v2 - 2 * o @ vs.transpose(-1, -2) + o.square().sum(-1, keepdim=True)).clamp_min(0)
    keep = float((p.square() * dv2 * r * kept).sum())
    m1 = (p * fl).sum(-1, keepdim=True)
    lost = ((p * fl) @ vs - m1 * o) / (1 - m1).clamp_min(1e-300)
    p2 = torch.where(fl, torch.zeros_like(p), p / (1 - m1).clamp_min(1e-300))  # P after the first cast
    fl2, _, r2 = _p_cast(p2, policy, block_k)
    keep += float((p2.square() * v2 * r2 * ((p2 > 0) & ~fl2)).sum())
    return keep, lost + (p2 * fl2) @ vs, fl | fl2
