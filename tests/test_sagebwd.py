"""kernels.sim.sagebwd: forward and gradients against a slow hand-written oracle (tile loops, float64 products), and
gradients against FP64 autograd within a bound derived from the quantisation steps; the loss-gap verdicts."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels.sim.sagebwd import sagebwd_attention
from flashcheck.training.lossgap import context_free_loss, level, loss_gaps, sentence

L, D, BQ, BK = 12, 8, 5, 4  # partial last tiles on both axes


def _inputs(seed: int = 0, b: int = 1, h: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, L, D, generator=g, dtype=torch.float64) for _ in range(4))
    return q / 2, k / 2 + 0.7, v, do  # scores of moderate size; K offset by a mean the smoothing removes


def _q8(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Slow INT8 quantiser: one scale per rows x cols tile (amax / 127 + 1e-7 in float32), each element x / scale
    rounded half away from zero, clamped to +-127, times the scale; x [R, C]."""
    out = torch.empty(x.shape, dtype=torch.float64)
    for r0 in range(0, x.shape[0], rows):
        for c0 in range(0, x.shape[1], cols):
            tile = x[r0 : r0 + rows, c0 : c0 + cols].to(torch.float32)
            scale = tile.abs().max() / 127.0 + 1e-7
            for i in range(tile.shape[0]):
                for j in range(tile.shape[1]):
                    y = float(tile[i, j] / scale)
                    n = min(127.0, max(-127.0, math.copysign(math.floor(abs(y) + 0.5), y)))
                    out[r0 + i, c0 + j] = n * float(scale)
    return out


def _oracle(q, k, v, do, causal: bool):
    """SageBwd as the module docstring states it, one (batch, head) at a time with explicit loops."""
    outs = {n: torch.zeros_like(q) for n in ("o", "dq", "dk", "dv")}
    s = 1.0 / math.sqrt(q.shape[-1])
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qi, ki, vi, doi = q[b, h], k[b, h], v[b, h], do[b, h]
            qh = _q8(qi, BQ, D)
            kh = _q8(ki - ki.mean(dim=0), BK, D)
            vh = _q8(vi, BK, D)
            sc = torch.full((L, L), -math.inf, dtype=torch.float64)
            for i in range(L):
                for j in range(L):
                    if not causal or j <= i:
                        sc[i, j] = s * sum(float(qh[i, d]) * float(kh[j, d]) for d in range(D))
            pt = torch.exp(sc - sc.max(dim=1, keepdim=True).values)
            l = pt.sum(dim=1, keepdim=True)
            ph = torch.round(pt * 127) / 127  # ties to even, the kernel's away from 0: ties improbable
            o = (ph @ vh) / l
            p = torch.exp(sc - (sc.max(dim=1, keepdim=True).values + torch.log(l)))
            dv = _q8(p, BQ, BK).T @ _q8(doi, BQ, D)
            dp = doi.to(torch.float16).double() @ vi.to(torch.float16).double().T
            ds = p * (dp - (doi * o).sum(dim=1, keepdim=True))
            dsh = _q8(ds, BQ, BK)
            for name, val in (("o", o), ("dq", s * dsh @ kh), ("dk", s * dsh.T @ qh), ("dv", dv)):
                outs[name][b, h] = val
    return outs


def _kernel(q, k, v, do, causal: bool) -> dict[str, torch.Tensor]:
    qs, ks, vs = (t.detach().float().requires_grad_() for t in (q, k, v))
    o = sagebwd_attention(qs, ks, vs, causal=causal, block_q=BQ, block_k=BK)
    o.backward(do.float())
    return {"o": o.detach().double(), "dq": qs.grad.double(), "dk": ks.grad.double(), "dv": vs.grad.double()}


@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_gradients_match_the_slow_oracle(causal):
    q, k, v, do = _inputs(1)
    got, want = _kernel(q, k, v, do, causal), _oracle(q, k, v, do, causal)
    for name in ("o", "dq", "dk", "dv"):
        scale = want[name].abs().max()
        assert (got[name] - want[name]).abs().max() <= 2e-5 * scale, name  # float32 products vs float64


def _half_step(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Half the INT8 step of each element's tile (amax / 127 + 1e-7) / 2, x [..., R, C]."""
    out = torch.empty_like(x)
    for r0 in range(0, x.shape[-2], rows):
        for c0 in range(0, x.shape[-1], cols):
            t = x[..., r0 : r0 + rows, c0 : c0 + cols]
            amax = t.abs().amax(dim=(-2, -1), keepdim=True)
            out[..., r0 : r0 + rows, c0 : c0 + cols] = (amax / 127 + 1e-7) / 2 * 1.0001
    return out


def _bound(q, k, v, do, causal: bool) -> dict[str, torch.Tensor]:
    """First-principles bound on |kernel - exact| per element, from the quantisation steps (half a step per
    quantised operand), the softmax's sensitivity (|dS| <= E per row moves P by a factor within e^(+-2E)) and
    fp16 rounding of dP's operands (2.1 u, u = 2^-11); float32 arithmetic adds a 1% margin."""
    s = 1.0 / math.sqrt(D)
    ks = k - k.mean(dim=-2, keepdim=True)
    hq, hk, hv = _half_step(q, BQ, D), _half_step(ks, BK, D), _half_step(v, BK, D)
    keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else torch.ones(L, L, dtype=torch.bool)
    sc = (q @ ks.transpose(-1, -2) * s).masked_fill(~keep, -math.inf)
    p = torch.softmax(sc, dim=-1)
    aq, ak = q.abs(), ks.abs()
    e = s * (hq @ ak.transpose(-1, -2) + aq @ hk.transpose(-1, -2) + hq @ hk.transpose(-1, -2))
    big_e = e.masked_fill(~keep, 0).amax(dim=-1, keepdim=True)
    dp_ = p * torch.expm1(2 * big_e)  # |P' - P|
    rho = keep.double() / 254  # P~ rounding (static scale 1/127), divided by l' >= 1
    d_o = (dp_ + rho) @ (v.abs() + hv) + p @ hv
    o = p @ v
    dpm = do @ v.transpose(-1, -2)
    delta = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dpm - delta)
    err_dp = 2.1 * 2.0**-11 * (do.abs() @ v.abs().transpose(-1, -2)) + 1e-7
    err_delta = (do.abs() * d_o).sum(dim=-1, keepdim=True)
    err_ds = dp_ * (dpm - delta).abs() + (p + dp_) * (err_dp + err_delta)
    err_ds = (err_ds + _half_step(ds.abs() + err_ds, BQ, BK)) * keep
    hdo = _half_step(do, BQ, D)
    err_p = dp_ + _half_step(p + dp_, BQ, BK) * keep
    return {
        "o": d_o,
        "dq": s * (err_ds @ ak + (ds.abs() + err_ds) @ hk),
        "dk": s * (err_ds.transpose(-1, -2) @ aq + (ds.abs() + err_ds).transpose(-1, -2) @ hq),
        "dv": err_p.transpose(-1, -2) @ (do.abs() + hdo) + p.transpose(-1, -2) @ hdo,
    }


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_against_fp64_autograd_within_the_derived_bound(causal):
    q, k, v, do = _inputs(2)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else torch.ones(L, L, dtype=torch.bool)
    sc = (qs @ ks.transpose(-1, -2) / math.sqrt(D)).masked_fill(~keep, -math.inf)
    o = torch.softmax(sc, dim=-1) @ vs
    o.backward(do)
    exact = {"o": o.detach(), "dq": qs.grad, "dk": ks.grad, "dv": vs.grad}
    got, bound = _kernel(q, k, v, do, causal), _bound(q, k, v, do, causal)
    for name in exact:
        err = (got[name] - exact[name]).abs()
        assert (err <= bound[name] * 1.01 + 1e-6 * exact[name].abs().max()).all(), name
        assert err.max() > 0  # quantised: not the exact values
        assert bound[name].max() < 0.5 * exact[name].abs().max(), name  # the bound says something


def test_bad_input_is_named():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="block_q=0"):
        sagebwd_attention(q, q, q, block_q=0)
    with pytest.raises(ValueError, match=r"\(1, 1, 4, 8\), \(1, 1, 4, 4\)"):
        sagebwd_attention(q, q[..., :4], q)
    with pytest.raises(ValueError, match="Lq <= Lk"):
        sagebwd_attention(q, q[..., :2, :], q[..., :2, :], causal=True)


def _losses(levels: dict[str, list[float]], steps: int = 20) -> dict[str, list[float]]:
    """Per-step losses whose last 10% average to the given level per seed (a falling curve before)."""
    return {f"{n}-s{s}": [5.0 - i * 0.01 for i in range(steps - 2)] + [x, x] for n, xs in levels.items()
            for s, x in enumerate(xs)}  # fmt: skip


def test_loss_gap_verdicts_against_the_seed_spread():
    base = [2.0, 2.1, 1.9]  # sample sd 0.1
    runs = _losses({"base": base, "sage8": [2.3, 2.4, 2.2], "sage8ft": [2.05, 2.12, 1.88]})
    gap = loss_gaps(runs, [0, 1, 2], plateau=3.0)
    assert gap["spread"] == pytest.approx(0.1) and gap["tail_steps"] == 2 and gap["base_left_plateau"]
    assert gap["variants"]["sage8"]["gap"] == pytest.approx(0.3) and gap["variants"]["sage8"]["verdict"] == "slower"
    assert gap["variants"]["sage8ft"]["gap"] == pytest.approx(0.05 / 3)
    assert gap["variants"]["sage8ft"]["verdict"] == "lossless" and gap["claim"]["status"] == "holds"
    flipped = loss_gaps(runs | _losses({"sage8": base}), [0, 1, 2], plateau=3.0)
    assert flipped["variants"]["sage8"]["verdict"] == "lossless" and flipped["claim"]["status"] == "does not hold"
    stuck = loss_gaps(runs, [0, 1, 2], plateau=2.05)  # base's 2.0 is not below 2.05 - 0.1
    assert {e["verdict"] for e in stuck["variants"].values()} == {"inconclusive"} and "plateau" in str(stuck)
    assert sentence(gap, 512).endswith("at 512 tokens per step: holds.")
    assert "inconclusive (the base runs stay on the plateau" in sentence(stuck, 512)
    one = loss_gaps(runs, [0], plateau=3.0)
    assert one["spread"] is None and "too few seeds" in one["variants"]["sage8"]["reason"]
    nan = loss_gaps(runs | _losses({"sage8": [math.nan, 2.0, 2.0]}), [0, 1, 2], plateau=3.0)
    assert nan["variants"]["sage8"]["verdict"] == "slower" and "diverged" in nan["variants"]["sage8"]["reason"]
    assert level([1.0] * 9 + [3.0]) == 3.0  # last 10%: one of ten steps


def test_context_free_loss_is_the_bigram_conditional_entropy():
    deterministic = torch.tensor([0, 1, 2] * 50)  # each token fixes the next: 0 nats
    assert context_free_loss(deterministic, 3) == pytest.approx(0.0, abs=1e-12)
    g = torch.Generator().manual_seed(0)
    coin = torch.randint(0, 2, (200_000,), generator=g)  # independent fair coin: ln 2
    assert context_free_loss(coin, 2) == pytest.approx(math.log(2), abs=1e-4)
