"""kernels.tensorcore.mma against mmaemu 0.1.0 (its instruction model, validated bit for bit on an RTX 4060 and an
H100):
every accumulator of attention-shaped FP8 products bit-equal, one level and two, with and without c."""

from __future__ import annotations

import warnings

import pytest
import torch

from flashcheck.kernels.tensorcore.mma import (
    ADA,
    B200,
    HOPPER,
    MMA_MODELS,
    MMAModel,
    _matmul,
    mma_matmul,
    native_library,
)

mmaemu_chain = pytest.importorskip("mmaemu.model.chain")
mmaemu_plan = pytest.importorskip("mmaemu.model.plan")
mmaemu_presets = pytest.importorskip("mmaemu.model.presets")

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _oracle_preset(model: MMAModel, slow_chunk: int | None = None):
    """mmaemu's preset of the same name, or (two levels, or a chunk it has not measured) a custom one with the
    same block parameters and the chain restart every `slow_chunk` k."""
    name = {"ada": "ada", "hopper": "hopper", "b200": "b200_mma_sync"}[model.name]
    ref = mmaemu_presets.get_preset(name, warn=False)
    assert (ref.nfma, ref.frac, ref.frac_out, ref.min_exp, ref.late_c) == (
        model.nfma, model.frac, model.frac_out, model.min_exp, model.late_c,
    )  # fmt: skip
    if slow_chunk is None:
        return ref
    return mmaemu_presets.Preset(
        f"{name}-slow{slow_chunk}", nfma=ref.nfma, frac=ref.frac, frac_out=ref.frac_out, min_exp=ref.min_exp,
        late_c=ref.late_c, slow_chunk=slow_chunk,
    )  # fmt: skip


def _codes(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.to(DTYPES[fmt]).view(torch.uint8)


def oracle(a: torch.Tensor, b: torch.Tensor, model: MMAModel, fmts, promote: int | None = None) -> torch.Tensor:
    """mmaemu's fp32 accumulator of a [M, K] @ b [K, N] (FP8 values), a chain from +0 (promote None) or its
    slow-accumulation plan restarting every `promote` k (fp32 round-to-nearest sums of the chains)."""
    fa, fb = fmts
    au, bu = _codes(a, fa), _codes(b.T.contiguous(), fb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = _oracle_preset(model, promote)
        plan = mmaemu_plan.make_plan(a.shape[-1], fast=promote is None, preset=pre)

        def chain(x, y):
            return mmaemu_chain.chain_gemm(x, y, fmt_a=fa, fmt_b=fb, preset=pre)

        return mmaemu_plan.execute_plan(plan, au, bu, fmt_a=fa, fmt_b=fb, chain_fn=chain)


def _fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.clamp(-FMAX[fmt], FMAX[fmt]).to(DTYPES[fmt]).to(torch.float64)


def p_and_v(rows: int, keys: int, dv: int, fmts, seed: int, *, sigma: float = 3.0, zeros: float = 0.05):
    """Softmax numerators P [rows, keys] (x 2^8, FA3's scale: the largest 256, a long tail into e4m3's
    subnormals and zero) and V [keys, dv] (mixed signs, amax at the format's max, a share of exact zeros)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, keys, generator=g, dtype=torch.float64) * sigma
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 256.0
    v = torch.randn(keys, dv, generator=g, dtype=torch.float64)
    v = v * torch.where(torch.rand(keys, dv, generator=g) < zeros, 0.0, 1.0)
    v = v / v.abs().max() * FMAX[fmts[1]]
    return _fp8(p, fmts[0]), _fp8(v, fmts[1])


def q_and_kt(rows: int, keys: int, d: int, fmts, seed: int):
    """Q [rows, d] and K^T [d, keys] as FP8 with per-tensor amax scales, a channel offset on K (mixed signs,
    a spread of exponents) and a few tiny entries (subnormals)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d, generator=g, dtype=torch.float64)
    k = torch.randn(keys, d, generator=g, dtype=torch.float64) + 2 * torch.randn(1, d, generator=g, dtype=torch.float64)
    q, k = (t / t.abs().max() * FMAX[f] for t, f in zip((q, k), fmts, strict=True))
    k = torch.where(torch.rand(keys, d, generator=g) < 0.02, k * 2.0**-14, k)
    return _fp8(q, fmts[0]), _fp8(k, fmts[1]).T.contiguous()


def ties(rows: int, keys: int, dv: int, seed: int):
    """Operands from a handful of values (448, 1, 0.5, the smallest subnormal, 0; both signs): exact partial sums,
    fp32 additions that land halfway between neighbours, block sums that cancel to zero."""
    g = torch.Generator().manual_seed(seed)
    vals = torch.tensor([448.0, 1.0, 0.5, 2.0**-9, 0.0], dtype=torch.float64)
    a = vals[torch.randint(0, 5, (rows, keys), generator=g)]
    b = vals[torch.randint(0, 5, (keys, dv), generator=g)] * (torch.randint(0, 2, (keys, dv), generator=g) * 2 - 1)
    return a, b


def _bits_equal(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    same = got.contiguous().view(torch.int32) == want.contiguous().view(torch.int32)
    return int(same.sum()), same.numel()


# (rows, keys, dv): the longest products on one row and a few columns, as a decoding step sees them (mmaemu's
# GEMM-shaped chain is slow on long, wide products: its K chunks shrink with the width)
PV_SHAPES = [(48, 32, 64), (16, 1024, 32), (4, 8192, 16), (1, 131_072, 8)]
FMT_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e5m2")]


@pytest.mark.parametrize("model", [ADA, HOPPER, B200], ids=lambda m: m.name)
@pytest.mark.parametrize("rows,keys,dv", PV_SHAPES)
def test_pv_products_bit_equal_to_mmaemu(model, rows, keys, dv):
    """P·V over 32 to 131,072 keys: one level (the MMA accumulates every key), and up to 8,192 keys two levels
    (promoted every 64 keys, SageAttention2's block, and every 128, cuBLAS's slow accumulation); three format
    pairs up to 1,024 keys."""
    pairs = FMT_PAIRS if keys <= 1024 else FMT_PAIRS[:1]
    for i, fmts in enumerate(pairs):
        p, v = p_and_v(rows, keys, dv, fmts, seed=keys + i)
        promotes = (None, 64, 128) if keys <= 1024 else (None, 128) if keys <= 8192 else (None,)
        for promote in promotes:
            got = mma_matmul(p, v, model, promote_every=promote, fmt=fmts)
            same, n = _bits_equal(got, oracle(p, v, model, fmts, promote))
            assert same == n, f"{model.name} {fmts} keys {keys} promote {promote}: {same} of {n} bit-equal"


@pytest.mark.parametrize("model", [ADA, HOPPER, B200], ids=lambda m: m.name)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_qk_products_bit_equal_to_mmaemu(model, d):
    """Q·K^T over the head dim (64, 128, 256) for 32 to 32,768 keys (the longest at D 128 on Hopper), e4m3 and
    e5m2."""
    longest = (1, 32_768) if d == 128 and model is HOPPER else (2, 2048)  # K is D: keys only add outputs
    for rows, keys in ((16, 32), longest):
        for fmts in (("e4m3", "e4m3"), ("e5m2", "e5m2")):
            q, kt = q_and_kt(rows, keys, d, fmts, seed=d + keys)
            same, n = _bits_equal(mma_matmul(q, kt, model, fmt=fmts), oracle(q, kt, model, fmts))
            assert same == n, f"{model.name} {fmts} d {d} keys {keys}: {same} of {n} bit-equal"


@pytest.mark.parametrize("model", [ADA, HOPPER, B200], ids=lambda m: m.name)
def test_ties_zeros_and_subnormals_bit_equal(model):
    a, b = ties(32, 512, 32, seed=7)
    for promote in (None, 64):
        same, n = _bits_equal(
            mma_matmul(a, b, model, promote_every=promote), oracle(a, b, model, ("e4m3",) * 2, promote)
        )
        assert same == n
    zero = mma_matmul(a * 0, b, model)
    assert bool((zero.view(torch.int32) == 0).all())  # +0, never -0


@pytest.mark.parametrize("model", [ADA, HOPPER, B200], ids=lambda m: m.name)
def test_accumulating_into_c_bit_equal(model):
    """FA3 accumulates P·V into O inside the MMA: the chain starts from c (mmaemu's dot with c)."""
    fmts = ("e4m3", "e4m3")
    p, v = p_and_v(6, 256, 8, fmts, seed=3)
    g = torch.Generator().manual_seed(4)
    c = (torch.randn(6, 8, generator=g) * 1e4).to(torch.float32)
    c[0, 0], c[1, 1] = 0.0, 2.0**-130  # a zero and a subnormal accumulator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        name = {"ada": "ada", "hopper": "hopper", "b200": "b200_mma_sync"}[model.name]
        want = mmaemu_chain.dot(p[:, None, :].expand(6, 8, 256), v.T[None].expand(6, 8, 256), c, preset=name, fmt=fmts)
    same, n = _bits_equal(mma_matmul(p, v, model, c=c, fmt=fmts), want)
    assert same == n


@pytest.mark.parametrize("model", [ADA, HOPPER, B200], ids=lambda m: m.name)
def test_c_alone_in_a_block_of_zero_products_bit_equal(model):
    """A block whose products are all zero aligns c to its own exponent (at least min_exp): a small c stays, in
    the C chain and in both torch chains (the float32 one once floored E at 2^(-29 - frac) and gave 0)."""
    a, b = torch.zeros(1, model.nfma, dtype=torch.float64), torch.zeros(model.nfma, 4, dtype=torch.float64)
    c = torch.tensor([[1.5 * 2.0**-60, -(2.0**-120), 2.0**-30 * 1.25, 0.0]], dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        name = {"ada": "ada", "hopper": "hopper", "b200": "b200_mma_sync"}[model.name]
        fmts = ("e4m3", "e4m3")
        want = mmaemu_chain.dot(a[:, None, :].expand(1, 4, model.nfma), b.T[None], c, preset=name, fmt=fmts)
    for lib in (None, native_library()):
        same, n = _bits_equal(_matmul(a, b, model, c, None, fmts, False, lib), want)
        assert same == n


def test_batched_broadcast_matches_per_matrix():
    """Batch dims broadcast; each matrix's result is the one computed alone."""
    p, v = p_and_v(8, 96, 16, ("e4m3", "e4m3"), seed=5)
    pb = torch.stack([p, p.flip(0)]).unsqueeze(0)  # [1, 2, 8, 96]
    got = mma_matmul(pb, v, HOPPER)
    assert torch.equal(got[0, 1], mma_matmul(p.flip(0), v, HOPPER))
    assert got.shape == (1, 2, 8, 16) and got.dtype == torch.float32


def test_truncation_is_sign_symmetric_not_biased():
    """The hardware truncates each aligned term toward zero: -a·b gives exactly -(a·b), and over random
    signs the error against the exact product has a mean far below its spread (the old FP22 running-sum
    truncation shrank every |acc|)."""
    p, v = p_and_v(16, 4096, 64, ("e4m3", "e4m3"), seed=11)
    pos, neg = mma_matmul(p, v, HOPPER), mma_matmul(p, -v, HOPPER)
    assert torch.equal(neg, -pos)
    err = (pos.double() - p @ v) / (p.abs() @ v.abs())
    assert err.abs().max() < 2.0**-8
    assert abs(float(err.mean())) < 0.2 * float(err.std())


def test_models_and_bad_input():
    assert set(MMA_MODELS) == {"ada", "hopper", "b200"}
    assert (HOPPER.nfma, HOPPER.frac, HOPPER.frac_out, HOPPER.late_c) == (32, 13, 13, False)
    assert (B200.nfma, B200.frac, B200.frac_out, B200.late_c) == (32, 25, 23, True)
    with pytest.raises(ValueError, match="nfma"):
        MMAModel(name="x", nfma=0, frac=13, frac_out=13)
    with pytest.raises(ValueError, match="operand format 'e9m9'"):
        mma_matmul(torch.ones(2, 4), torch.ones(4, 2), ADA, fmt="e9m9")
    with pytest.raises(ValueError, match="promote_every"):
        mma_matmul(torch.ones(2, 4), torch.ones(4, 2), ADA, promote_every=0)
    with pytest.raises(ValueError, match="disagree on K"):
        mma_matmul(torch.ones(2, 4), torch.ones(3, 2), ADA)


@pytest.mark.parametrize("name", ["fa3-fp8-fp22", "fa4-fp8", "sage2", "sage2pp", "fa4-fp4"])
def test_flash_operands_split_into_codes_and_scales(name):
    """kernels.sim.mma_ops recovers the codes the tensor core multiplies from each preset's dequantised Q, K, V (FA3's
    per-block, FA4's per-tensor, Sage's per-channel scales); NVFP4 operands are round_inputs' pieces: the
    block-scaled values (e2m1 x e4m3, float32 "e2m1s" operands) times the fp32 tensor descale."""
    from flashcheck.kernels.sim.fp8 import round_inputs
    from flashcheck.kernels.sim.mma_ops import MMAOperands
    from flashcheck.kernels.sim.presets import default_format, resolve

    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g, dtype=torch.float64) for _ in range(3))
    kw = resolve(name, default_format(name), 256, 256, 64, False)
    pol = kw["policy"]
    parts: dict = {}
    qr, kr, vr, _ = round_inputs(q, k, v, pol, block_q=kw["block_q"], block_k=kw["block_k"], parts=parts)
    ops = MMAOperands.make(qr, kr, vr, pol, kw["block_q"], kw["block_k"], parts)
    assert set(parts) == ({"q", "k", "v"} if name == "fa4-fp4" else set())
    for op, held in ((ops.q, qr), (ops.k, kr), (ops.v, vr)):
        if op is None:
            continue
        assert op.fmt == ("e2m1s" if name == "fa4-fp4" else "e4m3")
        if op.fmt == "e4m3":
            assert torch.equal(op.codes.double(), op.codes.to(torch.float8_e4m3fn).double())  # exact e4m3 values
        else:  # e2m1 x e4m3: at most 6 significant bits, and a scalar descale
            assert op.codes.dtype == torch.float32 and op.scale.numel() == 1
            assert float((torch.frexp(op.codes)[0] * 64).frac().abs().max()) == 0.0
        assert torch.allclose(op.codes.double() * op.scale, held.double(), rtol=2.0**-20, atol=0)
    assert ops.v is not None and (ops.q is not None) == bool(pol.qk_mma)
