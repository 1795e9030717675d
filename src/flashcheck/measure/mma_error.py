"""The expected error of a tensor-core MMA chain (kernels.tensorcore.mma) derived from its operands' magnitudes: the
error
model's accumulator term for the presets with a P·V tensor-core model (policy pv_mma).

One block step (kernels.tensorcore.mma): the `nfma` products x_i = a_i b_i and c are aligned to E = max(e(c), max_i
e(x_i))
(late c: the products only), each truncated toward zero to the grid q = 2^(E - frac), summed exactly, the sum T
truncated toward zero to the grid Q = 2^(e(T) - frac_out). A value whose own finest bit is delta (a product of
codes: ulp_a ulp_b, each operand's ulp 2^(max(e, emin) - mantissa bits); c: 2^(e(c) - frac_out), 2^(e(c) - 10) in
an fp16 register) truncated to a grid g loses r (the error is -sign(value) r):
    delta >= g: r = 0 (exact; a product within frac - 2 mant binades of E keeps every bit);
    |value| < g: r = |value| (lost whole);
    else, its k = log2(g / delta) bits below g taken as uniformly distributed:
        E[r] = (g - delta) / 2,   E[r^2] = (g - delta)(2 g - delta) / 6     (-> g/2, g^2/3 for delta -> 0).
T is a multiple of q, so its truncation is a value of finest bit q cut to Q (an error only when the sum carried into a
higher binade; none for most blocks of a long chain, whose c sets E). Late c adds c to the block's result by an fp32
round-to-nearest (E[r] = 0, E[r^2] = ulp^2 / 12), as does an fp16 register after each block and the fp32
promotion of two-level accumulation. Each block's mean errors (with their signs) add to the chain's bias, its
variances (E[r^2] - E[r]^2) add in quadrature: E[err^2] = bias^2 + sum var. A block's c and T are taken at their
exact values (the chain's own errors, 2^-13 relative, do not move an exponent but rarely).

Growth over L / nfma blocks: with zero-mean V the signed term errors cancel on average and the chain's error is a
random walk of sum_b sum_i var_i(q_b), q_b ~ 2^-frac |S_b| (S_b the partial sum, |S_b|^2 ~ (b nfma / L) |S|^2 for
a random walk), but only products more than frac - 2 mant binades below |S_b| lose bits: the error grows far
slower than the FP22 rounding of the running sum (whose bias, toward zero at every step, grows linearly in L).
Here the sum over blocks is taken on the sampled rows' actual magnitudes (chain_moments), not on the random-walk
idealisation. No constant is fitted.

Shapes: a [R, L] codes, b [L, N] codes; g [R, N, L] or broadcastable: the factor from key i's own units to the
output's (running-max rescaling and scales)."""

from __future__ import annotations

import torch

from flashcheck.kernels.tensorcore.mma import EMIN, MMAModel

MANTISSA = {"e4m3": 3, "e5m2": 2, "e2m1": 1, "e2m3": 3, "e3m2": 2, "fp32": 23}


def _exp2i(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) as float64 (x != 0; -2000 for zero)."""
    e = torch.frexp(x)[1].to(torch.float64) - 1
    return torch.where(x != 0, e, torch.full_like(e, -2000.0))


def _ulp(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Each code's finest bit 2^(max(e, emin) - mantissa) (float64)."""
    return torch.exp2(_exp2i(x).clamp_min(EMIN[fmt]) - MANTISSA[fmt])


def cut_moments(value: torch.Tensor, delta: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E[r], E[r^2]) of the magnitude r a truncation toward zero of `value` (finest bit delta) to `grid` loses
    (the module docstring's closed form); all float64, broadcast together."""
    a = value.abs()
    lost = a < grid
    mid = (grid - delta).clamp_min(0.0)
    mean = torch.where(lost, a, mid / 2)
    second = torch.where(lost, a * a, mid * (2 * grid - delta) / 6)
    zero = (delta >= grid) | (a == 0)
    return mean.masked_fill(zero, 0.0), second.masked_fill(zero, 0.0)


def _rne_second(x: torch.Tensor, mant: int, emin: int) -> torch.Tensor:
    """E[r^2] of a round to nearest of x to a format with `mant` fraction bits (normal from 2^emin): ulp^2 / 12."""
    ulp = torch.exp2(_exp2i(x).clamp_min(emin) - mant)
    return torch.where(x != 0, ulp * ulp / 12, torch.zeros_like(x))


def _signed(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    return -torch.sign(x) * mean


def _block_step(x, dx, c, model: MMAModel, c_mant: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block: x [..., nfma] products (own units), dx their finest bits, c [...] the exact accumulator before
    it. Returns (bias, variance, T) of the block's error (own units) and the exact T = c + sum x."""
    ex = _exp2i(x).amax(-1)
    ec = _exp2i(c)
    e = ex if model.late_c else torch.maximum(ex, ec)
    q = torch.exp2(e.clamp_min(model.min_exp) - model.frac)
    m, s2 = cut_moments(x, dx, q.unsqueeze(-1))
    bias = _signed(x, m).sum(-1)
    var = (s2 - m * m).sum(-1)
    # the sum's finest bit: the grid q, or coarser where every term's finest bit is (8-bit products of a
    # few binades summed to fewer than frac_out bits lose nothing)
    fine = torch.where(x != 0, dx, torch.full_like(dx, torch.inf)).amin(-1)
    if not model.late_c:  # c aligned with the products (its own bits: frac_out, or fp16's)
        dc = torch.exp2(ec - c_mant)
        mc, sc = cut_moments(c, dc, q)
        bias, var = bias + _signed(c, mc), var + sc - mc * mc
        fine = torch.where(c != 0, torch.minimum(fine, dc), fine)
    d = x.sum(-1) + (0.0 if model.late_c else c)
    big = torch.exp2(_exp2i(d).clamp_min(-126) - model.frac_out)
    mo, so = cut_moments(d, torch.maximum(q, fine), big)
    bias, var = bias + _signed(d, mo), var + so - mo * mo
    if model.late_c:  # + c by an fp32 round to nearest
        var = var + _rne_second(d + c, 23, -126)
    return bias, var, x.sum(-1) + c


def chain_moments(
    a: torch.Tensor,
    b: torch.Tensor,
    model: MMAModel,
    *,
    fmt: tuple[str, str] = ("e4m3", "e4m3"),
    g: torch.Tensor | None = None,
    promote_every: int | None = None,
    acc: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bias [R, N], variance [R, N]) of the error of mma_matmul(a, b, model, ...) (a [R, L], b [L, N] codes of
    fmt) predicted in closed form per block; with g (broadcasting to [R, N, L], constant within each block of
    nfma keys) every key's product counts as x g in the output's units: the chain's accumulator before a block is
    the exact sum so far divided by the block's g (a rescaled running max), its errors multiplied by g."""
    nf = model.nfma
    r, length = a.shape
    n = b.shape[1]
    pad = (-length) % nf
    x = a.to(torch.float64).unsqueeze(1) * b.to(torch.float64).t().unsqueeze(0)  # [R, N, L]
    dx = _ulp(a.to(torch.float64), fmt[0]).unsqueeze(1) * _ulp(b.to(torch.float64), fmt[1]).t().unsqueeze(0)
    gg = torch.ones(1, 1, 1, dtype=torch.float64) if g is None else g.to(torch.float64)
    gg = gg.expand(r, n, length)
    if pad:
        x, dx = torch.nn.functional.pad(x, (0, pad)), torch.nn.functional.pad(dx, (0, pad), value=1.0)
        gg = torch.nn.functional.pad(gg, (0, pad), value=1.0)
    nb = x.shape[-1] // nf
    xb, dxb, gb = x.unflatten(-1, (nb, nf)), dx.unflatten(-1, (nb, nf)), gg.unflatten(-1, (nb, nf))[..., 0]
    seg = max(1, (promote_every or x.shape[-1]) // nf)  # blocks per chain (two levels: a chain per segment)
    bias = torch.zeros(r, n, dtype=torch.float64)
    var = torch.zeros(r, n, dtype=torch.float64)
    total = torch.zeros(r, n, dtype=torch.float64)  # exact sum so far, output units
    c_mant = 10 if acc == "fp16" else model.frac_out
    for s0 in range(0, nb, seg):
        part = torch.zeros(r, n, dtype=torch.float64)  # this chain's exact sum, output units
        for j in range(s0, min(nb, s0 + seg)):
            gj = gb[..., j]
            bj, vj, _ = _block_step(xb[..., j, :], dxb[..., j, :], part / gj, model, c_mant)
            part = part + xb[..., j, :].sum(-1) * gj
            bias, var = bias + bj * gj, var + vj * gj * gj
            if acc == "fp16":  # the register rounds each block's result to fp16
                var = var + _rne_second(part / gj, 10, -14) * gj * gj
        total = total + part
        if promote_every:  # the chain's result added to the fp32 accumulator, round to nearest
            var = var + _rne_second(total, 23, -126)
    return bias, var


ACC_ROWS, ACC_COLUMNS, ACC_HEADS = 16, 16, 2  # query rows (evenly over Lq), V columns and heads sampled


def pv_mma_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    policy,
    *,
    block_k: int,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """f_acc: the P·V tensor-core chain's expected squared error (chain_moments) summed over sampled rows and V
    columns, over their sum |o|^2: the relative squared error the MMA adds to the flash kernel's output under
    policy (pv_mma, acc_promote, acc_nearest with acc_bits 10: an fp16 register). From the scores alone: each
    key's P~ = exp(s - m) against the running max of the key blocks in the kernel's order (kv_order), times
    p_scale, in P's format; V's codes as the kernel quantises them (kernels.sim.mma_ops.v_codes); the chain runs in
    each key block's units (g: the running max's rescaling and V's scale). {} without a pv_mma model."""
    from flashcheck.core.numerics import round_to
    from flashcheck.kernels.sim.mma_ops import OPERAND_FORMATS, v_codes
    from flashcheck.kernels.sim.validation import expand_kv_heads
    from flashcheck.kernels.tensorcore.mma import MMA_MODELS
    from flashcheck.measure.inputstats import _running_max, row_scores

    if not policy.pv_mma:
        return {}
    model = MMA_MODELS[policy.pv_mma]
    k, v = expand_kv_heads(q, k, v)
    h = min(ACC_HEADS, q.shape[1])
    qs, ks = q[:, :h].to(torch.float64), k[:, :h].to(torch.float64)
    vo = v_codes(v[:, :h], policy, block_k)
    lq, lk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    rows = torch.linspace(0, lq - 1, min(lq, ACC_ROWS)).round().long().unique()
    cols = torch.linspace(0, dv - 1, min(dv, ACC_COLUMNS)).round().long().unique()
    s = row_scores(qs, ks, rows, causal, mask)  # [B, h, r, Lk]
    codes = vo.codes[..., cols].to(torch.float64)
    vscale = vo.scale.expand(*vo.scale.shape[:-2], lk, vo.scale.shape[-1])
    vscale = vscale[..., cols] if vscale.shape[-1] == dv else vscale.expand(*vscale.shape[:-1], len(cols))
    if (policy.kv_order or "forward") == "reverse":  # key blocks last to first: the chain runs over flipped keys
        s, codes, vscale = s.flip(-1), codes.flip(-2), vscale.flip(-2)
    m = _running_max(s, block_k, "forward")
    live = torch.isfinite(s)
    x = torch.where(live, torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m))), 0.0) * policy.p_scale
    pf = OPERAND_FORMATS.get(policy.p)
    if pf is None or policy.p_scaling:
        pf = "fp32"
    else:
        x = round_to(x, policy.p)
    gm = torch.exp(torch.where(live, m - m[..., -1:], 0.0)).nan_to_num(1.0)  # [B, h, r, Lk]
    fmt = (pf, vo.fmt)
    acc = "fp16" if policy.acc_nearest and policy.acc_bits == 10 else "fp32"
    num = den = 0.0
    for bi in range(s.shape[0]):
        for hi in range(h):
            vs = vscale[min(bi, vscale.shape[0] - 1), min(hi, vscale.shape[1] - 1)]  # [Lk, n]
            g = gm[bi, hi].unsqueeze(1) * vs.t().unsqueeze(0)  # [r, n, Lk]
            a, b = x[bi, hi], codes[bi, hi]
            bias, var = chain_moments(a, b, model, fmt=fmt, g=g, promote_every=policy.acc_promote or None, acc=acc)
            exact = (a.unsqueeze(1) * b.t().unsqueeze(0) * g).sum(-1)
            num += float((bias.square() + var).sum())
            den += float(exact.square().sum())
    return {"f_acc": num / den if den > 0 else 0.0}
