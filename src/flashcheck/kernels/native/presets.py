"""The quantised presets' per-step element-wise work in single C passes (built by kernels.native.cbuild), the same bits
as
the torch steps they replace: P's FP8 rounding (kernels.sim.quantized.quantize_p), SageAttention3's P quantisation
(kernels.formats.sage3.sage3_p) and the float64 descales around the tensor-core products (kernels.sim.mma_ops:
qk_scores'
descaled scores, pv_accumulate's O in MMA units and back), and once per forward the FP4 inputs' quantisers
(SageAttention3's 1x16 FP4, core.quant.nvfp4_parts' pieces) and kernels.sim.mma_ops' "e2m1s" operand check. Each
torch step reads and writes a whole score block [B, H, rows, Bc] (sage3_p alone is about twenty passes; each
descale three, with a float64 copy).

Every step is one IEEE operation the torch path also does (float32 products and quotients, float64 products and
quotients of float32 values, float64 -> float32 conversions, all correctly rounded; no FMA contraction, see
kernels.native.cbuild) or exact (the clamp, rint at a format's spacing, scalings by powers of two, maxima). NaN: the
P passes report it and the caller runs its torch steps (NaN bits as torch makes them). The library self-tests at
load against the torch steps (ties, subnormal codes, zeros, ragged blocks, strided views); any difference,
FLASHCHECK_NATIVE=0 or a missing compiler keeps the torch path."""

from __future__ import annotations

import ctypes
import functools
import math

import torch

import flashcheck.kernels.native.cbuild as cbuild
from flashcheck.core.numerics import Format, info
from flashcheck.kernels.formats.fastmath import POLY_EX2_3, ex2_emulation

_DIMS = 4
UNIT_DIV, UNIT_MUL, UNIT_ADD = 0, 1, 2


def _plain(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    return (
        t.dtype == dtype
        and t.device.type == "cpu"
        and t.dim() <= _DIMS
        and not (torch.is_grad_enabled() and t.requires_grad)
    )


_DIMS4 = ctypes.c_int64 * _DIMS  # strides and shapes go to C as ctypes arrays (a tensor each cost more than the pass)


def _strides(t: torch.Tensor, shape: torch.Size):
    """t's strides broadcast to `shape` (<= 4 dims, t broadcasting to it), int64 [4] with leading zeros: 0 along
    a dim of size 1 (expand's strides there, without its view)."""
    st = tuple(0 if n == 1 else d for n, d in zip(t.shape, t.stride(), strict=True))
    return _DIMS4(*((0,) * (_DIMS - len(st)) + st))


def _shape(shape: torch.Size):
    return _DIMS4(*((1,) * (_DIMS - len(shape)) + tuple(shape)))


def _broadcasts(small: torch.Tensor, shape: torch.Size) -> bool:
    return small.dim() <= len(shape) and all(
        d in (1, n) for d, n in zip(reversed(small.shape), reversed(shape), strict=False)
    )


def p_fp8(p: torch.Tensor, p_scale: float, fmt: Format, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """round_to(p * p_scale if p_scale != 1 else p, fmt) for float32 P (contiguous, CPU) and an FP8 fmt, a new
    float32 tensor (or `out`, float32 contiguous of p's shape, not p); None where the pass does not apply or meets
    a NaN (the caller's torch steps then run)."""
    lib = library()
    if lib is None or fmt not in _FP8 or not _plain(p) or not p.is_contiguous():
        return None
    if out is not None and not (_plain(out) and out.is_contiguous() and out.shape == p.shape):
        out = None
    return _p_fp8(lib, p, p_scale, fmt, out)


_FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)


def _p_fp8(lib, p: torch.Tensor, p_scale: float, fmt: Format, out: torch.Tensor | None = None) -> torch.Tensor | None:
    fi = info(fmt)
    out = torch.empty_like(p, memory_format=torch.contiguous_format) if out is None else out
    ok = lib.fc_p_fp8(p.data_ptr(), out.data_ptr(), p.numel(), p_scale, int(p_scale != 1.0), fi.precision - 1,
                      fi.min_exp - 1, float(fi.max))  # fmt: skip
    return out if ok else None


def sage3_p(p: torch.Tensor, p_scale: float, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """kernels.formats.sage3.sage3_p(p, p_scale) for float32 P [..., Bc] (contiguous, CPU), a new float32 tensor (or
    `out`,
    float32 contiguous of p's shape, not p: a reused buffer, no fresh pages per step); None where the pass does not
    apply or meets a NaN."""
    lib = library()
    if lib is None or not _plain(p) or not p.is_contiguous() or p.dim() < 1:
        return None
    if out is not None and not (_plain(out) and out.is_contiguous() and out.shape == p.shape):
        out = None
    return _sage3_p(lib, p, p_scale, out)


def _sage3_p(lib, p: torch.Tensor, p_scale: float, out: torch.Tensor | None = None) -> torch.Tensor | None:
    out = torch.empty_like(p, memory_format=torch.contiguous_format) if out is None else out
    w = p.shape[-1]
    rows = p.numel() // w if w else 0
    ok = lib.fc_sage3_p(p.data_ptr(), out.data_ptr(), rows, w, p_scale)
    return out if ok else None


def fp4x16(x: torch.Tensor, dim: int, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    """kernels.formats.sage3.quantize_fp4x16(x, dim=dim) for a float32 x (contiguous, CPU), [x's shape, contiguous] in
    dtype (float64, or float32: the same values, each exact in float32); None where the pass does not apply or
    meets a NaN."""
    lib = library()
    if lib is None or not _plain(x) or not x.is_contiguous() or x.dim() < 1 or x.numel() == 0:
        return None
    return _fp4x16(lib, x, dim, dtype) if dtype in (torch.float64, torch.float32) else None


def _fp4x16(lib, x: torch.Tensor, dim: int, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    dim = dim % x.dim()
    n = x.shape[dim]
    na, nc = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1 :])
    out = torch.empty(x.shape, dtype=dtype)
    return out if lib.fc_fp4x16(x.data_ptr(), out.data_ptr(), na, n, nc, int(dtype == torch.float32)) else None


def nvfp4(x: torch.Tensor, dim: int, s_enc: float, floor: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """core.quant.nvfp4_parts' values and scaled pieces (float32, x's shape, contiguous) of a float32 x
    (contiguous, CPU) in blocks of 16 along `dim`, s_enc its float32 tensor encode scale (tensor_amax None),
    `floor` its scale_floor; None where the pass does not apply or meets a NaN or a non-finite block scale."""
    lib = library()
    if lib is None or not _plain(x) or not x.is_contiguous() or x.dim() < 1 or x.numel() == 0:
        return None
    return _nvfp4(lib, x, dim, s_enc, floor)


def _nvfp4(lib, x: torch.Tensor, dim: int, s_enc: float, floor: bool):
    dim = dim % x.dim()
    n = x.shape[dim]
    na, nc = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1 :])
    values, scaled = torch.empty(x.shape), torch.empty(x.shape)
    ok = lib.fc_nvfp4(x.data_ptr(), values.data_ptr(), scaled.data_ptr(), na, n, nc, s_enc, int(floor))
    return (values, scaled) if ok else None


def e2m1s(x: torch.Tensor) -> tuple[bool, torch.Tensor] | None:
    """(whether x holds only kernels.tensorcore.mma's "e2m1s" values (formats.e2m1s), x as float32) in one C pass for
    a float32 x (x itself) or a float64 x (a float32 copy, contiguous, complete where it fits) whose rows [..., D]
    are evenly strided; None where the pass does not apply."""
    lib = library()
    if lib is None or not _plain(x, x.dtype) or x.dim() < 1 or x.numel() == 0 or x.stride(-1) != 1:
        return None
    return _e2m1s(lib, x)


def _e2m1s(lib, x: torch.Tensor) -> tuple[bool, torch.Tensor] | None:
    rs = _row_stride(x)
    if rs is None:
        return None
    cols = x.shape[-1]
    if x.dtype == torch.float32:
        return bool(lib.fc_e2m1s_f32(x.data_ptr(), x.numel() // cols, cols, rs)), x
    if x.dtype != torch.float64:
        return None
    out = torch.empty(x.shape)
    return bool(lib.fc_e2m1s_f64(x.data_ptr(), x.numel() // cols, cols, rs, out.data_ptr())), out


def _row_stride(x: torch.Tensor) -> int | None:
    """The stride between x's consecutive rows [..., D] where every row lies one stride after the last, else None."""
    if x.dim() == 1:
        return x.shape[0]
    rs = x.stride(-2)
    for i in range(x.dim() - 2):
        if x.shape[i] > 1 and x.stride(i) != rs * math.prod(x.shape[i + 1 : -1]):
            return None
    return rs


def ex2_columns(x: torch.Tensor, idx: torch.Tensor, poly: tuple[float, ...], out: torch.Tensor) -> bool:
    """out[..., idx] = kernels.formats.fastmath.ex2_emulation(x[..., idx], poly) in one C pass (x, out float32 [..., W],
    contiguous, CPU; idx int64 [n] column indices): True when done, False where it does not apply or meets a NaN
    or an x above 127 (the caller's torch steps then write every column of idx)."""
    lib = library()
    ok = lib is not None and _plain(x) and _plain(out) and x.is_contiguous() and out.is_contiguous()
    if not (ok and out.shape == x.shape and x.dim() >= 1 and idx.dtype == torch.int64 and idx.is_contiguous()):
        return False
    return _ex2_columns(lib, x, idx, poly, out)


def _ex2_columns(lib, x, idx, poly, out) -> bool:
    w = x.shape[-1]
    rows = x.numel() // w if w else 0
    coef = (ctypes.c_double * len(poly))(*poly)
    return bool(lib.fc_ex2_cols(x.data_ptr(), out.data_ptr(), rows, w, idx.data_ptr(), idx.numel(), coef, len(poly)))


def descale(acc: torch.Tensor, q_scale: torch.Tensor, k_scale_t: torch.Tensor, factor: float, out: torch.Tensor):
    """out[...] = (acc in float64 * ((q_scale * factor) * k_scale_t)) rounded to float32 (acc float32
    [..., M, N]; q_scale float64 [..., M or 1, 1], k_scale_t float64 [..., 1, N or 1], broadcasting; out float32
    of acc's shape, any strides); returns out, or None (nothing written) where the pass does not apply."""
    lib = library()
    shape = acc.shape
    ok = lib is not None and _plain(acc) and _plain(out) and out.shape == shape
    ok = ok and all(_plain(s, torch.float64) and _broadcasts(s, shape) for s in (q_scale, k_scale_t))
    if not (ok and (q_scale.dim() == 0 or q_scale.shape[-1] == 1)):  # the C pass reads q_scale once per row
        return None
    _descale(lib, acc, q_scale, k_scale_t, factor, out)
    return out


def _descale(lib, acc, q_scale, k_scale_t, factor: float, out) -> None:
    shape = acc.shape
    st = [_strides(t, shape) for t in (acc, q_scale, k_scale_t, out)]
    n = _shape(shape)
    lib.fc_descale(acc.data_ptr(), st[0], q_scale.data_ptr(), st[1], k_scale_t.data_ptr(), st[2], factor,
                   out.data_ptr(), st[3], n)  # fmt: skip


def units(x: torch.Tensor, unit: torch.Tensor, out: torch.Tensor, mode: int) -> torch.Tensor | None:
    """In float64, rounded to float32 into out (float32, x's shape, any strides; returned): x / unit (UNIT_DIV),
    x * unit (UNIT_MUL), or out + that product in float32 (UNIT_ADD). x float32, unit float64 broadcasting to x.
    None (nothing written) where the pass does not apply."""
    lib = library()
    ok = lib is not None and _plain(x) and _plain(out) and out.shape == x.shape
    if not (ok and _plain(unit, torch.float64) and _broadcasts(unit, x.shape)):
        return None
    _units(lib, x, unit, out, mode)
    return out


def _units(lib, x, unit, out, mode: int) -> None:
    shape = x.shape
    st = [_strides(t, shape) for t in (x, unit, out)]
    lib.fc_units(x.data_ptr(), st[0], unit.data_ptr(), st[1], out.data_ptr(), st[2], _shape(shape), mode)


def rescale(
    o: torch.Tensor, alpha: torch.Tensor | None, x: torch.Tensor | None = None, unit: torch.Tensor | None = None
) -> torch.Tensor | None:
    """O's rescale folded into one pass, in place (o float32 [..., M, Dv], any strides; alpha float32 [..., M, 1]
    or None): o = o * alpha + 0 (x None: the held accumulator's MMA start), or o = o * alpha + x * unit (x float32
    of o's shape, unit float64 broadcasting to it: the product in float64 rounded to float32, UNIT_ADD's).
    Returns o, or None (nothing written) where the pass does not apply."""
    lib = library()
    shape = o.shape
    ok = lib is not None and _plain(o) and o.dim() >= 1
    ok = ok and (alpha is None or (_plain(alpha) and _broadcasts(alpha, shape) and alpha.shape[-1:] == (1,)))
    if ok and x is not None:
        ok = _plain(x) and x.shape == shape and unit is not None and _plain(unit, torch.float64)
        ok = ok and _broadcasts(unit, shape)
    if not ok:
        return None
    _rescale(lib, o, alpha, x, unit)
    return o


def _rescale(lib, o, alpha, x, unit) -> None:
    shape = o.shape
    st = _strides(o, shape)
    ast = _strides(alpha, shape) if alpha is not None else st
    xst, ust = (_strides(x, shape), _strides(unit, shape)) if x is not None else (st, st)
    lib.fc_rescale(o.data_ptr(), st, None if alpha is None else alpha.data_ptr(), ast,
                   None if x is None else x.data_ptr(), xst, None if unit is None else unit.data_ptr(), ust,
                   _shape(shape), int(x is not None))  # fmt: skip


def pv_start(o: torch.Tensor, alpha: torch.Tensor, unit: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
    """The P·V MMA's first accumulator in one pass: (o * alpha in float32, divided by unit in float64) rounded to
    float32, + 0 (kernels.tensorcore.mma's start: a zero is +0), written into out (float32, o's shape; returned). o
    float32
    [..., M, Dv] (unchanged), alpha float32 [..., M, 1], unit float64 broadcasting to o. None (nothing written)
    where the pass does not apply."""
    lib = library()
    shape = o.shape
    ok = lib is not None and _plain(o) and _plain(out) and out.shape == shape and _plain(alpha)
    ok = ok and _broadcasts(alpha, shape) and alpha.dim() >= 1 and alpha.shape[-1] == 1
    if not (ok and _plain(unit, torch.float64) and _broadcasts(unit, shape)):
        return None
    _pv_start(lib, o, alpha, unit, out)
    return out


def _pv_start(lib, o, alpha, unit, out) -> None:
    shape = o.shape
    st = [_strides(t, shape) for t in (o, alpha, unit, out)]
    lib.fc_pv_start(o.data_ptr(), st[0], alpha.data_ptr(), st[1], unit.data_ptr(), st[2], out.data_ptr(), st[3],
                    _shape(shape))  # fmt: skip


def _selftest(lib) -> str:
    """The first pass that differs from its torch steps (words), or "" when every one matches bit for bit."""
    from flashcheck.core.numerics import round_to
    from flashcheck.kernels.formats.sage3 import sage3_p as torch_sage3_p

    g = torch.Generator().manual_seed(0)
    # P-like values over many binades, with exact zeros of both signs, ones, fp8 / e2m1 ties after the scale,
    # subnormals, +inf and values beyond fp8's largest
    p = torch.rand(6, 7, 40, generator=g) * torch.exp2(torch.randint(-40, 1, (6, 7, 40), generator=g).float())
    p[0, 0, :4] = torch.tensor([0.0, 1.0, 2.0**-149, 0.5])
    p[1, :, :16] = 0.0  # an all-zero block
    ties = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ties = ((ties[1:127] + ties[2:128]) / 2)[:40] / 256.0  # midpoints of e4m3 codes, after the x256
    p[2, 0] = ties[:40]
    p[3, 0, :6] = torch.tensor([float("inf"), -0.0, 2.0**-130, -(2.0**-149), 448.0 * 1.5, 2.0**-126])
    p[3, 1, :] = -0.0  # a block of negative zeros
    nan = p.clone()
    nan[4, 2, 9] = float("nan")  # a NaN is declined (None): the caller's torch steps run
    if _p_fp8(lib, nan, 1.0, _FP8[0]) is not None or _sage3_p(lib, nan, 448.0 * 6.0) is not None:
        return "a NaN in P taken by the C pass"
    for scale in (1.0, 256.0, 2.0**8.807):
        for fmt in _FP8:
            want = round_to(p * scale if scale != 1.0 else p, fmt)
            got = _p_fp8(lib, p, scale, fmt)
            if got is None or not torch.equal(want.view(torch.int32), got.view(torch.int32)):
                return f"P's FP8 rounding ({fmt.value}, x{scale:g})"
    for w in (40, 32, 7):  # ragged and whole blocks
        pw = p[..., :w].contiguous()
        want, got = torch_sage3_p(pw, 448.0 * 6.0), _sage3_p(lib, pw, 448.0 * 6.0)
        if got is None or not torch.equal(want.view(torch.int32), got.view(torch.int32)):
            return f"SageAttention3's P quantisation (width {w})"
    from flashcheck.kernels.formats.sage3 import quantize_fp4x16

    x = torch.randn(2, 3, 37, 40, generator=g) * torch.exp2(torch.randint(-14, 8, (2, 3, 37, 40), generator=g))
    x[0, 0, :, :16] = 0.0
    x[0, 1, :16, :] = 2.0**-13  # a block whose scale rounds to an e4m3 subnormal or 0
    x = x.to(torch.bfloat16).float()  # the half-precision values SageAttention3 quantises
    for dim in (-1, -2):
        got = _fp4x16(lib, x, dim)
        want, got32 = quantize_fp4x16(x, dim=dim), _fp4x16(lib, x, dim, torch.float32)
        if got is None or got32 is None or not torch.equal(want.view(torch.int64), got.view(torch.int64)):
            return f"SageAttention3's FP4 input quantisation (dim {dim})"
        if not torch.equal(want.float().view(torch.int32), got32.view(torch.int32)):
            return f"SageAttention3's FP4 input quantisation in float32 (dim {dim})"
    return _selftest_nvfp4(lib, g) or _selftest_steps(lib, g)


def _selftest_nvfp4(lib, g: torch.Generator) -> str:
    """_selftest's NVFP4 part: the input quantiser's pieces, and the "e2m1s" check of kernels.sim.mma_ops."""
    from flashcheck.core.quant import nvfp4_parts
    from flashcheck.kernels.formats.e2m1s import fits_e2m1s

    x = torch.randn(2, 3, 37, 40, generator=g) * torch.exp2(torch.randint(-30, 8, (2, 3, 37, 40), generator=g))
    x[0, 0, :, :16] = 0.0
    x[0, 1, :16, :] = 2.0**-13  # blocks whose scale is an e4m3 subnormal or 0, or floored
    x[1, 2, 3, :3] = torch.tensor([-0.0, 2.0**-140, -(2.0**-149)])
    for floor in (False, True):
        for dim in (-1, -2):
            want = nvfp4_parts(x, dim=dim, scale_floor=floor)
            amax = x.abs().amax()
            s_enc = float((448.0 * 6.0) / amax)
            got = _nvfp4(lib, x, dim, s_enc, floor)
            same = got is not None and all(
                torch.equal(w.view(torch.int32), h.view(torch.int32)) for w, h in zip(want[:2], got, strict=True)
            )
            if not same:
                return f"NVFP4's input quantisation (dim {dim}, floor {floor})"
    scaled = nvfp4_parts(x, dim=-1).scaled.contiguous()
    bad = scaled.clone()
    bad[1, 1, 1, 1] = 0.8125  # 6 significant bits: no e2m1 x e4m3 value
    for t in (
        scaled,
        bad,
        scaled * 2.0**-20,
        scaled.double(),
        torch.cat([scaled.double(), bad.double()], -1)[..., :40],
        torch.cat([bad, scaled], -1)[..., 40:],
        torch.cat([bad, scaled], -1)[..., :40],
    ):
        got = _e2m1s(lib, t)
        if got is None or got[0] != fits_e2m1s(t, t.to(torch.float32)):
            return "the e2m1s operand check"
        if got[0] and not torch.equal(got[1], t.to(torch.float32)):
            return "the e2m1s operand's float32 copy"
    return ""


def _selftest_steps(lib, g: torch.Generator) -> str:
    """_selftest's second half: FA4's emulated exp2 columns, the Q K^T descale, the P·V unit conversions."""
    s = torch.randn(3, 5, 70, generator=g) * 20
    s[0, 0, :8] = torch.tensor([-200.0, -127.0, -126.5, -0.0, 0.0, 126.0, -float("inf"), 127.0])
    idx = torch.tensor([0, 1, 2, 5, 6, 7, 8, 40, 69], dtype=torch.int64)
    out = torch.exp2(s)
    want = out.clone()
    want[..., idx] = ex2_emulation(s[..., idx])
    if not (_ex2_columns(lib, s, idx, POLY_EX2_3, out) and torch.equal(want.view(torch.int32), out.view(torch.int32))):
        return "FA4's emulated exp2"
    acc = torch.randn(2, 3, 5, 9, generator=g) * 1e3
    qs = torch.rand(2, 3, 5, 1, generator=g, dtype=torch.float64) / 3
    ks = torch.rand(2, 3, 9, 1, generator=g, dtype=torch.float64) / 7
    one = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    for a, b in ((qs, ks), (one, ks), (qs, one), (one * 0.1, one * 0.3)):
        want = acc.to(torch.float64).mul_((a * 0.125) * b.transpose(-1, -2)).to(torch.float32)
        out = torch.empty_like(acc)
        _descale(lib, acc, a, b.transpose(-1, -2), 0.125, out)
        if not torch.equal(want.view(torch.int32), out.view(torch.int32)):
            return "the Q K^T descale"
        inplace = acc.clone()  # acc in out (the MMA's accumulator descaled where it lies)
        _descale(lib, inplace, a, b.transpose(-1, -2), 0.125, inplace)
        if not torch.equal(want.view(torch.int32), inplace.view(torch.int32)):
            return "the Q K^T descale in place"
    o = torch.randn(2, 3, 8, 9, generator=g)[:, :, 3:]  # strided rows
    for u in (torch.rand(2, 3, 1, 9, generator=g, dtype=torch.float64) / 3, one / 3):
        want_div = o.to(torch.float64, copy=True).div_(u).to(torch.float32)
        want_mul = acc.to(torch.float64).mul_(u)
        want_add = o.clone().add_(acc.to(torch.float64).mul_(u).to(torch.float32))
        got_div = torch.empty_like(o, memory_format=torch.contiguous_format)
        _units(lib, o, u, got_div, UNIT_DIV)
        got_mul = torch.empty(2, 3, 8, 9)[:, :, 3:]
        _units(lib, acc, u, got_mul, UNIT_MUL)
        got_add = o.clone()
        _units(lib, acc, u, got_add, UNIT_ADD)
        for w_, g_ in ((want_div, got_div), (want_mul.to(torch.float32), got_mul), (want_add, got_add)):
            if not torch.equal(w_.view(torch.int32), g_.contiguous().view(torch.int32)):
                return "the P·V unit conversions"
        alpha = torch.rand(2, 3, 5, 1, generator=g)
        alpha[0, 0] = 0.0
        oz = o.clone()
        oz[0, 1, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])  # zeros and an underflow: +0 as the start makes
        want = oz.mul(alpha).to(torch.float64).div_(u).to(torch.float32) + 0.0
        got = torch.empty(2, 3, 8, 9)[:, :, 3:]
        _pv_start(lib, oz, alpha, u, got)
        if not torch.equal(want.view(torch.int32), got.contiguous().view(torch.int32)):
            return "the P·V MMA's start"
        return _selftest_rescale(lib, o, alpha, u, acc)
    return ""


def _selftest_rescale(lib, o, alpha, u, acc) -> str:
    """_selftest_steps' O rescales (fc_rescale) against torch's mul_ and add_ (strided o, zeros and an underflow)."""
    for al in (alpha, None):
        oz = o.clone()
        oz[0, 1, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])
        want, got = oz.clone(), oz.clone()
        (want.mul_(al) if al is not None else want).add_(0.0)
        _rescale(lib, got, al, None, None)
        want2, got2 = oz.clone(), oz.clone()
        (want2.mul_(al) if al is not None else want2).add_(acc.to(torch.float64).mul_(u).to(torch.float32))
        _rescale(lib, got2, al, acc, u)
        for w_, g_ in ((want, got), (want2, got2)):
            if not torch.equal(w_.contiguous().view(torch.int32), g_.contiguous().view(torch.int32)):
                return "the O rescales"
    return ""


@functools.cache
def _native() -> tuple[object | None, str]:
    """(the library, "") once it built and every entry point matched its torch steps (_selftest), else (None,
    why not)."""
    what = "the quantised presets' step passes run in torch"
    lib, why = cbuild.load("presets", what)
    if lib is None:
        return None, why
    why = cbuild.proven("presets", lib, _checked, what)
    return (None, why) if why else (lib, "")


def _checked(lib) -> str:
    failed = _selftest(lib)
    return f"the C pass differs from the torch steps ({failed})" if failed else ""


def library():
    """The self-tested library, or None (callers keep their torch steps)."""
    return _native()[0]


def native_status() -> dict:
    """{"available": bool, "reason": str} for `flashcheck doctor`."""
    lib, why = _native()
    return {"available": lib is not None, "reason": why}
