"""FlashAttention-4's software exp2 and the fast-math pieces of its softmax (flash_attn/cute: utils.py
ex2_emulation, softmax.py SoftmaxSm100.apply_exp2_convert), and the truncating tensor-core accumulator.

All arithmetic is float32, as on the GPU: an FMA is formed exactly in float64 (a product of two float32 values
is exact there, and the sums here fit 53 bits) and rounded once to float32."""

from __future__ import annotations

import functools
import math

import torch

from flashcheck.core.numerics import batch_shape

# FA4's degree-3 coefficients of 2^f on [0, 1) (flash_attn/cute/utils.py POLY_EX2[3]), Horner order c0..c3
POLY_EX2_3 = (1.0, 0.695146143436431884765625, 0.227564394474029541015625, 0.077119089663028717041015625)
ROUND_INT = float(2**23 + 2**22)  # adding it rounds a float32 in [-127, 127] to an integer (in the low bits)
FRAGMENT = 32  # FA4 applies the exp2 split per fragment of 32 score columns


def _fma32(a: torch.Tensor, b: torch.Tensor | float, c: float) -> torch.Tensor:
    return (a.to(torch.float64) * b + c).to(torch.float32)


def ex2_emulation(x: torch.Tensor, poly: tuple[float, ...] = POLY_EX2_3) -> torch.Tensor:
    """2^x (x <= 127) as FA4's software path computes it, float32 [same shape as x]: x clamped at -127, its
    floor from an add of 2^23 + 2^22 rounded down, 2^frac by Horner FMAs, the floor added into the exponent
    bits of the polynomial's value (an integer add on the bit pattern)."""
    xc = torch.clamp(x.to(torch.float32), min=-127.0)
    floor = torch.floor(xc)  # (xc + ROUND_INT) rounded down, minus ROUND_INT: exact for |xc| <= 127
    frac = xc - floor  # exact in float32 (Sterbenz)
    out = torch.full_like(frac, poly[-1])
    for c in reversed(poly[:-1]):
        out = _fma32(out, frac, c)
    bits = out.view(torch.int32) + (floor.to(torch.int32) << 23)
    # floor -127 (x in [-127, -126)) leaves the exponent field 0 and the polynomial's mantissa: the subnormal
    # (p - 1) * 2^-126 the kernel's integer add produces (kept: no flush on the way to P)
    return bits.view(torch.float32)


def poly_rel_error_bound(poly: tuple[float, ...] = POLY_EX2_3, n: int = 200_001) -> float:
    """max |p(f) / 2^f - 1| over f in [0, 1) on a fine grid (float64): the polynomial's own error."""
    f = torch.linspace(0.0, 1.0, n, dtype=torch.float64)[:-1]
    val = torch.zeros_like(f)
    for c in reversed(poly):
        val = val * f + c
    return float((val / torch.exp2(f) - 1).abs().max())


def emulated_columns(width: int, freq: int, res: int = 4, start: int = 1) -> torch.Tensor:
    """Which of a key block's `width` score columns FA4 sends through ex2_emulation (bool [width]): columns
    split into fragments of 32; fragment j (start <= j < last) emulates the pairs (k, k + 1), k even, with
    k mod freq >= freq - res; every other column uses the hardware exp2. freq 0: none. A new tensor."""
    return column_mask(width, freq, res, start).clone()


@functools.cache
def column_mask(width: int, freq: int, res: int, start: int) -> torch.Tensor:
    """emulated_columns built once per argument tuple and shared (a forward asks every key block): never modify it."""
    cols = torch.zeros(width, dtype=torch.bool)
    if freq <= 0:
        return cols
    frags = math.ceil(width / FRAGMENT)
    for j in range(start, frags - 1):
        for k in range(0, FRAGMENT, 2):
            if k % freq >= freq - res:
                c = j * FRAGMENT + k
                cols[c : min(c + 2, width)] = True
    return cols


def exp2_fa4(x: torch.Tensor, cols: torch.Tensor, columns=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """2^x [..., W] with columns `cols` (bool [W]) emulated and the rest float32 exp2 (the hardware MUFU.EX2,
    modelled as a correctly rounded float32 exp2), returned in x's dtype. `columns(x32, idx, poly, out) -> bool`:
    a faster pass writing the emulated columns idx into out (kernels.native.presets.ex2_columns), or False where it
    does not apply (then the torch steps here run). out: a float32 tensor of x's shape, not x, written (and
    returned where x is float32) instead of a new one."""
    x32 = x.to(torch.float32)
    hw = torch.exp2(x32) if out is None else torch.exp2(x32, out=out)
    idx = cols.nonzero().squeeze(1).to(x.device)  # the same columns as indexing by the mask, without its passes
    if idx.numel() and not (columns is not None and columns(x32, idx, POLY_EX2_3, hw)):
        hw.index_copy_(-1, idx, ex2_emulation(x.index_select(-1, idx)))
    return hw.to(x.dtype)


def rcp_approx(x: torch.Tensor) -> torch.Tensor:
    """1 / x as a float32 reciprocal (rcp.approx.ftz.f32, modelled as the correctly rounded float32 value;
    its product with O is a second rounding where a division has one), in x's dtype."""
    return torch.reciprocal(x.to(torch.float32)).to(x.dtype)


def truncate_bits(x: torch.Tensor, bits: int, *, nearest: bool = False) -> torch.Tensor:
    """x rounded toward zero (nearest: to nearest, ties to even) to `bits` explicit mantissa bits (float32's
    exponent range), in x's dtype: the value a tensor-core accumulator of that width holds. Done on float64's
    bit pattern (sign and magnitude): clearing the low 52 - bits mantissa bits truncates; adding half an ulp
    less one, plus the kept last bit, first rounds to nearest, ties to even (a carry moves to the next binade)."""
    i = x.to(torch.float64).contiguous().view(torch.int64)
    shift = 52 - bits
    if nearest:
        i = i + ((1 << (shift - 1)) - 1) + ((i >> shift) & 1)
    return (i & ~((1 << shift) - 1)).view(torch.float64).to(x.dtype)


def _truncate_(x: torch.Tensor, bits: int, nearest: bool) -> torch.Tensor:
    """truncate_bits in place on a contiguous float64 tensor (the same integer steps; returns x)."""
    i = x.view(torch.int64)
    shift = 52 - bits
    if nearest:
        i.add_(((i >> shift) & 1).add_((1 << (shift - 1)) - 1))
    i.bitwise_and_(~((1 << shift) - 1))
    return x


def mm_accumulate(
    a: torch.Tensor,
    b: torch.Tensor,
    bits: int,
    *,
    chunk: int = 32,
    promote: int = 0,
    init: torch.Tensor | None = None,
    nearest: bool = False,
) -> torch.Tensor:
    """a @ b ([..., M, K] @ [..., K, N]) as an MMA with a `bits`-mantissa accumulator: each `chunk` of K
    (one MMA instruction's k) is summed (float64) and added to the accumulator, truncated to `bits`; every
    `promote` K elements (0: never) the accumulator is added to a float32 sum and restarts at 0 (two-level
    accumulation, DeepSeek-V3 / SageAttention2). `init` [..., M, N]: the running O the result is added to:
    the float32 outer sum with `promote`, else the accumulator's starting value (the MMA accumulates into O,
    as FA3's does). `nearest`: the accumulator rounds to nearest (an fp16 accumulator: bits 10) instead of
    truncating (the FP22 accumulator of FP8 MMA on Ada/Hopper: bits 13). Returns the float32 total."""
    k, dtype = a.shape[-1], a.dtype
    a, b = a.to(torch.float64), b.to(torch.float64)
    shape = (*batch_shape(a, b), a.shape[-2], b.shape[-1])
    acc = torch.zeros(shape, dtype=torch.float64, device=a.device)  # updated in place below (a fresh buffer)
    outer = torch.zeros_like(acc)
    if init is not None:  # two-level: the float32 O is the outer sum; one level: the MMA accumulates into O
        (outer if promote else acc).add_(init.to(torch.float64))
    part = torch.empty_like(acc)  # each chunk's product, formed in one contiguous buffer as a fresh one is laid out
    since = 0
    for c0 in range(0, k, chunk):
        c1 = min(k, c0 + chunk)
        _truncate_(acc.add_(torch.matmul(a[..., c0:c1], b[..., c0:c1, :], out=part)), bits, nearest)
        since += c1 - c0
        if promote and since >= promote:
            outer.copy_(outer.add_(acc).to(torch.float32))
            acc.zero_()
            since = 0
    return ((outer + acc) if promote else acc).to(torch.float32).to(dtype)
