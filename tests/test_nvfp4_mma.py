"""fa4-fp4's block-scaled MMA: NVFP4's pieces (core.quant.nvfp4_parts) against the dequantised values and against
torchao's NVFP4Tensor, and the QK scores the flash forward takes from kernels.sim.mma_ops against
kernels.tensorcore.mma's float64
chain on the block-scaled values with the fp32 tensor descales after it (the old model, the dequantised values in
the chain, fails that on the same data)."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.quant import nvfp4_parts, quantize_nvfp4
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.mma_ops import MMAOperands, _values, qk_scores
from flashcheck.kernels.sim.presets import resolve
from flashcheck.kernels.tensorcore.mma import B200, _matmul

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _data(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Normal values with per-row magnitudes over many binades (so block scales spread through e4m3)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return x * torch.exp2(torch.randint(-12, 4, (*shape[:-1], 1), generator=g).double())


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of the last place of float32 values a, b of one sign (int64)."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@pytest.mark.parametrize("dim", [-1, -2])
@pytest.mark.parametrize("floor", [False, True])
def test_pieces_give_the_dequantised_values_within_two_roundings(dim, floor):
    """values = fl(e2m1 * fl(s_block / s_enc)) and fl(scaled * descale), descale = fl(1 / s_enc), are each within
    two float32 roundings of the exact e2m1 * s_block / s_enc: equal, or 1 or 2 ulps apart (measured: both)."""
    x = _data((3, 5, 40, 40), 1)
    x[0, 0, :, :16] = 0.0  # zero blocks
    x[1, 1] *= 2.0**-14  # block scales below e4m3's 2^-6 (subnormal, or floored)
    p = nvfp4_parts(x, dim=dim, scale_floor=floor)
    assert torch.equal(p.values, quantize_nvfp4(x, dim=dim, scale_floor=floor))
    assert p.scaled.dtype == torch.float32 and p.scaled.shape == x.shape and p.descale.numel() == 1
    amax = x.abs().max().float()
    assert p.descale.item() == (1.0 / ((448.0 * 6.0) / amax)).item()  # fl32(1 / fl32(2688 / amax))
    prod = (p.scaled * p.descale).float()
    held = p.values.float()
    assert torch.equal(prod == 0, held == 0)
    d = _ulps(prod, held)
    assert int(d.max()) <= 2 and bool((d > 0).any())
    s_enc = (448.0 * 6.0) / amax
    exact = p.scaled.double() / s_enc.double()  # e2m1 * s_block / s_enc
    for got in (prod, held):  # two roundings of 2^-24 each
        assert bool(((got.double() - exact).abs() <= 2.0**-23 * exact.abs()).all())


def test_pieces_match_torchao_where_the_recipes_agree():
    """With amax a power of two times 448 * 6, s_enc and torchao's per_tensor_scale amax / (448 * 6) are exact
    reciprocals and both recipes form the same e4m3 block scales (floored at 2^-6, as torchao clamps): the
    block-scaled values are torchao's e2m1 codes (qdata) times its e4m3 scales, the descale its per_tensor_scale
    and the values its dequantize(). (torchao multiplies by 1 / scale where this divides: an e2m1 rounding
    could differ at a tie within an ulp; none here.)"""
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    x = _data((64, 80), 2).float()
    x[3, 16:32] = 0.0
    x[5] *= 2.0**-12  # floored block scales
    x = x / x.abs().max() * (448.0 * 6.0 * 2.0**-5)
    p = nvfp4_parts(x, scale_floor=True)
    pts = nv.per_tensor_amax_to_scale(x.abs().max())
    t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
    codes = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(t.qdata.contiguous().view(torch.uint8)))
    scales = t.scale.view(torch.float8_e4m3fn).float()  # the e4m3 block scales (get_hp_scales: times pts)
    assert bool((scales == 2.0**-6).any())
    assert torch.equal(p.scaled, (codes.view(64, 5, 16) * scales.view(64, 5, 1)).view(64, 80))
    assert torch.equal(p.descale.reshape(()), pts.float().reshape(()))
    assert torch.equal(p.values.float(), t.dequantize(torch.float32))
    # any amax: fl32(1 / fl32(2688 / amax)) (two roundings) and fl32(amax / 2688) (one) differ by at most 2 ulps
    # (measured on 2e5 amaxes: 65% equal, 35% one ulp, 0.3% two)
    a = torch.rand(2000, generator=torch.Generator().manual_seed(3), dtype=torch.float64).float() * 1e3 + 1e-3
    ours = (1.0 / ((448.0 * 6.0) / a)).float()
    assert int(_ulps(ours, nv.per_tensor_amax_to_scale(a).float()).max()) <= 2


def _fa4_fp4(floor: bool):
    kw = resolve("fa4-fp4", "bf16", 64, 64, 40, False)
    return kw["policy"].replace(nvfp4_floor=floor), kw["block_q"], kw["block_k"]


def _qkv(lq: int, lk: int, d: int, seed: int):
    q, k, v = _data((1, 2, lq, d), seed), _data((1, 2, lk, d), seed + 1), _data((1, 2, lk, d), seed + 2)
    q[0, 0, 3, 16:32] = 0.0  # a zero block of Q's D
    k[0, 1, :, 0:16] *= 2.0**-16  # K's first blocks: scales below 2^-6 (subnormal e4m3 unless floored)
    return q, k, v


def _oracle(q_pieces, k_pieces, factor: float) -> torch.Tensor:
    """kernels.tensorcore.mma's float64 torch chain on the block-scaled values, then fl32(acc * factor * dq * dk)."""
    wq, wk = q_pieces.scaled.double(), k_pieces.scaled.double()
    acc = _matmul(wq, wk.transpose(-1, -2), B200, None, None, ("fp32", "fp32"), False, None)
    dq, dk = q_pieces.descale.double().item(), k_pieces.descale.double().item()
    return (acc.double() * ((dq * factor) * dk)).float()


@pytest.mark.parametrize("floor", [False, True])
@pytest.mark.parametrize("shape", [(24, 40, 40), (17, 70, 64), (5, 33, 16)])  # ragged last D block, ragged k
def test_fa4_fp4_qk_scores_are_the_block_scaled_mma(shape, floor):
    lq, lk, d = shape
    pol, bq, bk = _fa4_fp4(floor)
    q, k, v = _qkv(lq, lk, d, 4 + d)
    parts: dict = {}
    qr, kr, vr, _ = round_inputs(q, k, v, pol, block_q=bq, block_k=bk, parts=parts)
    assert set(parts) == {"q", "k", "v"}
    qp = nvfp4_parts(q, scale_floor=floor)  # the pieces of the inputs, as the kernel's quantiser forms them
    kp = nvfp4_parts(k, scale_floor=floor)
    assert torch.equal(parts["q"].scaled, qp.scaled) and torch.equal(parts["k"].scaled, kp.scaled)
    raw = k[..., :16].abs().amax(-1).float() / 6.0 * ((448.0 * 6.0) / k.abs().max().float())  # K's first blocks
    assert bool(((raw > 2.0**-9) & (raw < 2.0**-6)).any())  # e4m3 subnormal block scales (floored with floor)
    ops = MMAOperands.make(qr, kr, vr, pol, bq, bk, parts)
    assert (ops.q.fmt, ops.k.fmt, ops.v.fmt) == ("e2m1s",) * 3  # e2m1 x e4m3 (tensorcore.mma.EMIN)
    assert torch.equal(ops.v.codes, parts["v"].scaled.float())
    factor = d**-0.5
    got = qk_scores(ops.q, ops.k, ops.model_qk, factor)
    want = _oracle(qp, kp, factor)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    old = qk_scores(_values(qr), _values(kr), ops.model_qk, factor)  # the dequantised values in the chain
    assert not torch.equal(old, want)


def test_smoothing_and_exact_inputs_keep_the_dequantised_operands():
    """No pieces for a smoothed Q (its mean is added back) or an input kept exact: those operands stay values."""
    pol, bq, bk = _fa4_fp4(True)
    q, k, v = _qkv(16, 32, 32, 9)
    parts: dict = {}
    round_inputs(q, k, v, pol.replace(smooth_q=True), block_q=bq, block_k=bk, parts=parts)
    assert set(parts) == {"k", "v"}
    parts = {}
    round_inputs(q, k, v, pol.replace(exact_inputs="qk"), block_q=bq, block_k=bk, parts=parts)
    assert set(parts) == {"v"}
