"""fp6 / fp4 / integer formats, E8M0 scales and the block quantisers (core.quant) against hand-made cases,
torch's own float8 dtypes and ml_dtypes (an independent implementation of the OCP formats)."""

import math

import numpy as np
import pytest
import torch

from flashcheck.core.numerics import Format, info, parse_policy, round_to
from flashcheck.core.quant import (
    MX_SCHEMES,
    group_ids,
    mx_scales,
    quantize_blocks,
    quantize_int,
    quantize_mx,
    quantize_nvfp4,
    round_e8m0,
)


def _probe_values() -> torch.Tensor:
    """Every e4m3 value, the midpoints between neighbours (ties), and random values over 2^-12 .. 2^7."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    grid = torch.unique(grid[torch.isfinite(grid)])
    mids = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(0)
    rand = torch.sign(torch.randn(4000, generator=g, dtype=torch.float64)) * 2 ** (
        torch.rand(4000, generator=g, dtype=torch.float64) * 19 - 12
    )
    return torch.cat([grid, mids, rand, torch.tensor([0.0, 1e9, -1e9, 6.25, 28.5, 7.6])])


@pytest.mark.parametrize(
    ("fmt", "mlname"),
    [("fp4-e2m1", "float4_e2m1fn"), ("fp6-e2m3", "float6_e2m3fn"), ("fp6-e3m2", "float6_e3m2fn")],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_small_float_formats_match_ml_dtypes(fmt, mlname, dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _probe_values().to(dtype)
    ours = round_to(x, fmt).to(torch.float64).numpy()
    theirs = x.numpy().astype(getattr(ml_dtypes, mlname)).astype(np.float64)  # saturating, ties to even
    assert np.array_equal(ours, theirs)


def test_small_formats_hand_made_and_saturate():
    x = torch.tensor([0.25, 0.75, 1.25, 2.5, 5.0, 100.0, -7.0, 0.0625, 0.1875], dtype=torch.float64)
    assert round_to(x, "fp4-e2m1").tolist() == [0.0, 1.0, 1.0, 2.0, 4.0, 6.0, -6.0, 0.0, 0.0]
    assert round_to(x, "fp6-e3m2").tolist() == [0.25, 0.75, 1.25, 2.5, 5.0, 28.0, -7.0, 0.0625, 0.1875]
    assert round_to(x, "int8").tolist() == [0.0, 1.0, 1.0, 2.0, 5.0, 100.0, -7.0, 0.0, 0.0]
    assert round_to(torch.tensor([300.0, -9.0]), "int8").tolist() == [127.0, -9.0]
    assert round_to(torch.tensor([300.0, -9.0, 2.5]), "int4").tolist() == [7.0, -7.0, 2.0]


def test_fp8_rounding_unchanged_by_the_new_formats():
    x = _probe_values()
    for fmt, dt in ((Format.FP8_E4M3, torch.float8_e4m3fn), (Format.FP8_E5M2, torch.float8_e5m2)):
        want = torch.clamp(x, -torch.finfo(dt).max, torch.finfo(dt).max).to(dt).to(torch.float64)
        got = round_to(x.float(), fmt).double()
        assert torch.equal(got, want)


def test_policies_take_the_new_format_names():
    pol = parse_policy("bf16-mixed,p=fp4-e2m1,input=fp6-e3m2")
    assert pol.p == Format.FP4_E2M1 and pol.input == Format.FP6_E3M2
    with pytest.raises(ValueError, match="fp4-e2m1"):
        parse_policy("p=fp5")


def test_e8m0_matches_torch_and_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = torch.cat([_probe_values().abs().float(), torch.tensor([2.0**-130, 2.0**-127, 1.5, 0.75, 3.0, 2.0**127])])
    x = x[x > 0]
    ours = round_e8m0(x)
    assert torch.equal(ours, x.to(torch.float8_e8m0fnu).float())
    assert np.array_equal(ours.numpy(), x.numpy().astype(ml_dtypes.float8_e8m0fnu).astype(np.float32))


def test_mx_hand_made_blocks():
    # mxfp4: amax 6 -> X = 2^(2 - 2) = 1; amax 100 -> X = 2^(6 - 2) = 16, 100 / 16 = 6.25 -> 6 (96), 20/16 -> 1.25 -> 1
    blk = torch.zeros(2, 32, dtype=torch.float64)
    blk[0, :4] = torch.tensor([6.0, 1.0, -0.5, 0.2])
    blk[1, :3] = torch.tensor([100.0, 20.0, -40.0])
    out = quantize_blocks(blk, "mxfp4")
    assert out[0, :4].tolist() == [6.0, 1.0, -0.5, 0.0]
    assert out[1, :3].tolist() == [96.0, 16.0, -32.0]
    # mxfp8 (e4m3, emax 8): amax 300 -> X = 2^(8 - 8) = 1, so 300 -> 288 (e4m3 spacing 32 at 256..448)
    e = torch.zeros(1, 32, dtype=torch.float64)
    e[0, :2] = torch.tensor([300.0, 1.0 / 3])
    assert quantize_blocks(e, "mxfp8")[0, :2].tolist() == [288.0, round_to(torch.tensor(1.0 / 3), "e4m3").item()]
    # the scale rule and its E8M0 clamps; all-zero block -> 2^-127, values 0
    scales = mx_scales(torch.tensor([6.0, 100.0, 0.0, 2.0**-140]), "fp4-e2m1")
    assert scales.tolist() == [1.0, 16.0, 2.0**-127, 2.0**-127]
    assert quantize_blocks(torch.zeros(1, 32), "mxfp6").abs().sum() == 0


@pytest.mark.parametrize(
    ("scheme", "mlname", "emax"),
    [
        ("mxfp8", "float8_e4m3fn", 8),
        ("mxfp6", "float6_e2m3fn", 2),
        ("mxfp6-e3m2", "float6_e3m2fn", 4),
        ("mxfp4", "float4_e2m1fn", 2),
    ],
)
def test_mx_against_ml_dtypes(scheme, mlname, emax):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 70, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 6, dtype=torch.float64)[:, None]
    ours = quantize_blocks(x, scheme).numpy()
    xs = np.pad(x.numpy(), ((0, 0), (0, 26))).reshape(6, 3, 32)
    amax = np.abs(xs).max(axis=-1, keepdims=True)
    scale = 2.0 ** (np.floor(np.log2(amax)) - emax)
    elems = np.clip(xs / scale, -1e30, 1e30).astype(getattr(ml_dtypes, mlname)).astype(np.float64)
    if mlname == "float8_e4m3fn":  # ml_dtypes' e4m3 overflows to NaN; MX conversions saturate
        elems = np.where(np.isnan(elems), np.sign(xs / scale) * 448.0, elems)
    want = (elems * scale).reshape(6, 96)[:, :70]
    assert np.array_equal(ours, want)


def test_mx_blocks_run_along_dim():
    x = torch.randn(3, 64, 5, dtype=torch.float64)
    assert torch.equal(quantize_mx(x, "fp4-e2m1", dim=1), quantize_mx(x.transpose(1, 2), "fp4-e2m1").transpose(1, 2))


def test_nvfp4_hand_made_and_against_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    # tensor amax 6: s = 448; a block of amax 6 gets scale e4m3(448) = 448, so its elements are plain e2m1
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([6.0, 2.6, -0.7, 0.2])
    x[0, 16:18] = torch.tensor([0.3, 0.1])  # block amax 0.3: scale e4m3(0.05 * 448 = 22.4) = 22
    out = quantize_nvfp4(x)
    assert out[0, :4].tolist() == [6.0, 3.0, -0.5, 0.0]
    dec = 22.0 / 448.0
    fp4 = ml_dtypes.float4_e2m1fn
    want = [float(np.float32(v / np.float32(dec)).astype(fp4).astype(np.float32) * np.float32(dec)) for v in (0.3, 0.1)]
    assert out[0, 16:18].tolist() == pytest.approx(want, rel=0, abs=0)
    g = torch.Generator().manual_seed(2)
    y = torch.randn(4, 48, generator=g) * 3
    s = np.float32(448.0 * 6.0) / np.float32(y.abs().max().item())
    yb = y.numpy().reshape(4, 3, 16)
    sb = (np.abs(yb).max(-1, keepdims=True) / np.float32(6.0) * s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    d = sb / s
    ref = ((yb / d).astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * d).reshape(4, 48)
    assert np.array_equal(quantize_nvfp4(y).numpy(), ref)


def test_sage_group_ids():
    # per-thread Q: within 32-token warps, tokens with equal index mod 8 share a scale
    q = group_ids(64, "thread", warp=32, threads=8)
    assert q[:10].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1] and q[32].item() == 8
    # per-thread K (4 threads): pairs {2t, 2t + 1} of index mod 8
    k = group_ids(64, "thread", warp=64, threads=4)
    assert k[:10].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    assert group_ids(300, "block", block=128)[[0, 127, 128, 299]].tolist() == [0, 0, 1, 2]


def test_quantize_int_hand_made():
    x = torch.zeros(1, 1, 4, 2)
    x[0, 0, :, 0] = torch.tensor([127.0, 63.5, -1.0, 0.49])
    x[0, 0, 1, 1] = 0.25
    out = quantize_int(x, "int8", "tensor", eps=0.0)
    assert out[0, 0, :, 0].tolist() == [127.0, 64.0, -1.0, 0.0]  # 63.5 rounds half away from zero
    tok = quantize_int(x, "int4", "token", eps=0.0)  # row 1: amax 63.5, scale 63.5 / 7
    s = np.float32(63.5) / np.float32(7.0)
    assert tok[0, 0, 1].tolist() == [float(np.float32(7) * s), 0.0]
    assert math.isclose(tok[0, 0, 0, 0].item(), 127.0, rel_tol=1e-6)
    ch = quantize_int(x, "int8", "channel", eps=0.0)
    assert ch[0, 0, 1, 1].item() == pytest.approx(0.25, rel=1e-6)


# ---- issue 30 item 3: the MX shared scale's rounding, NVFP4's block-scale floor, against torchao 0.18 ----------

TORCHAO_ELEMS = {
    "mxfp8": "float8_e4m3fn", "mxfp8-e5m2": "float8_e5m2", "mxfp6": "e2m3", "mxfp6-e3m2": "e3m2", "mxfp4": "e2m1",
}  # fmt: skip


def _torchao_mx(x32: torch.Tensor, scheme: str, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's (shared scale exponents, dequantised values) of x32 [rows, 32 * n] in its `mode`."""
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    kern = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    const = pytest.importorskip("torchao.prototype.mx_formats.constants")
    name = TORCHAO_ELEMS[scheme]
    elem = {"e2m3": const.DTYPE_FP6_E2M3, "e3m2": const.DTYPE_FP6_E3M2, "e2m1": torch.float4_e2m1fn_x2}.get(name)
    elem = elem if elem is not None else getattr(torch, name)
    scale, data = mx.to_mx(x32, elem, 32, getattr(cfg.ScaleCalculationMode, mode))
    if name == "e2m1":
        vals = kern.f4_unpacked_to_f32(kern.unpack_uint4(data))
    elif name == "e2m3":
        vals = kern.f6_e2m3_unpacked_to_f32(data)
    elif name == "e3m2":
        vals = kern.f6_e3m2_unpacked_to_f32(data)
    else:
        vals = data.to(torch.float32)
    exps = scale.view(torch.uint8).to(torch.int64) - 127
    deq = vals.reshape(*exps.shape, 32).double() * torch.exp2(exps.double()).unsqueeze(-1)
    return exps, deq.reshape(x32.shape)


def _mx_inputs() -> torch.Tensor:
    """Blocks over 80 binades, amaxes at and just beside powers of two (where FLOOR and RCEIL part), and zeros."""
    g = torch.Generator().manual_seed(30)
    x = torch.randn(64, 32 * 16, generator=g) * torch.exp2(torch.randint(-40, 40, (64, 1), generator=g).float())
    xb = x.view(64, 16, 32)
    xb[:, 0, 0] = torch.exp2(torch.randint(-30, 30, (64,), generator=g).float())  # exact powers of two
    xb[:, 1, :] = xb[:, 1, :].clamp(-1, 1)
    xb[:, 1, 0] = 448.0 * (1 + 2.0**-23)  # just above a power-of-two ratio for e4m3
    xb[:, 2, :] = 0.0
    return x


@pytest.mark.parametrize("scheme", sorted(TORCHAO_ELEMS))
@pytest.mark.parametrize("rounding,mode", [("floor", "FLOOR"), ("rceil", "RCEIL")])
def test_mx_scale_rounding_bit_equal_to_torchao(scheme, rounding, mode):
    x = _mx_inputs()
    want_exp, want = _torchao_mx(x, scheme, mode)
    fmt, _ = MX_SCHEMES[scheme]
    amax = x.view(64, 16, 32).abs().amax(-1)
    ours_exp = torch.frexp(mx_scales(amax, fmt, rounding).double())[1] - 1
    live = amax > 0  # an all-zero block: torchao's FLOOR writes 2^-127 but divides by its clamped 2^-126
    got = quantize_blocks(x.double(), scheme, rounding=rounding)
    odd = torch.zeros_like(live)
    if rounding == "rceil":
        # torchao's CPU path takes ceil(log2(amax / max)) with a float32 log2, which returns an integer for a
        # quotient just above a power of two; the hardware's cvt.rp (ours) rounds that quotient up
        d = amax / info(fmt).max
        odd = (torch.log2(d) == torch.log2(d).round()) & (torch.frexp(d)[0] != 0.5) & live
        assert torch.equal(ours_exp[odd], want_exp[odd] + 1)
    assert torch.equal(ours_exp[live & ~odd], want_exp[live & ~odd])
    same = ~odd.repeat_interleave(32, dim=-1)
    assert torch.equal(got[same], want[same]), int((got != want)[same].sum())


def test_rceil_rounds_the_scale_up_where_floor_does_not():
    # e4m3 (max 448, emax 8): 448 -> 1 both; 449 -> floor 1 (449 saturates to 448), rceil 2; 250 -> floor 2^-1,
    # rceil 1 (250 / 448 = 0.56 rounds up to 1)
    amax = torch.tensor([448.0, 449.0, 896.0, 250.0])
    assert mx_scales(amax, "fp8-e4m3", "floor").tolist() == [1.0, 1.0, 2.0, 0.5]
    assert mx_scales(amax, "fp8-e4m3", "rceil").tolist() == [1.0, 2.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="MX scale rounding 'up'"):
        mx_scales(amax, "fp8-e4m3", "up")


def test_nvfp4_scale_floor_bit_equal_to_torchao():
    """With scale_floor, a block scale below 2^-6 is raised to it before the e4m3 cast, as torchao's nvfp4_quantize
    does (single level: tensor scale 1); without it the small blocks keep subnormal or zero scales."""
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    kern = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    g = torch.Generator().manual_seed(31)
    x = torch.randn(32, 16 * 8, generator=g) * torch.exp2(torch.linspace(-16, 4, 32)).unsqueeze(-1)  # amax to 2^-14
    scales, packed = nv.nvfp4_quantize(x)
    want_s = scales.to(torch.float32).reshape(32, 8, 1)
    elems = kern.f4_unpacked_to_f32(kern.unpack_uint4(packed)).reshape(32, 8, 16)
    unit = torch.tensor(448.0 * 6.0)  # tensor_amax 448 * 6: the tensor scale is 1, a single level
    got = quantize_nvfp4(x, tensor_amax=unit, scale_floor=True).reshape(32, 8, 16)
    amax = x.reshape(32, 8, 16).abs().amax(-1, keepdim=True)
    ours_s = round_to((amax / 6.0).clamp_min(2.0**-6), Format.FP8_E4M3)
    assert torch.equal(ours_s, want_s) and bool((want_s == 2.0**-6).any())
    # torchao multiplies by 1 / scale, flashcheck divides: compare where the two float32 quotients agree
    xb = x.reshape(32, 8, 16)
    agree = xb * (1.0 / want_s) == xb / want_s
    assert float(agree.float().mean()) > 0.5
    assert torch.equal(got[agree], (elems * want_s)[agree])
    plain = quantize_nvfp4(x, tensor_amax=unit).reshape(32, 8, 16)
    small = (amax / 6.0 < 2.0**-6).expand_as(xb)
    assert not torch.equal(plain[small], got[small]) and torch.equal(plain[~small], got[~small])


def test_policy_knobs_choose_the_scale_rounding():
    from flashcheck.kernels.sim.quantized import quantize_inputs

    pol = parse_policy("fp4-e2m1-mixed,qk_scaling=mx,v_scaling=mx,mx_rounding=rceil,nvfp4_floor=1")
    assert (pol.mx_rounding, pol.nvfp4_floor) == ("rceil", True)
    with pytest.raises(ValueError, match="mx_rounding 'up'"):
        parse_policy("fp32,mx_rounding=up")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 64, 64, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    rceil = quantize_inputs(q, k, v, pol, block_q=64, block_k=64)
    floor = quantize_inputs(q, k, v, pol.replace(mx_rounding=""), block_q=64, block_k=64)
    assert torch.equal(rceil[0], quantize_mx(q, "fp4-e2m1", rounding="rceil"))
    assert torch.equal(floor[0], quantize_mx(q, "fp4-e2m1"))
    assert not torch.equal(rceil[0], floor[0])
