"""Number formats, rounding, and numerics policies (which format each attention stage computes in)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch


class Format(StrEnum):
    """A floating-point number format a stage can store its values in."""

    FP64 = "fp64"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_E4M3 = "fp8-e4m3"
    FP8_E5M2 = "fp8-e5m2"
    FP6_E2M3 = "fp6-e2m3"
    FP6_E3M2 = "fp6-e3m2"
    FP4_E2M1 = "fp4-e2m1"
    INT8 = "int8"
    INT4 = "int4"


@dataclass(frozen=True, slots=True)
class FormatInfo:
    """Properties of a format. `precision` counts the implicit bit; `min_exp` is frexp's exponent of
    the smallest normal number (so it equals 2**(min_exp - 1)). `dtype` is the torch dtype that holds
    every value exactly: the format's own, or for the EMULATED formats (no torch dtype: fp6, fp4, the
    integers) a wider carrier they are never cast through."""

    dtype: torch.dtype
    precision: int
    min_exp: int
    max: float
    bits: int


_INFO: dict[Format, FormatInfo] = {
    Format.FP64: FormatInfo(torch.float64, 53, -1021, torch.finfo(torch.float64).max, 64),
    Format.FP32: FormatInfo(torch.float32, 24, -125, torch.finfo(torch.float32).max, 32),
    Format.BF16: FormatInfo(torch.bfloat16, 8, -125, torch.finfo(torch.bfloat16).max, 16),
    Format.FP16: FormatInfo(torch.float16, 11, -13, 65504.0, 16),
    Format.FP8_E4M3: FormatInfo(torch.float8_e4m3fn, 4, -5, 448.0, 8),
    Format.FP8_E5M2: FormatInfo(torch.float8_e5m2, 3, -13, 57344.0, 8),
    # OCP MX v1.0 section 5.3: FP6 E2M3 (bias 1, max 7.5), FP6 E3M2 (bias 3, max 28), FP4 E2M1 (bias 1,
    # max 6); no inf or NaN, so conversions saturate. Every value is exact in e4m3, their carrier.
    Format.FP6_E2M3: FormatInfo(torch.float8_e4m3fn, 4, 1, 7.5, 6),
    Format.FP6_E3M2: FormatInfo(torch.float8_e4m3fn, 3, -1, 28.0, 6),
    Format.FP4_E2M1: FormatInfo(torch.float8_e4m3fn, 2, 1, 6.0, 4),
    # symmetric integers (SageAttention's INT8 / INT4: +-127, +-7), spacing 1; exact in fp16
    Format.INT8: FormatInfo(torch.float16, 7, 1, 127.0, 8),
    Format.INT4: FormatInfo(torch.float16, 3, 1, 7.0, 4),
}

FP8_FORMATS = frozenset({Format.FP8_E4M3, Format.FP8_E5M2})
MX_ELEMENT_FORMATS = frozenset({Format.FP6_E2M3, Format.FP6_E3M2, Format.FP4_E2M1})
INT_FORMATS = frozenset({Format.INT8, Format.INT4})
EMULATED = MX_ELEMENT_FORMATS | INT_FORMATS  # no torch dtype: rounded by scaling to integers
SATURATING = FP8_FORMATS | EMULATED  # conversions clamp at +-max instead of overflowing to inf
NARROW_FORMATS = FP8_FORMATS | EMULATED  # formats a tensor is scaled into before rounding (fp8 and below)


def parse_format(name: str | Format) -> Format:
    """Return the Format called `name` (e.g. "bf16", "fp8-e4m3"); ValueError names the allowed ones."""
    if isinstance(name, Format):
        return name
    aliases = {
        "float64": "fp64",
        "double": "fp64",
        "float32": "fp32",
        "float": "fp32",
        "bfloat16": "bf16",
        "float16": "fp16",
        "half": "fp16",
        "e4m3": "fp8-e4m3",
        "e5m2": "fp8-e5m2",
        "e2m1": "fp4-e2m1",
        "e2m3": "fp6-e2m3",
        "e3m2": "fp6-e3m2",
    }
    key = aliases.get(str(name).lower(), str(name).lower())
    try:
        return Format(key)
    except ValueError:
        valid = ", ".join(f.value for f in Format)
        raise ValueError(f"unknown number format {name!r}; expected one of {valid}") from None


def info(fmt: Format | str) -> FormatInfo:
    return _INFO[parse_format(fmt)]


def format_of_dtype(dtype: torch.dtype) -> Format:
    for fmt, fi in _INFO.items():
        if fi.dtype == dtype and fmt not in EMULATED:
            return fmt
    raise ValueError(f"dtype {dtype} has no flashcheck format; expected one of {[f.value for f in Format]}")


def is_wider_or_equal(a: Format, b: Format) -> bool:
    """True when every value of format `b` is exactly representable in format `a`."""
    fa, fb = _INFO[a], _INFO[b]
    return fa.precision >= fb.precision and fa.min_exp <= fb.min_exp and fa.max >= fb.max


def spacing(x: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """The gap between adjacent values of `fmt` at the magnitude of each element of x (its ULP).

    Subnormal range included; returned in float64, same shape as x."""
    fmt = parse_format(fmt)
    fi = _INFO[fmt]
    x64 = x.detach().to(torch.float64)
    if fmt in INT_FORMATS:
        return torch.ones_like(x64)
    _, exp = torch.frexp(x64)
    exp = torch.clamp(exp, min=fi.min_exp)
    return torch.ldexp(torch.ones_like(x64), (exp - fi.precision).to(torch.float64))


def round_to(
    x: torch.Tensor,
    fmt: Format | str,
    *,
    stochastic: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Round x to the nearest value of `fmt` (ties to even), returned in x's dtype.

    fp8, fp6, fp4 and the integers saturate at +-max (as FA3's conversions and OCP MX's do); other
    formats overflow to inf. With
    `stochastic`, round up with probability equal to the distance from the value below (unbiased).
    Under autograd the gradient is rounded to the same format (as a cast's backward does), except
    for the SATURATING formats, whose gradient passes straight through."""
    fmt = parse_format(fmt)
    if stochastic:
        return _round_stochastic(x, fmt, generator)
    if _INFO[fmt].dtype == x.dtype and fmt not in EMULATED:
        return x
    if fmt == Format.FP64 or (fmt == Format.FP32 and x.dtype in (torch.float16, torch.bfloat16)):
        raise ValueError(f"cannot round a {x.dtype} tensor to the wider format {fmt.value}")
    if x.requires_grad and torch.is_grad_enabled():
        return _Round.apply(x, fmt)
    return _round_value(x, fmt)


def _round_value(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    fi = _INFO[fmt]
    if fmt in SATURATING:
        x = torch.clamp(x, -fi.max, fi.max)
    if fmt in EMULATED:
        return _round_exact(x, fmt)
    if x.dtype == torch.float64 and fmt in FP8_FORMATS and x.device.type == "cpu":
        return _fp8_from_float64(x, fmt)
    if x.dtype == torch.float64 and fi.precision < 24:
        # torch casts float64 to 16- and 8-bit formats through float32, rounding twice
        # (e.g. 830.2500067 -> 830.25 -> 830.0 in fp16, not 830.5); round once, exactly.
        return _round_exact(x, fmt)
    narrow = x.to(fi.dtype)
    return widen_fp8(narrow, x.dtype) if fmt in FP8_FORMATS else narrow.to(x.dtype)


FP8_WIDEN_MIN = 4096  # elements from which the table beats the cast (and its two small allocations pay)


@functools.cache
def _fp8_table(src: torch.dtype, dst: torch.dtype) -> torch.Tensor:
    """The 256 values of 8-bit float dtype `src`, cast to `dst` (indexed by code)."""
    return torch.arange(256, dtype=torch.uint8).view(src).to(dst)


def widen_fp8(narrow: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """narrow.to(dtype) for an 8-bit float tensor, bit for bit (NaN codes included): on the CPU by a 256-entry
    table of the cast's own results, indexed by code. torch 2.13 converts float8 to float32 one element at a
    time (measured here: 22 ms for 512k elements, 9x a copy; the table: 7.7 ms), the largest cost of the FP8
    presets' P rounding."""
    if narrow.device.type != "cpu" or narrow.numel() < FP8_WIDEN_MIN or dtype not in (torch.float32, torch.float64):
        return narrow.to(dtype)
    codes = narrow.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    out = torch.empty(narrow.shape, dtype=dtype)
    torch.index_select(_fp8_table(narrow.dtype, dtype), 0, codes, out=out.view(-1))
    return out


# (integer view, exponent shift, exponent mask, frexp's exponent minus the biased one, bias) of the float dtypes
_FLOAT_BITS = {torch.float32: (torch.int32, 23, 0xFF, -126, 127), torch.float64: (torch.int64, 52, 0x7FF, -1022, 1023)}


def _ulp_bits(x: torch.Tensor, fmt: Format) -> torch.Tensor | None:
    """spacing(x, fmt).to(x.dtype) for a float32 / float64 x by integer ops on its bits (no float64 frexp and
    ldexp): the biased exponent E gives frexp's exponent E - 126 (float32; E - 1022 for float64) for every normal
    x; zeros, subnormals (E = 0) and non-finite x get other ulps than spacing's, and _round_exact's result for
    them is the same (+-0 rounds to itself at any ulp; subnormals of x's dtype lie far below every narrow format's
    min_exp, so both clamp to it; non-finite x is returned as it is). None for other dtypes."""
    bits = _FLOAT_BITS.get(x.dtype)
    if bits is None:
        return None
    itype, shift, mask, offset, bias = bits
    fi = _INFO[fmt]
    e = torch.bitwise_right_shift(x.view(itype), shift).bitwise_and_(mask).add_(offset - fi.precision + bias)
    e.clamp_(min=fi.min_exp - fi.precision + bias, max=2 * bias)  # the clamp at min_exp; max: inf/NaN stay finite
    return e.bitwise_left_shift_(shift).view(x.dtype)


_STICKY = (1 << 29) - 1  # the float64 significand bits below float32's


def _fp8_from_float64(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """_round_exact(x, fmt) for float64 x already clamped to fp8's range, by torch's cast: x first rounded to
    24 significant bits by round-to-odd (the bits below cut, their OR kept in the last bit: exact in float32, so
    the cast's pass through float32 rounds nothing), then rounded once to the fp8 format (round-to-odd at p + 2
    or more bits, then to nearest at p bits, is a single rounding to nearest). Below 2^-126 the 24 bits are
    not exact in float32, but every such value rounds to +-0 in fp8 either way. NaN stays x's own NaN."""
    bits = x.contiguous().view(torch.int64)
    low = torch.bitwise_and(bits, _STICKY).ne_(0).to(torch.int64).bitwise_left_shift_(29)
    odd = torch.bitwise_and(bits, ~_STICKY).bitwise_or_(low).view(torch.float64)
    out = widen_fp8(odd.to(_INFO[fmt].dtype), torch.float64)
    nan = torch.isnan(x)
    return torch.where(nan, x, out) if bool(nan.any()) else out


def _round_exact(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Round-to-nearest-even of x to fmt by scaling to integers: exact for precision <= x's precision."""
    fi = _INFO[fmt]
    if fmt in INT_FORMATS:
        out = torch.round(x)  # spacing 1: x / 1 and round(.) * 1 are x and round(x), bit for bit
    else:
        ulp = _ulp_bits(x, fmt)  # elementwise on x's bits: any strides (a view of the same-size integer dtype)
        ulp = spacing(x, fmt).to(x.dtype) if ulp is None else ulp
        out = torch.div(x, ulp).round_().mul_(ulp)  # round rounds half to even
    big = out.abs() > fi.max
    if bool(big.any()):
        out = torch.where(big, torch.sign(out) * math.inf, out)
    return torch.where(torch.isfinite(x), out, x)


class _Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fmt: Format) -> torch.Tensor:
        ctx.fmt = fmt
        return _round_value(x, fmt)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.fmt in SATURATING:
            return grad, None
        return _round_value(grad, ctx.fmt), None


def _round_stochastic(x: torch.Tensor, fmt: Format, generator: torch.Generator | None) -> torch.Tensor:
    """Round up with probability (x - low) / ulp; value of the rounding, gradient straight through."""
    fi = _INFO[fmt]
    x64 = x.detach().to(torch.float64)
    if fmt in SATURATING:
        x64 = torch.clamp(x64, -fi.max, fi.max)
    ulp = spacing(x64, fmt)
    low = torch.floor(x64 / ulp) * ulp
    frac = (x64 - low) / ulp
    u = torch.rand(x64.shape, generator=generator, dtype=torch.float64, device=x64.device)
    out = torch.where(u < frac, low + ulp, low)
    out = torch.where(torch.isfinite(x64), out, x64)
    if fmt not in SATURATING:
        out = torch.where(out.abs() > fi.max, torch.sign(out) * math.inf, out)
    return x + (out.to(x.dtype) - x).detach()


def quantize_scaled(x: torch.Tensor, fmt: Format | str, scale: torch.Tensor) -> torch.Tensor:
    """Quantise x / scale to fmt and scale back (dequantised value in x's dtype). `scale` broadcasts."""
    return round_to(x / scale, fmt) * scale


def amax_scale(x: torch.Tensor, fmt: Format | str, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """Scale so that amax(|x|) over `dims` (all dims if None) maps to fmt's largest value (1 where 0)."""
    fi = info(fmt)
    a = x.detach().abs()
    a = a.amax() if dims is None else a.amax(dim=dims, keepdim=True)
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    return torch.where(a > 0, a / fi.max, torch.ones_like(a))


STAGES = ("input", "score", "stats", "p", "accum", "output")
GRAD_STAGES = ("grad_input", "delta", "grad_score", "grad_p", "grad_accum", "grad_output")
DECODE_STAGES = ("merge",)  # split-KV decoding only (kernels.sim.decode); not part of STAGES' attribution
DELTA_SOURCES = ("forward", "unrounded", "fresh")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The number format of every stage of attention (see ALGORITHMS in the docs).

    Forward stages: `input` (Q, K, V), `score` (S = scale * Q K^T as stored), `stats` (running max m,
    sum l and the rescale factors exp(m_old - m_new)), `p` (P before the P·V product), `accum` (the
    output accumulator), `output`. Backward stages default to their forward counterparts: `grad_input`
    (dO), `delta` (the O used in delta = rowsum(dO * O)), `grad_score` (dP and dS), `grad_p` (P and dS
    before their products), `grad_accum` (dQ, dK, dV accumulators), `grad_output` (dq, dk, dv).
    `merge` (split-KV decoding, defaults to `accum`): the partial outputs, their log-sum-exps and the
    combine. `matmul` is the precision products are formed and summed in before their result is rounded.

    Backward knobs: `delta_source` is the O in delta = rowsum(dO * O) (arXiv 2609.39813): "forward" (O
    rounded to the `delta` stage, by default the forward's rounded output), "unrounded" (the accumulator
    before output rounding) or "fresh" (a new stochastic rounding of it to `delta`, seeded by
    `delta_seed`). `ds_correction` removes the row sums of the rounded dS (arXiv 2609.34272, rank-one
    corrections of dQ and dK; kernels.sim.flash)."""

    name: str = "custom"
    input: Format = Format.FP64
    score: Format = Format.FP64
    stats: Format = Format.FP64
    p: Format = Format.FP64
    accum: Format = Format.FP64
    output: Format = Format.FP64
    matmul: Format = Format.FP64
    grad_input: Format | None = None
    delta: Format | None = None
    grad_score: Format | None = None
    grad_p: Format | None = None
    grad_accum: Format | None = None
    grad_output: Format | None = None
    merge: Format | None = None
    fp8_scaling: str = "tensor"
    hadamard: bool = False
    delta_source: str = "forward"
    delta_seed: int = 0
    ds_correction: bool = False
    # Stage knobs of FP8/FP4 and quantized kernels (FA4, SageAttention; ALGORITHMS.md, "Stage knobs"). Each
    # is inert at its default, and inert while the stage it belongs to is FP64 (so explain's "raised" runs
    # remove it with its stage): qk_scaling, qk_warp_q, qk_warp_k, smooth_q, smooth_k, v_format, source_format,
    # v_scaling, v_scale_max (input);
    # p_scale, p_scaling, exp2_emu (p); qk_acc_bits, the Q K^T MMA's accumulator (score); acc_bits with
    # acc_promote and acc_nearest, the P V MMA's (accum); approx_recip (stats). rescale_threshold changes
    # the algorithm, not a precision: never inert; nor is kv_order (forward / reverse key blocks, overriding
    # the flash kernel's key_order; arXiv 2606.06521). qk_mma / pv_mma (score / accum): the tensor-core model
    # (kernels.tensorcore.mma: ada, hopper, b200) that computes the FP8/FP4 Q K^T / P V MMA bit for bit, in place of the
    # generic qk_acc_bits / acc_bits accumulator (which then only describe its width to the error model);
    # acc_promote promotes its result to fp32, and acc_nearest with acc_bits 10 makes its register fp16.
    # mx_rounding (input): the MX shared scale's rounding, "" / floor (OCP MX) or rceil (Blackwell's cvt.rp);
    # nvfp4_floor (input, p): NVFP4 block scales below 2^-6 raised to it before their e4m3 cast (core.quant).
    # exact_inputs ("qk" or "v", input): those inputs stay exact
    # (float64, unrounded, unsmoothed) while the others round as the policy says: explain's input sub-stages.
    qk_scaling: str = ""
    qk_warp_q: int = 0  # qk_scaling "thread": query rows per warp (0: 32, Ada's) and keys per group (0: 64)
    qk_warp_k: int = 0
    smooth_q: bool = False
    smooth_k: bool = False
    v_format: Format | None = None
    source_format: Format | None = None  # the dtype the inputs arrive in, before the kernel quantises them (sage3)
    v_scaling: str = ""
    v_scale_max: float = 0.0
    p_scale: float = 1.0
    p_scaling: str = ""
    acc_bits: int = 0
    acc_promote: int = 0
    acc_nearest: bool = False
    qk_acc_bits: int = 0
    qk_mma: str = ""
    pv_mma: str = ""
    mx_rounding: str = ""
    nvfp4_floor: bool = False
    exp2_emu: int = 0
    exp2_emu_res: int = 4
    exp2_emu_start: int = 1
    rescale_threshold: float = 0.0
    approx_recip: bool = False
    kv_order: str = ""
    exact_inputs: str = ""

    def __post_init__(self) -> None:
        for field in (*STAGES, "matmul", *GRAD_STAGES, *DECODE_STAGES, "v_format", "source_format"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, parse_format(value))
        _check_knobs(self)
        if self.matmul not in (Format.FP32, Format.FP64):
            raise ValueError(f"matmul precision {self.matmul.value!r} not supported; expected fp32 or fp64")
        if self.fp8_scaling not in ("tensor", "block"):
            raise ValueError(f"unknown fp8_scaling {self.fp8_scaling!r}; expected one of tensor, block")
        if self.delta_source not in DELTA_SOURCES:
            raise ValueError(f"unknown delta_source {self.delta_source!r}; expected one of {', '.join(DELTA_SOURCES)}")
        if self.merge is None:
            object.__setattr__(self, "merge", self.accum)
        defaults = {
            "grad_input": self.input,
            "delta": self.output,
            "grad_score": self.score,
            "grad_p": self.p,
            "grad_accum": self.accum,
            "grad_output": self.input,
        }
        for field, default in defaults.items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, default)

    def stage(self, name: str) -> Format:
        return getattr(self, name)

    def formats(self) -> dict[str, str]:
        return {f: getattr(self, f).value for f in (*STAGES, "matmul", *GRAD_STAGES, *DECODE_STAGES)}

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            **self.formats(),
            "fp8_scaling": self.fp8_scaling,
            "hadamard": self.hadamard,
            "delta_source": self.delta_source,
            "delta_seed": self.delta_seed,
            "ds_correction": self.ds_correction,
            **{k: (v.value if isinstance(v, Format) else v) for k, v in self.knobs().items()},
        }

    def knobs(self) -> dict[str, object]:
        """The stage knobs (STAGE_KNOBS) that differ from their defaults (empty for every policy without them)."""
        return {k: getattr(self, k) for k, default in STAGE_KNOBS.items() if getattr(self, k) != default}

    @property
    def work_dtype(self) -> torch.dtype:
        """fp64 when any stage needs it (or exact_inputs keeps inputs exact), else fp32: every narrower value is
        exact in the working dtype."""
        if self.exact_inputs:
            return torch.float64
        every = [getattr(self, f) for f in (*STAGES, "matmul", *GRAD_STAGES, *DECODE_STAGES)]
        return torch.float64 if Format.FP64 in every else torch.float32

    def replace(self, **changes: object) -> Policy:
        """A copy with some fields changed (backward stages re-derive from forward ones unless given)."""
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for f in GRAD_STAGES:
            if f not in changes and _is_default_grad(self, f):
                base[f] = None
        if "merge" not in changes and self.merge == self.accum:
            base["merge"] = None
        base.update(changes)
        if "name" not in changes:
            base["name"] = "custom"
        return Policy(**base)


STAGE_KNOBS: dict[str, object] = {
    "qk_scaling": "",
    "qk_warp_q": 0,
    "qk_warp_k": 0,
    "smooth_q": False,
    "smooth_k": False,
    "v_format": None,
    "source_format": None,
    "v_scaling": "",
    "v_scale_max": 0.0,
    "p_scale": 1.0,
    "p_scaling": "",
    "acc_bits": 0,
    "acc_promote": 0,
    "acc_nearest": False,
    "qk_acc_bits": 0,
    "qk_mma": "",
    "pv_mma": "",
    "mx_rounding": "",
    "nvfp4_floor": False,
    "exp2_emu": 0,
    "exp2_emu_res": 4,
    "exp2_emu_start": 1,
    "rescale_threshold": 0.0,
    "approx_recip": False,
    "kv_order": "",
    "exact_inputs": "",
}
QK_SCALINGS = ("", "tensor", "block", "token", "thread", "mx", "nvfp4", "sage3")
V_SCALINGS = ("", "tensor", "block", "channel", "mx", "nvfp4", "sage3")
P_SCALINGS = ("", "nvfp4", "sage3")
EXACT_INPUTS = ("", "qk", "v")
MMA_NAMES = ("", "ada", "hopper", "b200")  # kernels.tensorcore.mma.MMA_MODELS' keys (core does not import kernels)


def _check_knobs(pol: Policy) -> None:
    orders = ("", "forward", "reverse")
    for name, allowed in (
        ("qk_scaling", QK_SCALINGS),
        ("v_scaling", V_SCALINGS),
        ("p_scaling", P_SCALINGS),
        ("kv_order", orders),
        ("exact_inputs", EXACT_INPUTS),
        ("qk_mma", MMA_NAMES),
        ("pv_mma", MMA_NAMES),
        ("mx_rounding", ("", "floor", "rceil")),
    ):
        if getattr(pol, name) not in allowed:
            shown = ", ".join(a or "''" for a in allowed)
            raise ValueError(f"unknown {name} {getattr(pol, name)!r}; expected one of {shown}")
    ints = ("acc_bits", "acc_promote", "qk_acc_bits", "exp2_emu", "exp2_emu_res", "exp2_emu_start")
    ints += ("qk_warp_q", "qk_warp_k")
    for name in ints:
        value = getattr(pol, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative integer")
    if max(pol.acc_bits, pol.qk_acc_bits) > 23:
        raise ValueError(f"acc_bits={pol.acc_bits}, qk_acc_bits={pol.qk_acc_bits} must be at most 23 (float32's)")
    for name in ("p_scale", "rescale_threshold", "v_scale_max"):
        value = getattr(pol, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number")
    if pol.p_scale <= 0 or pol.rescale_threshold < 0 or pol.v_scale_max < 0:
        raise ValueError(f"p_scale={pol.p_scale!r} must be > 0 and rescale_threshold={pol.rescale_threshold!r} >= 0")


def _is_default_grad(policy: Policy, field: str) -> bool:
    source = {
        "grad_input": "input",
        "delta": "output",
        "grad_score": "score",
        "grad_p": "p",
        "grad_accum": "accum",
        "grad_output": "input",
    }[field]
    return getattr(policy, field) == getattr(policy, source)


def uniform_policy(fmt: Format | str) -> Policy:
    """Every stage in fmt (the seed paper's setting). Products are summed in fp32 (fp64 for fp64)."""
    fmt = parse_format(fmt)
    mm = Format.FP64 if fmt == Format.FP64 else Format.FP32
    return Policy(name=fmt.value, input=fmt, score=fmt, stats=fmt, p=fmt, accum=fmt, output=fmt, matmul=mm)


def mixed_policy(fmt: Format | str) -> Policy:
    """Inputs, P and output in fmt, every other stage in fp32 (what FA2 kernels do)."""
    fmt = parse_format(fmt)
    wide = Format.FP64 if fmt == Format.FP64 else Format.FP32
    return Policy(
        name=f"{fmt.value}-mixed",
        input=fmt,
        score=wide,
        stats=wide,
        p=fmt,
        accum=wide,
        output=fmt,
        matmul=wide,
    )


def _fa3_fp8(block: bool, hadamard: bool, name: str) -> Policy:
    return Policy(
        name=name,
        input=Format.FP8_E4M3,
        score=Format.FP32,
        stats=Format.FP32,
        p=Format.FP8_E4M3,
        accum=Format.FP32,
        output=Format.FP16,
        matmul=Format.FP32,
        fp8_scaling="block" if block else "tensor",
        hadamard=hadamard,
    )


# Named policies from FlashAttention-3 (arXiv 2407.08608, section 4.3).
NAMED_POLICIES: dict[str, Policy] = {
    "fa3-fp8": _fa3_fp8(True, True, "fa3-fp8"),
    "fa3-fp8-no-block": _fa3_fp8(False, True, "fa3-fp8-no-block"),
    "fa3-fp8-no-hadamard": _fa3_fp8(True, False, "fa3-fp8-no-hadamard"),
    "baseline-fp8": Policy(
        name="baseline-fp8",
        input=Format.FP8_E4M3,
        score=Format.FP32,
        stats=Format.FP16,
        p=Format.FP8_E4M3,
        accum=Format.FP32,
        output=Format.FP16,
        matmul=Format.FP32,
        fp8_scaling="tensor",
    ),
}


def policy_names() -> list[str]:
    names = [f.value for f in Format] + [f"{f.value}-mixed" for f in Format]
    return names + list(NAMED_POLICIES)


def parse_policy(spec: str | Policy) -> Policy:
    """A policy from its name (`FMT`, `FMT-mixed`, a named policy, a modern kernel preset `NAME[@FMT]` such
    as sage2@fp16 or fa4-fp8: kernels.sim.presets_modern) or from keywords.

    Keyword form: `bf16-mixed,p=fp32` (a base name then overrides) or `input=bf16,score=fp32,...`
    (unnamed stages default to fp64). Keys: the stage names (merge too), matmul, fp8_scaling, hadamard,
    and the backward knobs delta_source, delta_seed, ds_correction."""
    if isinstance(spec, Policy):
        return spec
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"empty numerics policy {spec!r}; expected one of {', '.join(policy_names())}")
    base = Policy(name="custom")
    if "=" not in parts[0]:
        base = _named_policy(parts.pop(0))
    if not parts:
        return base
    changes: dict[str, object] = {}
    allowed = (*STAGES, "matmul", *GRAD_STAGES, *DECODE_STAGES, "fp8_scaling", "hadamard", *_KNOBS, *STAGE_KNOBS)
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in allowed:
            raise ValueError(
                f"bad policy term {part!r} in {spec!r}; expected KEY=VALUE with KEY in {', '.join(allowed)}"
            )
        if key in ("hadamard", "ds_correction", "smooth_q", "smooth_k", "approx_recip", "acc_nearest", "nvfp4_floor"):
            changes[key] = value.strip().lower() in ("1", "true", "yes", "on")
        elif key in (
            "fp8_scaling", "delta_source", "qk_scaling", "v_scaling", "p_scaling", "kv_order", "exact_inputs",
            "qk_mma", "pv_mma", "mx_rounding",
        ):  # fmt: skip
            changes[key] = value.strip()
        elif key in (
            "delta_seed",
            "qk_warp_q",
            "qk_warp_k",
            "acc_bits",
            "acc_promote",
            "qk_acc_bits",
            "exp2_emu",
            "exp2_emu_res",
            "exp2_emu_start",
        ):
            changes[key] = _int_term(part, value)
        elif key in ("p_scale", "rescale_threshold", "v_scale_max"):
            changes[key] = _float_term(part, value)
        else:
            changes[key] = parse_format(value.strip())
    policy = base.replace(**changes)
    return dataclasses.replace(policy, name=str(spec))


_KNOBS = ("delta_source", "delta_seed", "ds_correction")


def _int_term(part: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"bad policy term {part!r}: expected an integer") from None


def _float_term(part: str, value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise ValueError(f"bad policy term {part!r}: expected a number") from None


# Lookups a higher floor registers (kernels.sim.presets_modern: "NAME[@FMT]" -> Policy or None), so that policy names
# the kernels define parse here without core importing kernels.
POLICY_LOOKUPS: list[Callable[[str], Policy | None]] = []


def _named_policy(name: str) -> Policy:
    key = name.strip().lower()
    if key in NAMED_POLICIES:
        return NAMED_POLICIES[key]
    for lookup in POLICY_LOOKUPS:  # the kernel presets of 2026 (FA4, Sage), registered by kernels.sim.presets_modern
        found = lookup(key)
        if found is not None:
            return found
    mixed = key.endswith("-mixed")
    fmt_name = key[: -len("-mixed")] if mixed else key
    try:
        fmt = parse_format(fmt_name)
    except ValueError:
        raise ValueError(
            f"unknown numerics policy {name!r}; expected one of {', '.join(policy_names())} or KEY=VALUE terms"
        ) from None
    return mixed_policy(fmt) if mixed else uniform_policy(fmt)


def batch_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    """The broadcast batch shape of matmul operands a [..., M, K] and b [..., K, N]. torch.broadcast_shapes only
    where they differ: its first call imports sympy (0.4 s of CPU in every process that runs a kernel), and it
    costs more than a small product chain."""
    ba, bb = a.shape[:-2], b.shape[:-2]
    return tuple(ba) if ba == bb else tuple(torch.broadcast_shapes(ba, bb))
