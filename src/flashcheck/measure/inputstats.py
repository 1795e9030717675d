"""Statistics of one input set that the error model (measure.predict) reads (from a study record, or drawn).

For a row with softmax weights p over keys (scores s, values v, exact output o), independent relative
roundings of size u of every score, or of every weight, move o by a vector whose expected squared norm is
u^2/3 times sum_j p_j^2 s_j^2 |v_j - o|^2, or sum_j p_j^2 |v_j - o|^2. Summed over rows and divided by
sum |o|^2 these give `f_score` and `f_p`, the sensitivities of the relative L2 error to score and P rounding.

Rows are sampled one by one (ROW_SAMPLES of them): the first DENSE_ROWS each, then evenly over the rest, every
sampled row weighing the rows it stands for. Under a causal mask the first rows see a handful of keys and hold
a large share of sum |o|^2 with little P error: slices of 8 rows from row 0 weighed them far above their number
(the error model then under-predicted causal cases).

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; mask [B, 1, Lq, Lk] bool."""

from __future__ import annotations

import torch

from flashcheck.kernels.sim.validation import expand_kv_heads

ROW_SAMPLES = 128  # query rows sampled, evenly spread over Lq (every row when Lq is at most this)
ROW_CHUNK = 32  # sampled rows whose scores are formed at once
DENSE_ROWS = 32  # the first rows, each sampled
HEADS = 4  # heads sampled
ONE_HOT = 2.0**-26  # a row whose largest weight is within this of 1 gives exactly one V row in fp32


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


def sampled_rows(lq: int, n: int = ROW_SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [<= n] int64, weights [<= n] float64): the first DENSE_ROWS rows each (weight 1: under a causal
    mask they see a few keys each and differ most), then rows evenly spread over the rest, each weighing the
    rows it stands for; every row (weight 1) when Lq is at most n."""
    if lq <= n:
        return torch.arange(lq), torch.ones(lq, dtype=torch.float64)
    rest = torch.linspace(DENSE_ROWS, lq - 1, n - DENSE_ROWS, dtype=torch.float64).round().long().unique()
    rows = torch.cat([torch.arange(DENSE_ROWS), rest])
    w = torch.cat([torch.ones(DENSE_ROWS, dtype=torch.float64),
                   torch.full((len(rest),), (lq - DENSE_ROWS) / len(rest), dtype=torch.float64)])  # fmt: skip
    return rows, w


def row_scores(qs, ks, rows: torch.Tensor, causal: bool, mask) -> torch.Tensor:
    """Scores of the query rows `rows` [B, h, len(rows), Lk], scale 1/sqrt(D), -inf where the bottom-right
    causal mask or the padding mask hides a key."""
    lq, lk, d = qs.shape[-2], ks.shape[-2], qs.shape[-1]
    s = qs[..., rows, :] @ ks.transpose(-1, -2) * d**-0.5
    hide = torch.zeros(len(rows), lk, dtype=torch.bool)
    if causal:
        hide = torch.arange(lk)[None, :] > rows[:, None] + (lk - lq)
    if mask is not None:
        keep = mask.to(torch.bool).expand(mask.shape[0], 1, lq, lk)[..., rows, :]
        return s.masked_fill(hide | ~keep, -torch.inf)
    return s.masked_fill(hide, -torch.inf)


def _chunks(lq: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rows, w = sampled_rows(lq)
    return [(rows[i : i + ROW_CHUNK], w[i : i + ROW_CHUNK]) for i in range(0, len(rows), ROW_CHUNK)]


def _row_sums(qs, ks, vs, rows: torch.Tensor, w: torch.Tensor, causal: bool, mask) -> tuple[float, ...]:
    """Sums over the rows `rows`, each weighing w, of: p^2 s^2 |v - o|^2, p^2 |v - o|^2, |o|^2, 1 / sum p^2,
    mean s^2; live rows; |o|^2 of the rows that are not one-hot (a one-hot row's output is one V row: ONE_HOT)."""
    s = row_scores(qs, ks, rows, causal, mask)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    s = s.masked_fill(torch.isinf(s), 0.0)
    o = p @ vs
    live = p.sum(-1) > 0
    one_hot = p.amax(-1) >= 1.0 - ONE_HOT
    v2 = vs.square().sum(-1).unsqueeze(-2)  # [B, h, 1, Lk]
    dv2 = (v2 - 2 * o @ vs.transpose(-1, -2) + o.square().sum(-1, keepdim=True)).clamp_min(0)  # |v_j - o|^2
    p2 = p.square()
    o2 = o.square().sum(-1)

    def tot(per_row: torch.Tensor) -> float:  # [B, h, rows] weighted and summed
        return float((per_row * w).sum())

    return (
        tot((p2 * s.square() * dv2).sum(-1)),
        tot((p2 * dv2).sum(-1)),
        tot(o2),
        tot((1.0 / p2.sum(-1).clamp_min(1e-300)) * live),
        tot(s.square().mean(-1)),
        tot(live.double()),
        tot(o2 * ~one_hot),
    )


def input_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, mask: torch.Tensor | None = None
) -> dict[str, float]:
    """q_std, k_std, v_std, logit_std, f_score, f_p, n_eff (1 / sum p^2), k_mean_norm, visible (mean keys per
    row), f_out (the share of sum |o|^2 in rows that are not one-hot: a one-hot row's output is one V row,
    which the output format holds exactly when V is in it), from a sample of heads and rows (FP64)."""
    k, v = expand_kv_heads(q, k, v)
    h = min(HEADS, q.shape[1])
    qs, ks, vs = q[:, :h], k[:, :h], v[:, :h]
    sums = [_row_sums(qs, ks, vs, rows, w, causal, mask) for rows, w in _chunks(q.shape[-2])]
    num_s, num_p, den, neff, logit2, rows, cold = (sum(x[i] for x in sums) for i in range(7))
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
        "f_out": cold / den,
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
    if policy.p_scaling in ("nvfp4", "sage3"):
        lk = x.shape[-1]
        nb = -(-lk // NVFP4_BLOCK)
        xp = torch.cat([x, x.new_zeros(*x.shape[:-1], nb * NVFP4_BLOCK - lk)], -1).unflatten(-1, (nb, NVFP4_BLOCK))
        bmax = xp.amax(-1, keepdim=True).expand_as(xp).flatten(-2)[..., :lk]
        y = torch.where(bmax > 0, x / bmax.clamp_min(1e-300) * E2M1_MAX, x)
        nt = -(-lk // block_k)
        xt = torch.cat([x, x.new_zeros(*x.shape[:-1], nt * block_k - lk)], -1).unflatten(-1, (nt, block_k))
        tmax = xt.amax(-1, keepdim=True).expand_as(xt).flatten(-2)[..., :lk]
        # nvfp4: the tile's max is exact (448 x 6 by the row scale); sage3: each 16-key group's max lands on
        # e2m1's 6 (the e4m3 rounding of the group's scale, common to its 16 keys, is not modelled)
        exact = (x == (tmax if policy.p_scaling == "nvfp4" else bmax)) & (x > 0)
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
    lq, lk = qs.shape[-2], ks.shape[-2]
    keep = flush = den = nflushed = nvis = mass = 0.0
    rows = 0
    v2 = vs.square().sum(-1).unsqueeze(-2)  # [B, h, 1, Lk]
    for idx, w in _chunks(lq):
        s = row_scores(qs, ks, idx, causal, mask)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        o = p @ vs
        m = _running_max(s, block_k if kernel == "flash" else lk, order)
        x = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m))).nan_to_num(0.0)
        x = x * (policy.p_scale if kernel == "flash" else 1.0)
        cast = _flash_terms if kernel == "flash" else _standard_terms
        k_add, lost, gone = cast(x, p, o, vs, v2, policy, block_k)
        keep += float((k_add * w).sum())
        flush += float((lost.square().sum(-1) * w).sum())
        den += float((o.square().sum(-1) * w).sum())
        nflushed += float((gone.sum(-1) * w).sum())
        nvis += float(((x > 0).sum(-1) * w).sum())
        mass += float(((p * gone).sum(-1) * w).sum())
        rows += float(((p.sum(-1) > 0) * w).sum())
    den = max(den, 1e-300)
    return {
        "f_p_range": keep / den,
        "f_flush": flush / den,
        "flushed": nflushed / max(nvis, 1.0),
        "flushed_mass": mass / max(rows, 1),
    }


def _flash_terms(x, p, o, vs, v2, policy, block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """range_stats' terms of flash's one cast of P~ = x: (the kept, inexact keys' sensitivity sum per row, the
    output error of the flushed keys [.., rows, D], the flushed keys [.., rows, Lk])."""
    fl, ex, r = _p_cast(x, policy, block_k)
    kept = (x > 0) & ~fl & ~ex
    return (p.square() * v2 * r * kept).sum(-1), (p * fl) @ vs, fl


def _standard_terms(x, p, o, vs, v2, policy, block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """range_stats' terms of standard's two casts: e = exp(s - row max), renormalised by the rounded sum (a
    rounding moves o by p_j (v_j - o), a flushed key's mass is redistributed), then the normalised P."""
    fl, ex, r = _p_cast(x, policy, block_k)
    kept = (x > 0) & ~fl & ~ex
    dv2 = (v2 - 2 * o @ vs.transpose(-1, -2) + o.square().sum(-1, keepdim=True)).clamp_min(0)
    keep = (p.square() * dv2 * r * kept).sum(-1)
    m1 = (p * fl).sum(-1, keepdim=True)
    lost = ((p * fl) @ vs - m1 * o) / (1 - m1).clamp_min(1e-300)
    p2 = torch.where(fl, torch.zeros_like(p), p / (1 - m1).clamp_min(1e-300))  # P after the first cast
    fl2, _, r2 = _p_cast(p2, policy, block_k)
    keep = keep + (p2.square() * v2 * r2 * ((p2 > 0) & ~fl2)).sum(-1)
    return keep, lost + (p2 * fl2) @ vs, fl | fl2
