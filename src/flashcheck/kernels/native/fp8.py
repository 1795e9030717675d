"""Input quantisation in single C passes (built by kernels.native.cbuild), the same bits as the torch steps they
replace:
FP8 x / scale clamped, rounded to nearest even and times scale (core.numerics.quantize_scaled), split's FP8 codes
with its tolerance check (kernels.sim.mma_ops), core.quant.quantize_int's per-element steps, and max |x| over rows or
columns. The torch steps each read and write the whole tensor (the FP8 rounding alone is eight passes of
round-to-odd and table look-ups): a decoding step's 128k-key cache went through about twenty of them.

Every step is an IEEE operation the torch path also does once (divisions, multiplications, float64 -> float32
conversions, correctly rounded), or exact (scalings by powers of two, rint's round-to-nearest-even at the
format's spacing, maxima). The library self-tests at load against the torch steps (random bit patterns, ties,
subnormals, limits, zeros of both signs, NaN); any difference, FLASHCHECK_NATIVE=0 or a missing compiler keeps
the torch path."""

from __future__ import annotations

import functools
import math

import torch

import flashcheck.kernels.native.cbuild as cbuild
from flashcheck.core.numerics import Format, info, quantize_scaled, round_to

_DIMS = 5
_FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)


def _params(fmt: Format) -> tuple[int, int, float]:
    """(mantissa bits, smallest normal exponent floor(log2), largest finite value) of an FP8 format (info's min_exp
    is frexp's: the smallest normal is 2^(min_exp - 1))."""
    fi = info(fmt)
    return fi.precision - 1, fi.min_exp - 1, float(fi.max)


def _layout(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x's strides, scale's strides broadcast to x's shape, x's shape), each int64 [5] (leading dims of 1)."""
    pad = _DIMS - x.dim()
    xs = torch.tensor((0,) * pad + x.stride(), dtype=torch.int64)
    ss = torch.tensor((0,) * pad + scale.expand(x.shape).stride(), dtype=torch.int64)
    return xs, ss, torch.tensor((1,) * pad + tuple(x.shape), dtype=torch.int64)


def _run(lib, x: torch.Tensor, fmt: Format, scale: torch.Tensor, mul: bool, dtype=torch.float64) -> torch.Tensor:
    """The C pass over x (float64, or float32 with a float32 dtype; at most 5 dims) and scale broadcast to x's
    shape; a new contiguous tensor of `dtype` (float32: the float64 result rounded, as .to rounds it)."""
    xs, ss, n = _layout(x, scale)
    out = torch.empty(x.shape, dtype=dtype)
    ptrs = (x.data_ptr(), xs.data_ptr(), scale.data_ptr(), ss.data_ptr(), out.data_ptr(), n.data_ptr())
    fn = lib.fc_fp8_scaled if dtype == torch.float64 else _SCALED_F32[x.dtype](lib)
    fn(*ptrs, *_params(fmt), int(mul))
    return out


_SCALED_F32 = {torch.float64: lambda lib: lib.fc_fp8_scaled_df, torch.float32: lambda lib: lib.fc_fp8_scaled_ff}


def split_codes(x: torch.Tensor, fmt: Format, scale: torch.Tensor, tol: float) -> tuple[bool, torch.Tensor | None]:
    """kernels.sim.mma_ops.split's exact case for an FP8 format in one C pass (x float64 or float32, taken as its
    float64 values): (True, codes float32 [x's shape]) when every |codes * scale - x| <= tol |x| (codes = x / scale
    rounded to fmt, clamped), (False, None) when not; (True, None) where the C pass does not apply (see scaled):
    the caller's torch steps then decide."""
    lib = library()
    if lib is None or not _usable(x, fmt, scale, (torch.float64, torch.float32)):
        return True, None
    return _split(lib, x, fmt, scale, tol)


def _split(lib, x: torch.Tensor, fmt: Format, scale: torch.Tensor, tol: float) -> tuple[bool, torch.Tensor | None]:
    xs, ss, n = _layout(x, scale)
    codes = torch.empty(x.shape, dtype=torch.float32)
    ptrs = (x.data_ptr(), xs.data_ptr(), scale.data_ptr(), ss.data_ptr(), codes.data_ptr(), n.data_ptr())
    fn = lib.fc_fp8_split if x.dtype == torch.float64 else lib.fc_fp8_split_f32
    ok = fn(*ptrs, *_params(fmt), tol)
    return (True, codes) if ok else (False, None)


def _usable(x: torch.Tensor, fmt: Format, scale: torch.Tensor, dtypes=(torch.float64,)) -> bool:
    return (
        fmt in _FP8
        and x.dtype in dtypes
        and scale.dtype == torch.float64
        and x.device.type == "cpu"
        and x.is_contiguous()  # torch's result keeps a permuted input's layout; this one is contiguous
        and scale.device.type == "cpu"
        and x.dim() <= _DIMS
        and scale.dim() <= x.dim()
        and not (torch.is_grad_enabled() and (x.requires_grad or scale.requires_grad))
        and all(d in (1, n) for d, n in zip(reversed(scale.shape), reversed(x.shape), strict=False))
    )  # (torch.broadcast_shapes materialises the shape: 60 ms for a 128 MiB tensor)


def scaled(x: torch.Tensor, fmt: Format, scale: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """core.numerics.quantize_scaled(x, fmt, scale) (x / scale rounded to fmt, times scale), in one C pass
    where it applies (float64 CPU tensors, an FP8 format, scale broadcasting to x; x [any shape, <= 5 dims]).
    dtype float32: that result .to(float32), for a float64 or float32 x (taken as its float64 values), in the
    same pass where it applies."""
    lib = library()
    if dtype == torch.float32:
        if lib is None or not _usable(x, fmt, scale, (torch.float64, torch.float32)):
            return quantize_scaled(x.to(torch.float64), fmt, scale).to(torch.float32)
        return _run(lib, x, fmt, scale, True, torch.float32)
    if lib is None or not _usable(x, fmt, scale):
        return quantize_scaled(x, fmt, scale)
    return _run(lib, x, fmt, scale, True)


def codes(x: torch.Tensor, fmt: Format, scale: torch.Tensor) -> torch.Tensor:
    """round_to(x / scale, fmt) clamped to fmt's range (FP8: float64 [x's shape]), in one C pass where it applies
    (see scaled); None where it does not."""
    lib = library()
    if lib is None or not _usable(x, fmt, scale):
        return None
    return _run(lib, x, fmt, scale, False)


def _selftest_values() -> torch.Tensor:
    """float64 values [n] for the self-test: random bit patterns over FP8's range and beyond, every FP8 value, the
    midpoints between neighbours (ties) and just off them, zeros of both signs, double subnormals, values beyond
    each format's largest, +-inf and NaN."""
    g = torch.Generator().manual_seed(0)
    exps = torch.randint(-30, 20, (20000,), generator=g).double()
    rand = (torch.rand(20000, generator=g, dtype=torch.float64) + 1) * torch.exp2(exps)
    grid = []
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        v = torch.arange(256, dtype=torch.uint8).view(dt).to(torch.float64)
        v = v[torch.isfinite(v)].unique()
        mid = (v[1:] + v[:-1]) / 2
        grid += [v, mid, torch.nextafter(mid, torch.full_like(mid, 1e300)), torch.nextafter(mid, -v[1:])]
    special = [0.0, -0.0, 5e-324, -5e-324, 2.0**-1022, 1e300, -1e300, 448.0, 464.0, 480.0, 57344.0, 61440.0]
    special = torch.tensor([*special, float("inf"), -float("inf"), float("nan")], dtype=torch.float64)
    base = torch.cat([rand, *grid, special])
    return torch.cat([base, -base])


@functools.cache
def _native() -> tuple[object | None, str]:
    """(the library, "") once it built and every entry point matched the torch steps (_self_test), else (None,
    why not)."""
    what = "FP8 quantisation runs in torch"
    lib, why = cbuild.load("fp8", what)
    if lib is None:
        return None, why
    why = cbuild.proven("fp8", lib, _self_test, what)
    return (None, why) if why else (lib, "")


def _self_test(lib) -> str:
    """ "" when every entry point gives the torch steps' bits on _selftest_values (ties, subnormals, overflow,
    +-0, +-inf, NaN, both signs), else which differs."""
    x = _selftest_values()
    scales = (torch.ones(1, dtype=torch.float64), torch.tensor([3.0, 0.1], dtype=torch.float64).repeat_interleave(
        x.numel() // 2).view(2, -1))  # fmt: skip
    for fmt in _FP8:
        for s in scales:
            xv = x.view(s.shape[0], -1) if s.dim() == 2 else x
            sv = s[:, :1] if s.dim() == 2 else s
            bad = _selftest_scaled(lib, xv, fmt, sv) or _selftest_split(lib, xv, fmt, sv)
            if bad:
                return bad
    return _selftest_int(lib, x) or _selftest_absmax(lib, x) or _selftest_hadamard(lib)


def _selftest_scaled(lib, xv: torch.Tensor, fmt: Format, sv: torch.Tensor) -> str:
    """fc_fp8_scaled (values and codes), fc_fp8_scaled_df and fc_fp8_scaled_ff against quantize_scaled."""
    want = quantize_scaled(xv, fmt, sv)
    got = _run(lib, xv, fmt, sv, True)
    want_codes = round_to(xv / sv, fmt)
    got_codes = _run(lib, xv, fmt, sv, False)
    for w, g_ in ((want, got), (want_codes, got_codes)):
        if not torch.equal(w.view(torch.int64), g_.view(torch.int64)):
            return f"fc_fp8_scaled differs from torch's FP8 rounding here ({fmt.value})"
    x32 = xv.float()  # float32 in (and float64 in), float32 out: the float64 result's .to(float32)
    for xin, w in ((xv, want), (x32, quantize_scaled(x32.double(), fmt, sv))):
        got32 = _run(lib, xin, fmt, sv, True, torch.float32)
        if not torch.equal(w.float().view(torch.int32), got32.view(torch.int32)):
            return f"fc_fp8_scaled_{'df' if xin.dtype == torch.float64 else 'ff'} differs from torch's ({fmt.value})"
    return ""


def _selftest_split(lib, xv: torch.Tensor, fmt: Format, sv: torch.Tensor) -> str:
    """fc_fp8_split / fc_fp8_split_f32 against kernels.sim.mma_ops.split's torch steps: codes round_to(x / s) and
    whether every |codes s - x| <= |x| tol, on x itself (mostly not codes) and on codes times s (all exact)."""
    tol = 2.0**-20
    exact = round_to(xv / sv, fmt).nan_to_num(0.0, 0.0, 0.0) * sv
    for x in (xv, exact, exact.float()):
        codes = round_to(x.double() / sv, fmt)
        ok = bool(((codes * sv - x.double()).abs() <= x.double().abs() * tol).all())
        got_ok, got = _split(lib, x, fmt, sv, tol)
        if got_ok != ok or (ok and not torch.equal(got.view(torch.int32), codes.float().view(torch.int32))):
            return f"fc_fp8_split{'_f32' if x.dtype == torch.float32 else ''} differs from torch's ({fmt.value})"
    return ""


def _selftest_int(lib, x: torch.Tensor) -> str:
    """fc_int_scaled against core.quant.quantize_int (INT8 / INT4, each granularity)."""
    from flashcheck.core.quant import quantize_int

    x = x[x.isfinite()]
    xi = torch.cat([x[x.abs() < 1e6], torch.tensor([-0.0, 0.0, 0.5, -0.5, 1.5, -2.5])])
    xi = xi[: xi.numel() // 64 * 64].view(1, 2, -1, 32)
    for fmt in (Format.INT8, Format.INT4):
        for gran in ("thread", "channel", "block"):
            want = quantize_int(xi, fmt, gran, block=16, warp=32, threads=4)
            got = _int_quantized(lib, xi, fmt, gran, block=16, warp=32, threads=4)
            if not torch.equal(want.view(torch.int64), got.view(torch.int64)):
                return f"fc_int_scaled differs from torch's integer quantisation ({fmt.value}, {gran})"
    return ""


def _selftest_absmax(lib, x: torch.Tensor) -> str:
    """fc_absmax_* / fc_absmaxc_* against x.abs().amax over rows and columns: strided rows, NaN, +-0, +-inf."""
    xa = torch.cat([torch.tensor([float("nan"), -0.0, 0.0, -0.0]), x])[: 2 * 3 * 7 * 40].view(40, 3, 14)[..., :7]
    for t in (xa, xa.float(), xa.nan_to_num(0.0), xa.nan_to_num(0.0).float()):
        for dim, fn in ((-1, _absmax_rows), (-2, _absmax_cols)):
            want, got = t.abs().amax(dim, keepdim=True), fn(lib, t)
            if not (torch.equal(want.isnan(), got.isnan()) and torch.equal(want.nan_to_num(), got.nan_to_num())):
                return f"fc_absmax{'c' if dim == -2 else ''}_{str(t.dtype)[-2:]} differs from torch's max of |x|"
    return ""


def _selftest_hadamard(lib) -> str:
    """Empty when the butterflies give x @ M's bits (torch's float64 product) on rows within their exact range, and
    refuse a row beyond it, a row of zeros and an Inf; else what differs."""
    from flashcheck.kernels.formats.hadamard import incoherence_matrix

    g = torch.Generator().manual_seed(1)
    for d in (4, 16, 64):
        sign = torch.where(torch.rand(3, 40, d, generator=g) < 0.5, -1.0, 1.0)
        x = sign * (1 + torch.rand(3, 40, d, generator=g)) * torch.exp2(torch.randint(-6, 4, (3, 40, d), generator=g))
        x[0, 0, : d // 2] = 0.0
        x[0, 1, 1] = -0.0
        x[1, :, : d // 4] *= 2.0**-12  # a range of 2^22 and 24-bit significands: the widest that stays exact
        rot = incoherence_matrix(d, 7)
        got = _hadamard(lib, x, rot)
        if got is None or not torch.equal((x.double() @ rot).view(torch.int64), got.view(torch.int64)):
            return f"fc_hadamard_rows differs from x @ M (d={d})"
        for spoil in (2.0**-40, 0.0, float("inf")):
            y = x.clone()
            y[2, 3] = y[2, 3] * spoil if spoil != float("inf") else spoil
            if spoil == 2.0**-40:
                y[2, 3, 1:] = x[2, 3, 1:]
            if _hadamard(lib, y, rot) is not None:
                return "fc_hadamard_rows takes a row it cannot sum exactly"
    return ""


def hadamard(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor | None:
    """x.to(float64) @ rot, the same bits, for a float32 x [..., d] (CPU, contiguous) and rot kernels.sim.fp8's
    incoherence matrix (signs times H times a power of two): float64 [x's shape], by butterflies in C where every
    row's sum is exact in float64 (then any summation order gives the same bits); None where that does not hold or
    the pass does not apply (the caller multiplies)."""
    lib = library()
    ok = lib is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
    if not (ok and x.dim() >= 1 and x.numel() and not (torch.is_grad_enabled() and x.requires_grad)):
        return None
    return _hadamard(lib, x, rot)


def _hadamard(lib, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor | None:
    d = x.shape[-1]
    if rot.dtype != torch.float64 or rot.shape != (d, d) or d & (d - 1):
        return None
    post = abs(float(rot[0, 0]))
    signs = torch.sign(rot[:, 0]).contiguous()
    if post == 0.0 or math.frexp(post)[0] != 0.5:  # the scale 1 / sqrt(d) is a power of two for d = 4^n only
        return None
    from flashcheck.kernels.formats.hadamard import hadamard_matrix

    if not torch.equal(signs.unsqueeze(-1) * hadamard_matrix(d) * post, rot):
        return None
    out = torch.empty(x.shape, dtype=torch.float64)
    ok = lib.fc_hadamard_rows(x.data_ptr(), x.numel() // d, d, d.bit_length() - 1, signs.data_ptr(), post,
                              out.data_ptr())  # fmt: skip
    return out if ok else None


def library():
    """The self-tested library, or None (callers keep their torch code)."""
    return _native()[0]


def native_status() -> dict:
    """{"available": bool, "reason": str} for `flashcheck doctor`."""
    lib, why = _native()
    return {"available": lib is not None, "reason": why}


def abs_max(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """x.abs().amax() (dim None: a 0-dim tensor) or x.abs().amax(dim, keepdim=True), the same values (a maximum is
    exact; NaN propagates; an all-zero group may give -0, which every caller treats as 0), without a |x| copy: over
    the last or the second last dim in one C pass (aminmax is slow over short rows and over columns), else by one
    aminmax pass."""
    lib = library() if dim in (-1, x.dim() - 1, -2, x.dim() - 2) else None
    ok = x.dtype in (torch.float32, torch.float64) and x.device.type == "cpu" and x.stride(-1) == 1
    ok = ok and 2 <= x.dim() <= _DIMS and x.numel() > 0 and not (torch.is_grad_enabled() and x.requires_grad)
    if lib is not None and ok:
        return _absmax_rows(lib, x) if dim in (-1, x.dim() - 1) else _absmax_cols(lib, x)
    mn, mx = torch.aminmax(x) if dim is None else torch.aminmax(x, dim=dim, keepdim=True)
    return torch.maximum(mx, mn.neg_())


def _absmax_rows(lib, x: torch.Tensor) -> torch.Tensor:
    """x.abs().amax(-1, keepdim=True) by the C pass (x float32 / float64 [<= 5 dims], its last dim contiguous)."""
    pad = _DIMS - x.dim()
    xs = torch.tensor((0,) * pad + x.stride(), dtype=torch.int64)
    n = torch.tensor((1,) * pad + tuple(x.shape), dtype=torch.int64)
    out = torch.empty(*x.shape[:-1], 1, dtype=x.dtype)
    fn = lib.fc_absmax_f64 if x.dtype == torch.float64 else lib.fc_absmax_f32
    fn(x.data_ptr(), xs.data_ptr(), n.data_ptr(), out.data_ptr())
    return out


def _absmax_cols(lib, x: torch.Tensor) -> torch.Tensor:
    """x.abs().amax(-2, keepdim=True) by the C pass (x float32 / float64 [2 to 5 dims], its last dim contiguous)."""
    pad = _DIMS - x.dim()
    xs = torch.tensor((0,) * pad + x.stride(), dtype=torch.int64)
    n = torch.tensor((1,) * pad + tuple(x.shape), dtype=torch.int64)
    out = torch.empty(*x.shape[:-2], 1, x.shape[-1], dtype=x.dtype)
    fn = lib.fc_absmaxc_f64 if x.dtype == torch.float64 else lib.fc_absmaxc_f32
    fn(x.data_ptr(), xs.data_ptr(), n.data_ptr(), out.data_ptr())
    return out


def amax_scale(x: torch.Tensor, fmt: Format, dim: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """core.numerics.amax_scale(x, fmt, dims=None or (dim,)): the same values, by abs_max. dtype float64: the
    scale of x's float64 values (a maximum of float32 values is exact in float64), without a float64 copy."""
    a = abs_max(x.detach(), dim)
    a = a if dtype is None else a.to(dtype)
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    return torch.where(a > 0, a / info(fmt).max, torch.ones_like(a))


def block_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    """max |x| over each block of `block` rows x D of x [B, H, L, D] (a ragged last block over its rows), as
    [B, H, ceil(L / block), 1, 1] (the values of padding L with zero rows and taking amax(dims=(-2, -1))), by views
    (x's rows contiguous: [B, H, L, D] with D contiguous)."""
    b, h, n, d = x.shape
    full = n - n % block
    parts = []
    if full:
        parts.append(abs_max(x[:, :, :full].reshape(b, h, full // block, block * d), -1))
    if full < n:
        parts.append(abs_max(x[:, :, full:].reshape(b, h, 1, (n - full) * d), -1))
    amax = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    return amax.unsqueeze(-1)


def _int_quantized(lib, x: torch.Tensor, fmt: Format, granularity: str, *, block: int, warp: int, threads: int):
    """core.quant.quantize_int's steps with max |x| by abs_max and the per-element ones in C (x float64)."""
    from flashcheck.core.quant import group_ids

    qmax = info(fmt).max
    if granularity == "channel":
        amax = _absmax_cols(lib, x).to(torch.float32)  # the float32 maximum of the float32 values: monotone rounding
    else:
        ids = group_ids(x.shape[-2], granularity, block=block, warp=warp, threads=threads)
        amax_g = torch.zeros(*x.shape[:-2], int(ids.max()) + 1, dtype=torch.float32)
        rows = _absmax_rows(lib, x).squeeze(-1).to(torch.float32)  # x's float64 maximum, rounded: the same value
        amax_g.scatter_reduce_(-1, ids.expand(*x.shape[:-2], -1), rows, "amax")
        amax = amax_g.index_select(-1, ids).unsqueeze(-1)
    scale = amax / qmax + 1e-7  # quantize_int's eps
    xs, ss, n = _layout(x, scale)
    out = torch.empty(x.shape, dtype=torch.float64)
    lib.fc_int_scaled(x.data_ptr(), xs.data_ptr(), scale.data_ptr(), ss.data_ptr(), out.data_ptr(), n.data_ptr(), qmax)
    return out


def int_quantized(
    x: torch.Tensor, fmt: Format, granularity: str, *, block: int, warp: int, threads: int
) -> torch.Tensor | None:
    """core.quant.quantize_int(x, fmt, granularity, block=, warp=, threads=) (its default eps) for a float64 CPU x
    [..., L, D] (contiguous, <= 5 dims, not empty), with its per-element steps in one C pass; None where that does
    not apply (the caller runs quantize_int)."""
    lib = library()
    usable = x.dtype == torch.float64 and x.device.type == "cpu" and x.is_contiguous() and 2 <= x.dim() <= _DIMS
    usable = usable and x.numel() > 0 and not (torch.is_grad_enabled() and x.requires_grad)
    if lib is None or not usable or granularity not in ("thread", "channel", "block", "token", "tensor"):
        return None
    return _int_quantized(lib, x, fmt, granularity, block=block, warp=warp, threads=threads)
