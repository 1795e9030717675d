"""Scaled quantisers: E8M0 scales, OCP MX block formats (MXFP8/MXFP6/MXFP4), NVFP4, and integer quantisation
with per-tensor / per-block / per-token / per-thread scales (SageAttention's granularities).

Every quantiser returns the dequantised tensor (the value the kernel's MMA sees times its scale), in x's dtype
and shape; blocks run along `dim` (the reduction dimension of the product the tensor enters)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from flashcheck.core.numerics import INT_FORMATS, Format, info, parse_format, round_to

E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127  # OCP MX v1.0 section 5.4.1: 2^-127 .. 2^127, 0xFF is NaN

MX_SCHEMES: dict[str, tuple[Format, int]] = {
    "mxfp8": (Format.FP8_E4M3, 32),
    "mxfp8-e5m2": (Format.FP8_E5M2, 32),
    "mxfp6": (Format.FP6_E2M3, 32),
    "mxfp6-e3m2": (Format.FP6_E3M2, 32),
    "mxfp4": (Format.FP4_E2M1, 32),
}
BLOCK_SCHEMES = (*MX_SCHEMES, "nvfp4")
NVFP4_BLOCK = 16


def round_e8m0(x: torch.Tensor) -> torch.Tensor:
    """x (positive) rounded to E8M0 as torch's float8_e8m0fnu cast does: the nearest power of two, ties
    (m = 1.5 * 2^e) up, saturating into [2^-127, 2^127]; 0 and negatives give 2^-127, inf and NaN NaN."""
    x64 = x.detach().to(torch.float64)
    mant, exp = torch.frexp(x64)  # x = mant * 2^exp, mant in [0.5, 1)
    e = torch.where(mant >= 0.75, exp, exp - 1).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    out = torch.ldexp(torch.ones_like(x64), e.to(torch.float64))
    out = torch.where(x64 > 0, out, torch.full_like(x64, 2.0**E8M0_MIN_EXP))
    return torch.where(torch.isfinite(x64), out, torch.full_like(x64, math.nan)).to(x.dtype)


def emax(fmt: Format | str) -> int:
    """The exponent of fmt's largest normal value (OCP MX's emax_elem: e4m3 8, e5m2 15, e2m3 2, e3m2 4, e2m1 2)."""
    return math.frexp(info(fmt).max)[1] - 1


def _blocked(x: torch.Tensor, dim: int, block: int) -> tuple[torch.Tensor, int]:
    """x with `dim` moved last and split into [..., n / block, block] (zero-padded), and the pad."""
    xt = x.movedim(dim, -1)
    pad = (-xt.shape[-1]) % block
    if pad:
        xt = torch.nn.functional.pad(xt, (0, pad))
    return xt.reshape(*xt.shape[:-1], -1, block), pad


def _unblocked(xb: torch.Tensor, pad: int, dim: int) -> torch.Tensor:
    xt = xb.reshape(*xb.shape[:-2], -1)
    if pad:
        xt = xt[..., :-pad]
    return xt.movedim(-1, dim)


MX_ROUNDINGS = ("floor", "rceil")


def mx_scales(amax: torch.Tensor, fmt: Format | str, rounding: str = "floor") -> torch.Tensor:
    """The E8M0 shared scale X of blocks with largest magnitude amax. floor (OCP MX v1.0 section 6.3):
    X = 2^(floor(log2(amax)) - emax_elem); rceil (Blackwell's cvt.rp.satfinite.ue8m0, cuBLAS / torchao "RCEIL"):
    X = the smallest power of two >= amax / max_elem, that quotient formed in float32. Clamped to E8M0's range;
    amax 0 gives 2^-127."""
    if rounding not in MX_ROUNDINGS:
        raise ValueError(f"unknown MX scale rounding {rounding!r}; expected one of {', '.join(MX_ROUNDINGS)}")
    a64 = amax.to(torch.float64)
    if rounding == "rceil":
        descale = (amax.to(torch.float32) / info(fmt).max).to(torch.float64)  # float32 division, as the kernels
        mant, exp = torch.frexp(descale)  # descale = mant * 2^exp, mant in [0.5, 1): a power of two iff mant 0.5
        shared = torch.where(mant == 0.5, exp - 1, exp)
    else:
        _, exp = torch.frexp(a64)
        shared = exp - 1 - emax(fmt)
    x = torch.ldexp(torch.ones_like(a64), shared.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP).to(torch.float64))
    return torch.where(a64 > 0, x, torch.full_like(a64, 2.0**E8M0_MIN_EXP))


def quantize_mx(
    x: torch.Tensor, fmt: Format | str, *, block: int = 32, dim: int = -1, rounding: str = "floor"
) -> torch.Tensor:
    """MX block quantisation: blocks of `block` elements along `dim` share the scale X of mx_scales (`rounding`
    floor or rceil); each element is x / X rounded to fmt (nearest-even, saturating at fmt's max) and multiplied
    back by X. (A block whose rceil scale is 2^-127 keeps its elements unscaled, as torchao and Transformer
    Engine do, before the saturating cast.)"""
    fmt = parse_format(fmt)
    xb, pad = _blocked(x.detach().to(torch.float64), dim, block)
    scale = mx_scales(xb.abs().amax(dim=-1, keepdim=True), fmt, rounding)
    div = scale
    if rounding == "rceil":
        div = torch.where(scale == 2.0**E8M0_MIN_EXP, torch.ones_like(scale), scale)
    return _unblocked(round_to(xb / div, fmt) * scale, pad, dim).to(x.dtype)


class NVFP4Parts(NamedTuple):
    """NVFP4's pieces (nvfp4_parts): `values` the dequantised tensor (quantize_nvfp4's, x's dtype and shape);
    `scaled` the block-scaled values e2m1 * s_block (float32, x's shape: exact, at most 6 significant bits, what
    a block-scaled MMA multiplies); `descale` the fp32 tensor decode scale fl32(1 / s_enc) (float32, broadcasting
    against x), which the kernel multiplies into the MMA's fp32 result."""

    values: torch.Tensor
    scaled: torch.Tensor
    descale: torch.Tensor


def nvfp4_tensor_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's fp32 tensor encode scale s_enc = fl32(448 * 6 / amax) (1 where amax is 0) and its decode scale
    fl32(1 / s_enc), for a float32 tensor amax (nvfp4_parts)."""
    s_enc = torch.where(amax > 0, (448.0 * 6.0) / amax, torch.ones_like(amax))
    return s_enc, (1.0 / s_enc).to(torch.float32)


def nvfp4_parts(
    x: torch.Tensor, *, block: int = NVFP4_BLOCK, dim: int = -1, tensor_amax=None, scale_floor: bool = False
) -> NVFP4Parts:
    """NVFP4 quantisation of x (see quantize_nvfp4) with its pieces. The tensor descale is fl32(1 / s_enc),
    s_enc = fl32(448 * 6 / amax) the encode scale the block scales were formed with (NVIDIA's recipe: block
    scale e4m3(amax_b / 6 * s_enc), its decode scale the fp32 reciprocal), so scaled * descale is the value the
    quantiser meant, e2m1 * s_block / s_enc: fl32(scaled * descale) and values (formed as
    e2m1 * fl32(s_block / s_enc)) are each within two fp32 roundings of it, 0 to 2 ulps apart
    (tests/test_nvfp4_mma.py). torchao 0.18.0's per_tensor_scale is amax / (448 * 6)
    rounded once, the same number to within 2 ulps (prototype/mx_formats/nvfp4_tensor.py
    per_tensor_amax_to_scale); amax 0: descale 1."""
    x32 = x.detach().to(torch.float32)
    amax_t = x32.abs().amax() if tensor_amax is None else torch.as_tensor(tensor_amax, dtype=torch.float32)
    s_enc, descale = nvfp4_tensor_scales(amax_t)
    if tensor_amax is not None and s_enc.dim():
        s_enc = _blocked(s_enc.expand_as(x32), dim, block)[0][..., :1]
    xb, pad = _blocked(x32, dim, block)
    raw = xb.abs().amax(dim=-1, keepdim=True) / 6.0 * s_enc
    s_block = round_to(raw.clamp_min(2.0**-6) if scale_floor else raw, Format.FP8_E4M3)
    dec = s_block / s_enc
    live = dec > 0
    safe = torch.where(live, dec, torch.ones_like(dec))
    codes = torch.where(live, round_to(xb / safe, Format.FP4_E2M1), torch.zeros_like(xb))
    values = _unblocked(torch.where(live, codes * dec, torch.zeros_like(xb)), pad, dim).to(x.dtype)
    return NVFP4Parts(values, _unblocked(codes * s_block, pad, dim), descale)


def quantize_nvfp4(
    x: torch.Tensor, *, block: int = NVFP4_BLOCK, dim: int = -1, tensor_amax=None, scale_floor: bool = False
) -> torch.Tensor:
    """NVFP4: e2m1 values in blocks of 16 along `dim`, each block with an e4m3 scale, the tensor with an FP32
    scale s = 448 * 6 / amax(|x|) (NVIDIA's two-level recipe): block scale e4m3(amax_b / 6 * s), element
    e2m1(x / (scale_b / s)), value e2m1 * scale_b / s, the arithmetic in float32 as the kernels do.
    `tensor_amax` overrides amax(|x|) (a calibrated or per-row amax, broadcasting against x). `scale_floor`:
    a block scale below e4m3's smallest normal 2^-6 is raised to it before the cast (torchao's nvfp4_quantize
    clamps so); without it the scale may be an e4m3 subnormal, or 0 (the block then quantises to 0).
    nvfp4_parts gives the pieces (block-scaled values and the tensor descale) as well."""
    return nvfp4_parts(x, block=block, dim=dim, tensor_amax=tensor_amax, scale_floor=scale_floor).values


def quantize_blocks(
    x: torch.Tensor, scheme: str, *, dim: int = -1, rounding: str = "floor", scale_floor: bool = False
) -> torch.Tensor:
    """Block (microscaling) quantisation of x along `dim` by scheme: mxfp8 (e4m3), mxfp8-e5m2, mxfp6 (e2m3),
    mxfp6-e3m2, mxfp4 (e2m1), all 32-element blocks with an E8M0 scale (`rounding` floor or rceil, see
    mx_scales); nvfp4 (see quantize_nvfp4; `scale_floor`)."""
    if scheme == "nvfp4":
        return quantize_nvfp4(x, dim=dim, scale_floor=scale_floor)
    if scheme not in MX_SCHEMES:
        raise ValueError(f"unknown block scheme {scheme!r}; expected one of {', '.join(BLOCK_SCHEMES)}")
    fmt, block = MX_SCHEMES[scheme]
    return quantize_mx(x, fmt, block=block, dim=dim, rounding=rounding)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer, halves away from zero (SageAttention's x + 0.5 sign(x), truncated)."""
    return torch.trunc(x + 0.5 * torch.sign(x))


GRANULARITIES = ("tensor", "block", "token", "thread", "channel")


def group_ids(n: int, granularity: str, *, block: int = 128, warp: int = 32, threads: int = 8) -> torch.Tensor:
    """The scale group of each of n tokens [n] (int64): block — `block` consecutive tokens; token — one each;
    thread — SageAttention2's per-thread groups: within each `warp` of consecutive tokens, the tokens whose
    index mod 8 falls in one thread's share (threads = 8: index mod 8; threads = 4: pairs {2t, 2t + 1});
    tensor — all one group."""
    idx = torch.arange(n)
    if granularity == "tensor":
        return torch.zeros(n, dtype=torch.int64)
    if granularity == "token":
        return idx
    if granularity == "block":
        return idx // block
    if granularity == "thread":
        lane = (idx % 8) // (8 // threads)
        return (idx // warp) * threads + lane
    raise ValueError(f"unknown token granularity {granularity!r}; expected one of {', '.join(GRANULARITIES)}")


def quantize_int(
    x: torch.Tensor,
    fmt: Format | str,
    granularity: str = "block",
    *,
    block: int = 128,
    warp: int = 32,
    threads: int = 8,
    eps: float = 1e-7,
) -> torch.Tensor:
    """Symmetric integer quantisation of x [..., L, D] (int8: +-127, int4: +-7) with one scale per token
    group (group_ids; `channel`: one per column of D over all tokens): scale = amax / qmax + eps (as
    SageAttention computes it), value round_half_away(x / scale) * scale, in float32 arithmetic."""
    fmt = parse_format(fmt)
    if fmt not in INT_FORMATS:
        raise ValueError(f"quantize_int takes int8 or int4; got {fmt.value}")
    qmax = info(fmt).max
    x32 = x.detach().to(torch.float32)
    if granularity == "channel":
        amax = x32.abs().amax(dim=-2, keepdim=True)
    else:
        ids = group_ids(x32.shape[-2], granularity, block=block, warp=warp, threads=threads).to(x32.device)
        groups = int(ids.max()) + 1 if ids.numel() else 0
        amax_g = torch.zeros(*x32.shape[:-2], groups, dtype=torch.float32, device=x32.device)
        amax_g.scatter_reduce_(-1, ids.expand(*x32.shape[:-2], -1), x32.abs().amax(dim=-1), "amax")
        amax = amax_g.index_select(-1, ids).unsqueeze(-1)
    scale = amax / qmax + eps
    q = round_half_away(x32 / scale).clamp(-qmax, qmax)
    return (q * scale).to(x.dtype)
