"""The flash kernel's FP8/FP4 MMAs through kernels.tensorcore.mma (policy knobs qk_mma, pv_mma): the simulators hold
dequantised operands (codes times scales); a tensor core multiplies the codes and the kernel applies the scales
afterwards, so each operand is split back into its codes and its per-row (Q, K) or per-column (V) scale.

Shapes: q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv]; an MMA of a [..., M, K] @ b [..., K, N]. An operand
whose scales are not constant along the product's reduction dim (MX blocks, per-thread groups), or that does not
split exactly, takes the model with its dequantised values ("fp32" operands: kernels.tensorcore.mma says how).

NVFP4 inputs (the quantiser's pieces, core.quant.nvfp4_parts) enter as a block-scaled MMA takes them: the
block-scaled values e2m1 x e4m3 scale in the chain, the fp32 tensor descale multiplied into its fp32 result
afterwards with the other descales. PTX ISA, "Block Scaling for mma.sync" (9.7.14.3): D = (A * scale_A) *
(B * scale_B) + C, kind::mxf4nvf4 with .e2m1 elements and .ue4m3 scales at scale_vec::4X (16-element blocks), the
same for tcgen05.mma; torchao 0.18.0 prototype/mx_formats/nvfp4_tensor.py _addmm_nvfp4_dispatch runs
torch._scaled_mm on the codes and block scales and multiplies its result by a_scale * b_scale, the per-tensor
scales. The block-scaled values go in with their own exponents (a model of how the hardware aligns scaled
products, no oracle has measured it) as float32 "e2m1s" operands (kernels.tensorcore.mma.EMIN: no exponent of theirs is
clamped, so the bits are the "fp32" operands'), which kernels/native/c/mma.c's f32 variant takes directly;
SageAttention3's
Q, K and P, e2m1 x e4m3 values too, alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashcheck.core.numerics import FP8_FORMATS, Format, Policy, info, round_to, widen_fp8
from flashcheck.kernels.formats.e2m1s import fits_e2m1s
from flashcheck.kernels.formats.sage3 import DeltaS, sage3_fp4_part
from flashcheck.kernels.native.fp8 import abs_max, block_amax
from flashcheck.kernels.native.fp8 import codes as fp8_codes
from flashcheck.kernels.native.fp8 import split_codes as fp8_split
from flashcheck.kernels.native.presets import UNIT_DIV, UNIT_MUL, e2m1s, pv_start, rescale, units
from flashcheck.kernels.native.presets import descale as descale_into
from flashcheck.kernels.sim.quantized import uses_quantized_inputs
from flashcheck.kernels.tensorcore.mma import MMA_MODELS, MMAModel, mma_into, mma_matmul

OPERAND_FORMATS = {Format.FP8_E4M3: "e4m3", Format.FP8_E5M2: "e5m2", Format.FP4_E2M1: "e2m1",
                   Format.FP6_E2M3: "e2m3", Format.FP6_E3M2: "e3m2"}  # fmt: skip
SPLIT_TOLERANCE = 2.0**-20  # codes * scale must give the held value to fp32's rounding of the dequantised value


@dataclass(frozen=True, slots=True)
class Operand:
    """values = codes * scale: codes (float32 holding values exact in `fmt`, or the values themselves in float64
    with fmt "fp32"), scale float64 broadcasting against codes (ones for "fp32")."""

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: str

    def rows(self, r0: int, r1: int | None = None) -> Operand:
        """The operand's rows r0:r1 (dim -2), scale sliced alike where it varies by row."""
        sc = self.scale[..., r0:r1, :] if self.scale.shape[-2] > 1 else self.scale
        return Operand(self.codes[..., r0:r1, :], sc, self.fmt)


def _values(x: torch.Tensor) -> Operand:
    return Operand(x.to(torch.float64), torch.ones((1,) * x.dim(), dtype=torch.float64, device=x.device), "fp32")


def _fp4_scaled(x: torch.Tensor, check: bool = True) -> Operand:
    """x holding block-scaled FP4 values e2m1 x e4m3 (or 0) as an "e2m1s" operand: float32 (exact), scale 1.
    check: that every value is one kernels.tensorcore.mma's "e2m1s" takes (exact in float32, at most 6 significant bits,
    a significand of at most 1.875, 0 or |x| in [2^-10, 2^12)), else the "fp32" operand (the same bits,
    slower); unchecked: P (sage3_p's)."""
    fast = e2m1s(x) if check else None  # one C pass (kernels.native.presets), or None
    if fast is not None and not fast[0]:
        return _values(x)
    x32 = x.to(torch.float32) if fast is None else fast[1]
    if check and fast is None and not fits_e2m1s(x, x32):
        return _values(x)
    return Operand(x32, torch.ones((1,) * x.dim(), dtype=torch.float64, device=x.device), "e2m1s")


def split(x: torch.Tensor, fmt: Format, groups: str, *, rows: int = 0, top: float = 0.0, exact: bool = True) -> Operand:
    """x [B, H, L, D] as codes of fmt times one scale per group: "tensor" (one scale), "rows" (blocks of `rows`
    rows, all columns), "columns" (one per column over the rows). `top`: the code each group's amax maps to
    (0: fmt's max). The dequantised "fp32" operand when fmt has no codes here or the split is not exact;
    exact=False: x not yet quantised, its codes are x / scale rounded to fmt (the error model's view)."""
    name = OPERAND_FORMATS.get(fmt)
    if name is None or groups not in ("tensor", "rows", "columns"):
        return _values(x)
    if exact and x.dtype in (torch.float32, torch.float64) and x.is_contiguous() and x.numel():
        fast = _split_fast(x, fmt, groups, rows, top, name)
        if fast is not None:
            return fast
    x64 = x.to(torch.float64)
    a = x64.abs()
    if groups == "tensor":
        amax = a.amax().reshape((1,) * x.dim())
    elif groups == "columns":
        amax = a.amax(dim=-2, keepdim=True)
    else:
        n = x.shape[-2]
        blk = max(1, min(rows, n))
        pad = (-n) % blk
        ap = torch.nn.functional.pad(a, (0, 0, 0, pad)) if pad else a
        per = ap.unflatten(-2, (-1, blk)).amax(dim=(-2, -1), keepdim=True)  # [B, H, nblk, 1, 1]
        amax = per.expand(*per.shape[:-2], blk, 1).flatten(-3, -2)[..., :n, :]
    scale = torch.where(amax > 0, amax / (top or info(fmt).max), torch.ones_like(amax))
    codes = _codes(x64, fmt, scale) if exact else round_to(x64 / scale, fmt)  # _codes is round_to's only near a code
    if exact:  # in place: the same values as (codes * scale - x64).abs() <= SPLIT_TOLERANCE * a
        err = codes.mul(scale).sub_(x64).abs_()
        if not bool(err.le_(a.mul_(SPLIT_TOLERANCE)).all()):
            return _values(x)
    return Operand(codes.to(torch.float32), scale, name)  # narrow codes: exact in float32, the MMA's operand dtype


def _split_fast(x: torch.Tensor, fmt: Format, groups: str, rows: int, top: float, name: str) -> Operand | None:
    """split's exact case for an FP8 format by kernels.native.fp8 (x [B, H, L, D] float32 or float64, contiguous):
    the same amax (by views, no float64 copy of x: a maximum of float32 values is exact in float64), the same
    scale tensor, and the codes and the tolerance check in one C pass; None where that pass does not apply."""
    if groups == "tensor":
        amax = abs_max(x).to(torch.float64).reshape((1,) * x.dim())
    elif groups == "columns":
        amax = abs_max(x, -2).to(torch.float64)
    else:
        n = x.shape[-2]
        blk = max(1, min(rows, n))
        per = block_amax(x, blk).to(torch.float64)  # [B, H, nblk, 1, 1], as split's padded amax
        amax = per.expand(*per.shape[:-2], blk, 1).flatten(-3, -2)[..., :n, :]
    scale = torch.where(amax > 0, amax / (top or info(fmt).max), torch.ones_like(amax))
    ok, codes = fp8_split(x, fmt, scale, SPLIT_TOLERANCE)
    if codes is None:
        return _values(x) if not ok else None
    return Operand(codes, scale, name)


def _codes(x: torch.Tensor, fmt: Format, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to fmt's nearest values: FP8 in one C pass (kernels.native.fp8: round_to's bits) or by
    torch's cast (many times faster than round_to). Where x / scale lies within SPLIT_TOLERANCE of a code, the only
    case split keeps, every one of them gives that code (a double rounding through float32, or a clamp at the
    format's max, cannot move a value that near a code off it), so the split's outcome is round_to's."""
    fast = {Format.FP8_E4M3: torch.float8_e4m3fn, Format.FP8_E5M2: torch.float8_e5m2}.get(fmt)
    if fast is None:
        return round_to(x / scale, fmt)
    native = fp8_codes(x, fmt, scale)
    return widen_fp8((x / scale).to(fast), torch.float64) if native is None else native


def _input_groups(pol: Policy, role: str, block: int) -> tuple[Format, str, int, float]:
    """(format, groups, rows, top) of Q, K or V as kernels.sim.fp8 / kernels.sim.quantized scale them."""
    if not uses_quantized_inputs(pol):
        fmt = pol.input
        if fmt not in FP8_FORMATS:
            return fmt, "", 0, 0.0
        return (fmt, "rows", block, 0.0) if pol.fp8_scaling == "block" else (fmt, "tensor", 0, 0.0)
    if role == "v":
        fmt, scaling = pol.v_format or pol.input, pol.v_scaling
        if scaling == "channel":
            return fmt, "columns", 0, pol.v_scale_max
    else:
        fmt, scaling = pol.input, pol.qk_scaling
        if pol.smooth_q and role == "q":
            return fmt, "", 0, 0.0  # the query block mean is added back in fp32: not codes times a scale
    if scaling in ("", "tensor"):
        return fmt, "tensor", 0, 0.0
    if scaling == "block":
        return fmt, "rows", block, 0.0
    if scaling == "token":
        return fmt, "rows", 1, 0.0
    return fmt, "", 0, 0.0  # mx, nvfp4, per-thread: scales vary along D (or in interleaved groups)


@dataclass(frozen=True, slots=True)
class MMAOperands:
    """The flash forward's operands split for its tensor-core models (None where the policy has no model)."""

    model_qk: MMAModel | None
    model_pv: MMAModel | None
    q: Operand | None
    k: Operand | None
    v: Operand | None
    qk_start: DeltaS | None = None  # the Q K^T MMA's initial C by tile (SageAttention3's delta_s), else +0
    # v_block's operands by key block, formed once per forward (every query tile asks for the same key blocks)
    v_blocks: dict = field(init=False, default_factory=dict, compare=False, repr=False)

    @staticmethod
    def make(q, k, v, pol: Policy, block_q: int, block_k: int, parts: dict | None = None) -> MMAOperands | None:
        """The split operands of q, k, v (as round_inputs returned them) for pol.qk_mma / pol.pv_mma; None
        when neither is set or their stages are FP64. parts: round_inputs' NVFP4 pieces by role ("q", "k",
        "v"), which give those operands as block-scaled values times the tensor descale."""
        qk = MMA_MODELS[pol.qk_mma] if pol.qk_mma and pol.score != Format.FP64 else None
        pv = MMA_MODELS[pol.pv_mma] if pol.pv_mma and pol.accum != Format.FP64 else None
        if qk is None and pv is None:
            return None
        qo = ko = vo = None
        got = parts or {}
        if qk is not None and pol.exact_inputs != "qk":
            qo, ko = _split_input(q, pol, "q", block_q, got), _split_input(k, pol, "k", block_k, got)
        if pv is not None:
            vo = _values(v) if pol.exact_inputs == "v" else _split_input(v, pol, "v", block_k, got)
        start = DeltaS.make(q, k, pol.source_format or Format.BF16) if _sage3_qk(pol) and qo is not None else None
        return MMAOperands(qk if qo is not None else None, pv, qo, ko, vo, start)

    def qk_c(self, r0: int, r1: int, c0: int, c1: int) -> StartC | None:
        """The Q K^T MMA's initial C for query rows r0:r1 and keys c0:c1 (in the MMA's units, formed where
        qk_scores uses it: StartC), or None."""
        return None if self.qk_start is None else StartC(self.qk_start, r0, r1, c0, c1)

    def v_block(self, c0: int, c1: int) -> Operand:
        """V's rows c0:c1 with one scale per column (a per-row-block scale that changes inside the key block
        gives the dequantised values)."""
        got = self.v_blocks.get((c0, c1))
        if got is None:
            got = self.v_blocks[c0, c1] = self._v_block(c0, c1)  # a race only computes it twice, alike
        return got

    def _v_block(self, c0: int, c1: int) -> Operand:
        blk = self.v.rows(c0, c1)
        sc = blk.scale
        if sc.shape[-2] > 1:
            if not bool((sc == sc[..., :1, :]).all()):
                return _values(blk.codes * sc)
            blk = Operand(blk.codes, sc[..., :1, :], blk.fmt)
        return blk


@dataclass(frozen=True, slots=True)
class StartC:
    """A step's initial C of the Q K^T MMA (SageAttention3's delta_s, rows r0:r1, keys c0:c1): written straight
    into the score block (into) or formed as a tensor (tensor, float32 [B, H, r1 - r0, c1 - c0])."""

    delta: DeltaS
    r0: int
    r1: int
    c0: int
    c1: int

    def tensor(self) -> torch.Tensor:
        return self.delta.block(self.r0, self.r1, self.c0, self.c1)

    def into(self, out: torch.Tensor) -> torch.Tensor:
        """out = tensor() + 0 (a -0 made +0, the MMA's start), returned."""
        return self.delta.start_into(out, self.r0, self.r1, self.c0, self.c1)


def _sage3_qk(pol: Policy) -> bool:
    """SageAttention3's Q and K (kernels.formats.sage3 rule 2): their FP4 columns, delta_s the MMA's initial C. Only
    where
    kernels.sim.quantized.quantize_inputs made sage3_inputs' 2 D columns: with the input stage FP64 the knob is inert
    (core.numerics) and q, k are the plain inputs."""
    return pol.qk_scaling == "sage3" and pol.input != Format.FP64


def _split_input(x: torch.Tensor, pol: Policy, role: str, block: int, parts=None, exact: bool = True) -> Operand:
    if parts and role in parts:
        return block_scaled(parts[role])
    if role != "v" and _sage3_qk(pol):  # e2m1 x e4m3 values (scales vary along D): kernels.tensorcore.mma's f32 tile
        return _fp4_scaled(sage3_fp4_part(x))
    if role == "v" and exact and (_sage3_qk(pol) or pol.v_scaling == "sage3"):  # FP4 x16 along the tokens
        return _fp4_scaled(x)
    fmt, groups, rows, top = _input_groups(pol, role, block)
    return split(x, fmt, groups, rows=rows, top=top, exact=exact)


def block_scaled(pieces) -> Operand:
    """NVFP4 pieces (core.quant.NVFP4Parts) as the block-scaled MMA's operand: the block-scaled values e2m1 x
    e4m3 scale [B, H, L, D] (float32, exact; the block scale saturates at 448) as "e2m1s" codes, the fp32 tensor
    descale as the scale."""
    w, descale = pieces.scaled, pieces.descale
    scale = descale.to(torch.float64).reshape((1,) * w.dim()) if descale.numel() == 1 else descale.to(torch.float64)
    op = _fp4_scaled(w)
    return Operand(op.codes, scale, op.fmt)


def v_codes(v: torch.Tensor, pol: Policy, block_k: int) -> Operand:
    """V [B, H, Lk, Dv] (unquantised) as the P·V MMA would take it under pol: its codes and scales (the
    dequantised "fp32" operand where its scales vary along the keys inside a group the MMA cannot split)."""
    return _split_input(v, pol, "v", block_k, exact=False)


def qk_scores(
    q: Operand,
    k: Operand,
    model: MMAModel,
    factor: float,
    out: torch.Tensor | None = None,
    c: torch.Tensor | StartC | None = None,
) -> torch.Tensor:
    """factor * Q K^T [..., Mq, Mk] (float32: one rounding of the descaled product): the MMA of the codes, then
    the fp32 multiply by factor * q_scale * k_scale the kernel's softmax applies. out (float32 [..., Mq, Mk]):
    written and returned (the descale in one C pass, kernels.native.presets, where it applies). c (float32
    [..., Mq, Mk], in the MMA's units, or a StartC): the accumulator the MMA starts from (None: +0)."""
    k_scale = k.scale.transpose(-1, -2)
    fmts = (q.fmt, k.fmt)
    lazy = c if isinstance(c, StartC) else None
    if out is None:
        start = None
    elif lazy is not None:
        start = lazy.into(out)  # delta_s's rows copied in, +0 for a zero as below
    else:
        start = out.zero_() if c is None else out.copy_(c).add_(0.0)  # -0 + 0: +0
    if start is not None and mma_into(q.codes, k.codes.transpose(-1, -2), model, start, fmt=fmts):
        if descale_into(out, q.scale, k_scale, factor, out) is None:  # the product descaled where it lies
            out.copy_(out.to(torch.float64).mul_((q.scale * factor) * k_scale))
        return out
    c = lazy.tensor() if lazy is not None else c
    acc = mma_matmul(q.codes, k.codes.transpose(-1, -2), model, c=c, fmt=fmts)
    if out is not None and descale_into(acc, q.scale, k_scale, factor, out) is not None:
        return out
    scores = acc.to(torch.float64).mul_((q.scale * factor) * k_scale).to(torch.float32)
    return scores if out is None else out.copy_(scores)


def p_operand(pc: torch.Tensor, pol: Policy) -> Operand:
    """P as the P·V MMA takes it: quantize_p's values (P x p_scale in pol.p: codes; SageAttention3's e2m1 x e4m3
    values, kernels.formats.sage3.sage3_p, as "e2m1s"), or with NVFP4 P its dequantised values."""
    name = OPERAND_FORMATS.get(pol.p)
    if pol.p_scaling == "sage3":
        return _fp4_scaled(pc, check=False)  # e2m1 x e4m3 by construction (kernels.formats.sage3 rule 4)
    if pol.p_scaling or name is None:
        return _values(pc)
    return Operand(pc.to(torch.float32), torch.ones((1,) * pc.dim(), dtype=torch.float64, device=pc.device), name)


def held_v_scale(ops: MMAOperands | None, pol: Policy, work: torch.dtype) -> torch.Tensor | None:
    """V's descale [.., 1, 1] (float64) where the flash forward keeps O in the P·V MMA's units for the whole key
    loop, as FA3 and FA4 hold their fp32 accumulator: the MMA accumulates into O (one level, an fp32 register,
    float32 work), V has codes and one scale per head (FA3's and FA4's v_descale; fa4-fp4's NVFP4 V with its
    tensor descale and sage3-fp4's FP4 V, block-scaled "e2m1s" values, qualify too), applied once at the end (see
    kernels.sim.flash). None where O is converted at every key block instead (V scaled per key block or column,
    dequantised V, two-level accumulation, an fp16 register)."""
    if ops is None or ops.model_pv is None or ops.v is None or ops.v.fmt == "fp32" or pol.acc_promote:
        return None
    if (pol.acc_nearest and pol.acc_bits == 10) or work != torch.float32 or info(pol.stage("accum")).dtype != work:
        return None
    sc = ops.v.scale
    return sc if sc.dim() >= 2 and sc.shape[-1] == 1 and sc.shape[-2] == 1 else None


def pv_accumulate(
    p: Operand,
    v: Operand,
    o: torch.Tensor,
    p_scale: float,
    pol: Policy,
    model: MMAModel,
    alpha=None,
    buf=None,
    held: bool = False,
) -> None:
    """o = o * alpha + P V / p_scale (o [..., M, Dv], updated in place; alpha [..., M, 1] of o's dtype, the
    step's rescale, a float32 product, or None): the MMA of P's and V's codes with V's per-column scale after
    it. One level (no acc_promote): the MMA accumulates into O (FA3, FA4), o converted to the MMA's units and
    back (with buf, a float32 tensor of o's shape, in C without copies: the rescale folded into the conversion);
    two levels: the block's product from +0, promoted every acc_promote keys (Sage). held (see held_v_scale):
    o is already in MMA units (float32), rescaled in place by alpha (FA3's and FA4's rescale of the fp32
    accumulator) and continued by the MMA, no conversion; V's scale and p_scale are applied once at the end."""
    acc = "fp16" if pol.acc_nearest and pol.acc_bits == 10 else "fp32"
    fmts = (p.fmt, v.fmt)
    if held:
        if rescale(o, alpha) is None:  # one C pass (kernels.native.presets) where it applies, else torch's two
            if alpha is not None:
                o.mul_(alpha)
            o.add_(0.0)  # the MMA's start: a zero c is +0 (kernels.tensorcore.mma)
        if not mma_into(p.codes, v.codes, model, o, fmt=fmts):
            o.copy_(mma_matmul(p.codes, v.codes, model, c=o, fmt=fmts, acc=acc))
        return
    unit = v.scale / p_scale  # [..., 1 or M, Dv]: value of one MMA unit
    if alpha is not None and buf is not None and not pol.acc_promote and acc == "fp32" and "fp32" not in fmts:
        c = pv_start(o, alpha, unit, buf)
        if c is not None and mma_into(p.codes, v.codes, model, c, fmt=fmts):
            if units(c, unit, o, UNIT_MUL) is None:
                o.copy_(c.to(torch.float64).mul_(unit))
            return
    if pol.acc_promote:
        part = mma_matmul(p.codes, v.codes, model, promote_every=pol.acc_promote, fmt=fmts, acc=acc)
        if rescale(o, alpha, part, unit) is None:  # one C pass (kernels.native.presets) where it applies
            if alpha is not None:
                o.mul_(alpha)
            o.add_(part.to(torch.float64).mul_(unit).to(o.dtype))
        return
    if alpha is not None:
        o.mul_(alpha)
    c = units(o, unit, torch.empty(o.shape, dtype=torch.float32, device=o.device), UNIT_DIV)
    if c is None:
        c = o.to(torch.float64, copy=True).div_(unit).to(torch.float32)  # a copy: o may be float64
    out = mma_matmul(p.codes, v.codes, model, c=c, fmt=fmts, acc=acc)
    if units(out, unit, o, UNIT_MUL) is None:
        o.copy_(out.to(torch.float64).mul_(unit))  # copy_ rounds float64 to o's dtype as .to does
