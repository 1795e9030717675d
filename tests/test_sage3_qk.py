"""SageAttention3's Q K^T (kernels.formats.sage3 rule 2): the B200 MMA chain over the FP4 columns started from
delta_s = qm Ks^T (api.py's 16-bit matmul), against mmaemu's block step (its readable reference, bfma) and the
numpy operands of tests/preset_oracles.py, bit for bit; the old product of the 2 D concatenations differs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashcheck.kernels.formats.sage3 import DeltaS
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.mma_ops import MMAOperands, qk_scores
from flashcheck.kernels.sim.presets import resolve
from flashcheck.kernels.tensorcore.mma import B200, mma_matmul
from preset_oracles import HALF, sage3_qk

mmaemu_chain = pytest.importorskip("mmaemu.model.chain")
mmaemu_presets = pytest.importorskip("mmaemu.model.presets")

LQ, LK, D = 200, 96, 64  # two query groups of 128 rows (the last ragged), two blocks of 32 along D
LOG2E = 1.4426950408889634


def _qk(seed: int, half: str):
    rng = np.random.default_rng(seed)
    shift = 2.0 * rng.standard_normal(D)  # a channel offset shared by Q and K: qm and delta_s far from zero
    q, k = rng.standard_normal((LQ, D)) + shift, rng.standard_normal((LK, D)) + shift
    return q, k


def _operands(q, k, half: str):
    """The flash forward's operands for sage3-fp4 at `half`: round_inputs, then MMAOperands.make."""
    kw = resolve("sage3-fp4", half, LQ, LK, D, False)
    pol = kw["policy"]
    t = [torch.tensor(x)[None, None] for x in (q, k, k)]
    qr, kr, vr, _ = round_inputs(*t, pol, block_q=kw["block_q"], block_k=kw["block_k"])
    return qr, kr, MMAOperands.make(qr, kr, vr, pol, kw["block_q"], kw["block_k"])


def _oracle_scores(qq, kq, delta, sc: float) -> np.ndarray:
    """fp32(sc * chain), the chain mmaemu's b200 block step over D in blocks of 32 from c = delta_s. The FP4
    values (e2m1 x e4m3) are at least 2^-10, above e5m2's emin: its clamp, as the "fp32" operands', is inert."""
    pre = mmaemu_presets.get_preset("b200_mma_sync", warn=False)
    assert (pre.nfma, pre.frac, pre.frac_out, pre.min_exp, pre.late_c) == (32, 25, 23, -133, True)
    nz = np.concatenate([qq[qq != 0], kq[kq != 0]])
    assert np.abs(nz).min() >= 2.0**-14
    a = torch.tensor(qq)[:, None, :].expand(-1, kq.shape[0], -1)
    b = torch.tensor(kq)[None, :, :].expand(qq.shape[0], -1, -1)
    acc = torch.tensor(np.asarray(delta, np.float32), dtype=torch.float64)
    for k0 in range(0, qq.shape[1], pre.nfma):
        acc = mmaemu_chain.bfma(a[..., k0 : k0 + 32], b[..., k0 : k0 + 32], acc, pre, ("e5m2", "e5m2"))
    return np.asarray(acc.numpy() * sc, np.float32)


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_sage3_scores_are_the_chain_from_delta_s_bit_for_bit(half):
    q, k = _qk(11, half)
    qq, kq, delta = sage3_qk(q, k, half)
    _, _, ops = _operands(q, k, half)
    assert ops is not None and ops.model_qk is B200 and ops.q.fmt == ops.k.fmt == "e2m1s"
    assert ops.q.codes.shape[-1] == D  # the FP4 columns only
    sc = D**-0.5 * LOG2E
    want = _oracle_scores(qq, kq, delta, sc)
    for r0, r1, c0, c1 in ((0, LQ, 0, LK), (96, 200, 32, 96), (130, 190, 0, 64)):  # across row 128; in one group
        got = qk_scores(ops.q.rows(r0, r1), ops.k.rows(c0, c1), ops.model_qk, sc, c=ops.qk_c(r0, r1, c0, c1))
        assert np.array_equal(got[0, 0].numpy().view(np.int32), want[r0:r1, c0:c1].view(np.int32)), (r0, c0)


def test_the_old_concatenated_product_fails_the_oracle():
    q, k = _qk(11, "bf16")
    qq, kq, delta = sage3_qk(q, k, "bf16")
    qr, kr, _ = _operands(q, k, "bf16")
    assert qr.shape[-1] == 2 * D  # [Qs', qm] and [Ks', Ks]: what the paths without an MMA model multiply
    sc = D**-0.5 * LOG2E
    old = mma_matmul(qr.double(), kr.double().transpose(-1, -2), B200, fmt=("fp32", "fp32"))
    old = np.asarray(old[0, 0].double().numpy() * sc, np.float32)
    want = _oracle_scores(qq, kq, delta, sc)
    assert (old != want).mean() > 0.5


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_delta_s_is_the_exact_product_rounded_once_to_the_half_dtype(half):
    q, k = _qk(12, half)
    qr, kr, ops = _operands(q, k, half)
    ds = ops.qk_start
    assert isinstance(ds, DeltaS) and ds.values.dtype == torch.float32
    assert ds.values.shape == (1, 1, math.ceil(LQ / 128), LK)  # one row per 128-row query group
    vals = ds.values[0, 0].numpy()
    h = HALF[half]
    assert np.array_equal(vals.astype(h).astype(np.float32), vals)  # half values
    qm = qr[0, 0, ::128, D:].double().numpy()
    ks = kr[0, 0, :, D:].double().numpy()
    exact = np.array([[math.fsum(qm[g] * ks[j]) for j in range(LK)] for g in range(len(qm))])
    assert np.array_equal(vals, exact.astype(h).astype(np.float32))
    assert (vals != exact).mean() > 0.5  # the rounding to half is not a no-op on these data
    _, _, want = sage3_qk(q, k, half)  # the oracle's per-row delta_s, from its own smoothing
    assert np.array_equal(ds.block(0, LQ, 0, LK)[0, 0].numpy(), want.astype(np.float32))


def test_raising_the_input_stage_leaves_the_sage3_knob_inert():
    """With the input stage FP64 (explain's "input raised"), q and k are the plain inputs: the MMA takes them whole
    (no FP4 half, no delta_s), exactly as without the sage3 knob (a regression: it once halved them)."""
    from flashcheck.core.numerics import Format
    from flashcheck.kernels import flash_attention

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 160, 32, generator=g) for _ in range(3))
    kw = resolve("sage3-fp4", "bf16", 160, 160, 32, False)
    raised = kw["policy"].replace(input=Format.FP64)
    got = flash_attention(q, k, v, **{**kw, "policy": raised})
    plain = flash_attention(q, k, v, **{**kw, "policy": raised.replace(qk_scaling="")})
    assert torch.equal(got, plain)
