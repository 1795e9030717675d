"""The tensor-core MMA of FP8 / FP4 operands as the hardware computes it: a block FMA of `nfma` products at a time
(Fasi et al. 2021; Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004, TACO 2026).

One block step d = sum_{i < nfma} a_i b_i + c:
- each operand's exponent is floor(log2 |x|) clamped below at its format's emin (a subnormal keeps a denormalised
  significand), a product's exponent the sum of its operands' (zero products take no part in the maximum);
- every product and c (late_c: the products only) are aligned to the block's largest exponent E (E >= min_exp),
  each truncated toward zero to `frac` fraction bits below 2^E;
- the terms are summed exactly; the sum is truncated toward zero to `frac_out` fraction bits of its own exponent
  (at least fp32's -126); a zero result is +0;
- late_c (Blackwell): c is added to that block sum afterwards by an fp32 round-to-nearest-even addition.
A length-K product chains blocks of `nfma` consecutive k, each block's result the next one's c (a ragged last
block is zero padded, which changes nothing). Two-level accumulation (`promote_every`): each run of that many k is
a chain from +0, added to an fp32 accumulator with round-to-nearest (cuBLAS's slow accumulation, DeepSeek-V3's
promotion, SageAttention2's per-block fp32 buffer).

Every step is exact in float64 (products of narrow values, power-of-two scalings, truncations, sums below 2^53),
so the result does not depend on the device or on the order of evaluation. The test oracle is mmaemu 0.1.0's
instruction model (tests/test_mma.py), which this module matches bit for bit; it is not a runtime dependency."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from flashcheck.core.numerics import batch_shape

# exponent of the smallest normal value of each operand format (subnormals share it); "fp32": operands that are
# not format codes (dequantised values), their own exponents down to fp32's; "e2m1s": block-scaled FP4 values
# e2m1 x e4m3 (NVFP4's and SageAttention3's operands, no tensor scale), |x| in {0} u [2^-10, 2688] with at most
# 6 significant bits: -10 (e2m1's 0.5 times e4m3's smallest subnormal 2^-9) clamps none of them, so they take
# the "fp32" operands' exponents, and the float32 chain (products exact, exponent sums >= -20)
EMIN = {"e4m3": -6, "e5m2": -14, "e2m1": 0, "e2m3": 0, "e3m2": -2, "e2m1s": -10, "fp32": -126}
_ZERO_EXP = -8_000  # the exponent given to zero values (int16; a sum of two fits): never a block's maximum
TILE_ELEMS = 1 << 22  # products held at once per K chunk (float64: 32 MiB, with the exponents 64 MiB)


@dataclass(frozen=True, slots=True, kw_only=True)
class MMAModel:
    """One tensor-core FMA unit: `nfma` products per block, `frac` fraction bits kept below the block's alignment
    exponent, `frac_out` fraction bits of the block result, `min_exp` the lowest alignment exponent, `late_c`
    (c added after the block sum by an fp32 round-to-nearest addition instead of taking part in the alignment)."""

    name: str
    nfma: int
    frac: int
    frac_out: int
    min_exp: int = -132
    late_c: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if self.nfma < 1 or not 1 <= self.frac <= 40 or not 1 <= self.frac_out <= 23:
            raise ValueError(
                f"MMAModel {self.name!r}: nfma={self.nfma} must be >= 1, frac={self.frac} in [1, 40], "
                f"frac_out={self.frac_out} in [1, 23]"
            )


ADA = MMAModel(
    name="ada", nfma=16, frac=13, frac_out=13, source="FP8 mma.sync m16n8k32 on sm_89 (mmaemu 'ada', RTX 4060)"
)
HOPPER = MMAModel(
    name="hopper", nfma=32, frac=13, frac_out=13, source="FP8 wgmma on sm_90 (mmaemu 'hopper', cuBLAS on an H100)"
)
B200 = MMAModel(
    name="b200", nfma=32, frac=25, frac_out=23, min_exp=-133, late_c=True,
    source="B200 tensor core (mmaemu 'b200_mma_sync', fitted to the B200 vectors of arXiv 2512.07004)",
)  # fmt: skip
MMA_MODELS: dict[str, MMAModel] = {m.name: m for m in (ADA, HOPPER, B200)}


def _formats(fmt: str | tuple[str, str]) -> tuple[str, str]:
    pair = (fmt, fmt) if isinstance(fmt, str) else tuple(fmt)
    for f in pair:
        if f not in EMIN:
            raise ValueError(f"unknown operand format {f!r}; expected one of {', '.join(EMIN)}")
    return pair  # type: ignore[return-value]


def _exponents(x: torch.Tensor, emin: int) -> torch.Tensor:
    """floor(log2 |x|) clamped below at emin (int16, x's shape); _ZERO_EXP where x == 0. frexp is exact."""
    e = (torch.frexp(x)[1] - 1).clamp_min(emin).to(torch.int16)
    return torch.where(x != 0, e, torch.full_like(e, _ZERO_EXP))


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e (float64) for integer e (int64) in float64's normal range, from the bit pattern."""
    return ((e + 1023) << 52).view(torch.float64)


def _exponent_of(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) (int64) of float64 x holding fp32 values (normal in float64); -1023 for zero."""
    return ((x.view(torch.int64) >> 52) & 0x7FF) - 1023


def _truncate_out(d: torch.Tensor, frac_out: int) -> torch.Tensor:
    """d (float64) truncated toward zero to frac_out fraction bits of its exponent, at least fp32's -126: a mask
    on float64's mantissa bits, and below 2^-126 the fixed grid 2^(-126 - frac_out)."""
    out = (d.view(torch.int64) & ~((1 << (52 - frac_out)) - 1)).view(torch.float64)
    tiny = d.abs() < 2.0**-126
    if bool(tiny.any()):
        out = torch.where(tiny, torch.trunc(d * 2.0 ** (126 + frac_out)) * 2.0 ** (-126 - frac_out), out)
    return out


def _block(p: torch.Tensor, ep: torch.Tensor, acc: torch.Tensor, model: MMAModel) -> torch.Tensor:
    """One block step. p [..., nfma] exact products (float32 or float64), ep [...] their largest exponent (int64),
    acc [...] the accumulator c (float64 holding fp32 values). Returns the new accumulator."""
    e = ep if model.late_c else torch.maximum(ep, _exponent_of(acc))  # a zero c's -1023 is never the maximum
    q = _pow2(e.clamp_min(model.min_exp) - model.frac)
    if p.dtype == torch.float32 and model.frac <= 13 and model.nfma <= 64:
        # narrow products: each aligned term and the block's sum of them (< 2^(frac + 9)) are exact in float32;
        # a nonzero product puts E at -28 or above, so 2^(E - frac) floored at fp32's 2^-126 changes no term
        q32 = torch.maximum(q, torch.full_like(q, 2.0**-126)).to(torch.float32)
        s = torch.div(p, q32.unsqueeze(-1), rounding_mode="trunc").sum(-1).to(torch.float64)
    else:
        s = torch.div(p, q.unsqueeze(-1), rounding_mode="trunc").sum(-1, dtype=torch.float64)
    if not model.late_c:
        s = s + torch.div(acc, q, rounding_mode="trunc")
    d = _truncate_out(s * q, model.frac_out)
    if model.late_c:
        return (d.to(torch.float32) + acc.to(torch.float32)).to(torch.float64)  # fp32 round-to-nearest-even
    return d + 0.0  # a zero result is +0


def _chain(a, ea, b, eb, acc: torch.Tensor, model: MMAModel, fp16: bool = False) -> torch.Tensor:
    """Continue the chain acc [..., M, N] over a [..., M, L], b [..., N, L] (L a multiple of nfma) with their
    clamped exponents ea, eb (int16); K chunks of TILE_ELEMS products at a time, blocks in order. fp16: each block
    result is rounded to the nearest fp16 (an fp16 accumulator register)."""
    nf = model.nfma
    length = a.shape[-1]
    outputs = max(1, acc.numel())
    kc = max(nf, (TILE_ELEMS // outputs) // nf * nf)
    for k0 in range(0, length, kc):
        k1 = min(length, k0 + kc)
        nb = (k1 - k0) // nf
        a4 = a[..., k0:k1].unflatten(-1, (nb, nf)).unsqueeze(-3)  # [..., M, 1, nb, nf]
        b4 = b[..., k0:k1].unflatten(-1, (nb, nf)).unsqueeze(-4)  # [..., 1, N, nb, nf]
        p = a4 * b4
        ep = ea[..., k0:k1].unflatten(-1, (nb, nf)).unsqueeze(-3) + eb[..., k0:k1].unflatten(-1, (nb, nf)).unsqueeze(-4)
        epmax = ep.amax(-1).to(torch.int64)  # a zero operand's exponent is _ZERO_EXP: never the maximum
        for j in range(nb):
            acc = _block(p[..., j, :], epmax[..., j], acc, model)
            if fp16:
                acc = acc.to(torch.float16).to(torch.float64)
    return acc


def _blocks(x: torch.Tensor, k0: int, k1: int, nf: int, at: int) -> torch.Tensor:
    """x[..., k0:k1] cut into blocks of nf, block index first: [nb, ..., M, 1, nf] (at -2) or [nb, ..., 1, N, nf]."""
    return x[..., k0:k1].unflatten(-1, (-1, nf)).movedim(-2, 0).unsqueeze(at)


def _chain_fast(a, ea, b, eb, acc: torch.Tensor, model: MMAModel, fp16: bool = False) -> torch.Tensor:
    """_chain for narrow products (a, b float32) and an accumulator acc (float32) whose nonzero values are at
    least 2^-100, on float32 bit patterns: every product and every accumulator value is then a multiple of
    2^(-29 - frac) at least, so 2^(E - frac) is a normal float32 built from exponent bits (E floored at
    -29 - frac, below which every term is zero) and the truncation to frac_out bits is a mask. Block sums are
    exact in float32 for early c with frac <= 13 (< 2^24), else taken in float64."""
    nf, frac = model.nfma, model.frac
    length = a.shape[-1]
    kc = max(nf, (TILE_ELEMS // max(1, acc.numel())) // nf * nf)
    floor = max(model.min_exp, -29 - frac)
    f32_sums = not model.late_c and frac <= 13 and nf <= 64
    mask32 = ~((1 << (23 - model.frac_out)) - 1)
    mask64 = ~((1 << (52 - model.frac_out)) - 1)
    for k0 in range(0, length, kc):
        k1 = min(length, k0 + kc)
        nb = (k1 - k0) // nf

        p = _blocks(a, k0, k1, nf, -2) * _blocks(b, k0, k1, nf, -3)  # [nb, ..., M, N, nf], exact
        e = (_blocks(ea, k0, k1, nf, -2) + _blocks(eb, k0, k1, nf, -3)).amax(-1).to(torch.int32)
        eps = (e.clamp_min(floor) - frac + 127) << 23  # bits of 2^(E_products - frac)
        for j in range(nb):
            if model.late_c:
                scale = eps[j].view(torch.float32)
            else:  # 2^(E - frac), E the larger of the products' and c's (c = +0: a negative int, never the max)
                scale = torch.maximum(eps[j], (acc.view(torch.int32) & 0x7F800000) - (frac << 23)).view(torch.float32)
            t = p[j].div_(scale.unsqueeze(-1), rounding_mode="trunc")  # in place: block j is used once
            if f32_sums:
                d = t.sum(-1) + torch.div(acc, scale, rounding_mode="trunc")
                d = ((d * scale).view(torch.int32) & mask32).view(torch.float32)
            else:
                s = t.sum(-1, dtype=torch.float64)
                if not model.late_c:
                    s = s + torch.div(acc.to(torch.float64), scale.to(torch.float64), rounding_mode="trunc")
                d = ((s * scale).view(torch.int64) & mask64).view(torch.float64).to(torch.float32)
            acc = d + acc if model.late_c else d + 0.0  # late c: an fp32 round-to-nearest addition; +0 for zero
            if fp16:
                acc = acc.to(torch.float16).to(torch.float32)
    return acc


def _checked_formats(a: torch.Tensor, b: torch.Tensor, fmt, acc: str, promote_every: int | None) -> tuple[str, str]:
    """mma_matmul's argument checks (ValueError naming the value); the operand formats of a and b."""
    if acc not in ("fp32", "fp16"):
        raise ValueError(f"acc={acc!r}: expected fp32 or fp16 (the MMA's accumulator register)")
    if promote_every is not None and promote_every < 1:
        raise ValueError(f"promote_every={promote_every!r} must be a positive number of k or None")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a [..., M, K] and b [..., K, N] disagree on K: {tuple(a.shape)} and {tuple(b.shape)}")
    return _formats(fmt)


def mma_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    model: MMAModel,
    *,
    c: torch.Tensor | None = None,
    promote_every: int | None = None,
    fmt: str | tuple[str, str] = "e4m3",
    acc: str = "fp32",
) -> torch.Tensor:
    """a @ b as the tensor core computes it: a [..., M, K], b [..., K, N] (batch dims broadcast) holding values
    exact in the operand format `fmt` (e4m3, e5m2, e2m1, e2m3, e3m2, e2m1s: e2m1 x e4m3 block-scaled values; a
    pair for a and b apart) as float tensors, scales NOT applied (the kernels multiply their descales into the
    fp32 result); "fp32" takes dequantised values as they are (exponents unclamped down to -126: an
    approximation, no hardware oracle). c [..., M, N]: the accumulator the MMA starts from (fp32 values; one
    level: the chain's first c; two levels: the fp32 outer sum's start). promote_every=N: every N k (N a
    multiple of nfma for the hardware's behaviour) the chain's result is added to an fp32 accumulator with
    round-to-nearest and the chain restarts from +0. Inputs finite.
    acc "fp16": the MMA's accumulator register is fp16 (mma.sync ... .f16.e4m3.e4m3.f16, SageAttention2++'s
    "fp32+fp16"): each block result, formed as above, is rounded to the nearest fp16 (no oracle models this
    unit; an assumption, stated). Returns the fp32 accumulator [..., M, N] (fp16 values with acc "fp16").
    The chain runs in C (kernels.native.mma) where it built and passed its self-test, else in torch: same bits."""
    fmts = _checked_formats(a, b, fmt, acc, promote_every)
    return _matmul(a, b, model, c, promote_every, fmts, acc == "fp16", native_library())


def mma_into(a: torch.Tensor, b: torch.Tensor, model: MMAModel, acc: torch.Tensor, *, fmt) -> bool:
    """acc [..., M, N] (float32, contiguous, holding no -0: the value mma_matmul's start makes of a c) continued
    in place over a [..., M, K] @ b [..., K, N] as mma_matmul(a, b, model, c=acc, fmt=fmt) computes it (one level,
    fp32 register), without its copies: True when done, False (acc untouched) where the chain would not run in C
    on float32 here (the caller then runs mma_matmul)."""
    lib = native_library()
    if lib is None or a.device.type != "cpu" or acc.dtype != torch.float32 or not acc.is_contiguous():
        return False
    from flashcheck.kernels.native.mma import chain, work_dtype

    fmts = _checked_formats(a, b, fmt, "fp32", None)
    batch = batch_shape(a, b)
    if work_dtype(model, fmts) != torch.float32 or acc.shape != (*batch, a.shape[-2], b.shape[-1]):
        return False
    if a.shape[-1]:
        chain(lib, a, b, acc, model, fmts, (EMIN[fmts[0]], EMIN[fmts[1]]), False)
    return True


def _matmul(a, b, model: MMAModel, c, promote_every: int | None, fmts: tuple[str, str], fp16: bool, lib):
    """mma_matmul with its arguments checked; lib: kernels.native.mma's library, or None for the torch chain."""
    k = a.shape[-1]
    batch = batch_shape(a, b)
    native = lib is not None and a.device.type == "cpu"
    start = _start(c, (*batch, a.shape[-2], b.shape[-1]), model, fmts, fp16, native, a.device)
    if native:
        segment = _native_segments(a, b, model, fmts, fp16, lib)
    else:
        segment, start = _torch_segments(a, b, batch, model, fmts, fp16, start)
    if promote_every is None and native and k > 0:  # one segment, the whole of k (the loop below, without its slicing)
        return segment(0, k, start).to(torch.float32)
    seg = promote_every or max(k, 1)
    run, outer = start, start.to(torch.float32)
    for s0 in range(0, k, seg):
        s1 = min(k, s0 + seg)
        if promote_every is None:
            run = segment(s0, s1, run)
        else:  # the chain from +0, its result added to the fp32 accumulator
            outer = outer + segment(s0, s1, torch.zeros_like(start)).to(torch.float32)
    return run.to(torch.float32) if promote_every is None else outer


def _start(c, shape: tuple[int, ...], model: MMAModel, fmts, fp16: bool, native: bool, device) -> torch.Tensor:
    """The chain's first accumulator [shape]: c's fp32 values (fp16 ones with an fp16 register) or +0, in float64
    (the torch chain) or in kernels.native.mma's working dtype."""
    dtype = torch.float64
    if native:
        from flashcheck.kernels.native.mma import work_dtype

        dtype = work_dtype(model, fmts)
    if c is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    if c.dtype == torch.float32 == dtype and c.shape == shape and not fp16:
        return c + 0.0  # as below, in one op
    start = c.to(torch.float32).expand(shape).to(dtype) + 0.0  # a new tensor; -0 + 0: a zero c is +0
    return start.to(torch.float16).to(dtype) if fp16 else start


def _native_segments(a, b, model: MMAModel, fmts: tuple[str, str], fp16: bool, lib):
    """The chain over k in s0:s1 from acc (updated in place), by kernels.native.mma (ragged last blocks as zero
    padded ones)."""
    from flashcheck.kernels.native.mma import chain

    emins = (EMIN[fmts[0]], EMIN[fmts[1]])

    def segment(s0: int, s1: int, acc: torch.Tensor) -> torch.Tensor:
        if s0 == 0 and s1 == a.shape[-1]:  # the whole of k: no slicing
            return chain(lib, a, b, acc, model, fmts, emins, fp16)
        return chain(lib, a[..., s0:s1], b[..., s0:s1, :], acc, model, fmts, emins, fp16)

    return segment


def _torch_segments(a, b, batch, model: MMAModel, fmts: tuple[str, str], fp16: bool, start: torch.Tensor):
    """(the chain over k in s0:s1 from acc in torch, the start as that chain holds it): whole blocks (the last
    one zero padded), float32 where the products are narrow and c has no value below 2^-100 (_chain_fast)."""
    fa, fb = fmts
    k, nf = a.shape[-1], model.nfma
    # products of two narrow values have at most 12 significant bits within 2^-32 .. 2^34: exact in float32
    work = torch.float64 if "fp32" in (fa, fb) else torch.float32
    a64 = a.to(work).expand(*batch, *a.shape[-2:])
    bt64 = b.to(work).transpose(-1, -2).expand(*batch, b.shape[-1], k)  # [..., N, K]
    # _chain_fast floors the products' E at 2^(-29 - frac): a block without a product would align a smaller c
    # to that floor, not to its own exponent (c then comes out 0); such a c takes the float64 chain
    tiny = start.abs()
    low = 2.0 ** max(model.min_exp, -29 - model.frac)
    fast = work == torch.float32 and not bool(((tiny > 0) & (tiny < low)).any())
    chain = _chain_fast if fast else _chain

    def segment(s0: int, s1: int, acc: torch.Tensor) -> torch.Tensor:
        pad = (-(s1 - s0)) % nf  # zero padding to whole blocks (zero products change nothing)
        aa, bb = a64[..., s0:s1], bt64[..., s0:s1]
        if pad:
            aa, bb = torch.nn.functional.pad(aa, (0, pad)), torch.nn.functional.pad(bb, (0, pad))
        return chain(aa, _exponents(aa, EMIN[fa]), bb, _exponents(bb, EMIN[fb]), acc, model, fp16)

    return segment, start.to(torch.float32) if fast else start


def _selftest_cases():
    """(name, a, b, c, model, promote_every, fmts, fp16) exercising every rule of the chain on small shapes."""
    from flashcheck.kernels.native.mma import operands

    e4 = ("e4m3", "e4m3")
    cases = [
        ("hopper", HOPPER, None, e4, False, 0.0), ("hopper+c", HOPPER, None, e4, False, 1.0),
        ("ada fp16 promoted", ADA, 64, ("e2m1", "e2m3"), True, 1.0), ("ada fp16 overflow", ADA, None, e4, True, 1.0),
        ("b200 late c", B200, None, e4, False, 1.0), ("b200 promoted", B200, 64, ("e5m2", "e4m3"), False, 0.0),
        ("ada e2m1", ADA, None, ("e2m1", "e3m2"), False, 1.0), ("hopper small c", HOPPER, None, e4, False, 2.0**-70),
        ("hopper fp32 operands", HOPPER, None, ("fp32", "e4m3"), False, 1.0),
        ("b200 e2m1s", B200, None, ("e2m1s",) * 2, False, 1.0), ("ada e2m1s", ADA, 64, ("e4m3", "e2m1s"), True, 1.0),
        ("b200 fp32", B200, 96, ("fp32",) * 2, False, 1.0), ("ada fp32 fp16", ADA, None, ("fp32", "e2m3"), True, 1.0),
    ]  # fmt: skip
    for i, (name, model, promote, fmts, fp16, c_on) in enumerate(cases):
        a = operands(fmts[0], (2, 5, 200), 3 * i)
        b = operands(fmts[1], (2, 200, 36), 3 * i + 1)
        a[0, 1], b[1, :40] = 0.0, 0.0  # a zero row; blocks of zero products
        if model.late_c and fmts[0] in ("e4m3", "e2m1s"):  # 1.875^2 2^25 terms of one sign: an int32 overflow
            a[0, 2], b[0, :, 1] = 15.0, 0.46875
        c = operands("fp32", (2, 5, 36), 3 * i + 2) * c_on
        c[0, 0, :4] = torch.tensor([2.0**-60, -(2.0**-140), 1e30, -3.0])  # c alone in a block: tiny, subnormal
        yield name, a, b, c.to(torch.float32), model, promote, fmts, fp16


@functools.cache
def _native() -> tuple[object | None, str]:
    """(kernels.native.mma's library, "") once it built and matched the torch chain bit for bit on
    _selftest_cases (both entry points exercised: cbuild.proven), else (None, why not)."""
    from flashcheck.kernels.native import cbuild
    from flashcheck.kernels.native.mma import load

    lib, why = load()
    if lib is None:
        return None, why
    why = cbuild.proven("mma", lib, _self_test, "the torch chain runs")
    return (None, why) if why else (lib, "")


def _self_test(lib) -> str:
    """ "" when the C chain gives the torch chain's bits on every _selftest_cases case, else which differs."""
    for name, a, b, c, model, promote, fmts, fp16 in _selftest_cases():
        want = _matmul(a, b, model, c, promote, fmts, fp16, None)
        got = _matmul(a, b, model, c, promote, fmts, fp16, lib)
        if not torch.equal(want.view(torch.int32), got.view(torch.int32)):
            return f"the C MMA chain differs from the torch chain here (case {name!r})"
    return ""


def native_library():
    """kernels.native.mma's self-tested library, or None (mma_matmul then runs its torch chain)."""
    return _native()[0]


def native_status() -> dict:
    """{"available": bool, "reason": str}: whether mma_matmul runs in C here, for `flashcheck doctor`."""
    lib, why = _native()
    return {"available": lib is not None, "reason": why}
