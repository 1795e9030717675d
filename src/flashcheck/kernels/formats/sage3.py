"""SageAttention3's FP4 quantisation as its Blackwell kernel does it (thu-ml/SageAttention at commit
d1a57a546c3d395b1ffcbeecc66d81db76f3b4b5, sageattention3_blackwell/): the input preprocessing of sageattn3/api.py,
the single-level 1x16 FP4 quantiser of sageattn3/quantization/fp4_quantization_4d.cu, and P's quantisation of
sageattn3/blackwell/softmax_fused.h with mainloop_tma_ws.h. Each rule below is read off those files:

1. The inputs arrive in a 16-bit dtype (`half`). K is smoothed in that dtype: km = rnd(mean_tokens(K)),
   Ks = rnd(K - km) (api.py preprocess_qkv, `k -= k.mean(dim=-2, keepdim=True)`); softmax cancels km.
2. Q's per-128-row-block mean (triton_group_mean, GROUP_SIZE 128, over L padded with zero rows to a multiple
   of 128, so a ragged last block divides by 128): qm in float32, stored rounded to `half`; Qs = rnd(Q - qm).
   api.py preprocess_qkv forms delta_s = torch.matmul(qm, Ks^T).to(float32) [B, H, L / 128, Lk], a 16-bit
   matmul: here the exact products summed in float64 (exact unless their magnitudes span over about 2^23),
   rounded once to `half` and widened. The mainloop's add_delta_s writes delta_s into the score accumulator
   tSrS (stride 0 over the 128 rows, SmemLayoutAtomDS) before the Q K^T MMA runs over the FP4 k_blocks into
   it: delta_s is the MMA's initial C. sage3_inputs returns the concatenations [Qs', qm] and [Ks', Ks] along
   D (2 D columns; the callers fix the softmax scale from the original D); the MMA model (kernels.sim.mma_ops)
   splits them back (sage3_fp4_part, DeltaS) and runs the chain over the D FP4 columns (values e2m1 * e4m3)
   from c = delta_s. Paths without a tensor-core model take the product of the concatenations,
   Qs' Ks'^T + qm Ks^T (qm Ks^T not rounded to `half`). Left out: cuBLAS's fp32 summation inside delta_s's
   matmul (its order is not modelled).
3. Q, K (blocks along D) and V (transposed: blocks of 16 tokens per channel) are FP4 with one e4m3 scale per
   16 elements and no tensor scale: s = e4m3(amax / 6) (round to nearest, saturating; a subnormal or zero s
   is kept), element e2m1(x * (1 / s)) (round to nearest even, saturating; s = 0 gives 0), value e2m1 * s.
4. P: the exponent is offset so the running max maps to 448 * 6 (fp8_scalexfp4_scale_log2), P~ = 2688
   exp(S - m); each 16-key group's scale is its max / 6 in float32 (AbsMaxP, exp2 of the group's max score
   plus log2(1/6)); P~ is divided by that float32 scale and rounded to e2m1, while the MMA multiplies by the
   scale rounded to e4m3 (packed_float_to_ue4m3): value e2m1(P~ / a) * e4m3(a). The row sum uses P~ before
   quantisation. Key blocks run last to first (mainloop: n_block from n_block_count - 1 down).
The kernel's exp2 and reciprocals are the GPU's approximate instructions (ex2.approx, --use_fast_math); here
they are correctly rounded. Tensors [B, H, L, D]; every function returns dequantised values in float64."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.core.quant import _blocked, _unblocked

SAGE3_BLOCK = 16  # 1x16 FP4 blocks (CVT_FP4_ELTS_PER_THREAD)
SAGE3_Q_GROUP = 128  # triton_group_mean's GROUP_SIZE
SAGE3_P_SCALE = 448.0 * 6.0  # the running max maps to 448 * 6


def quantize_fp4x16(x: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    """x quantised in blocks of 16 along `dim` with one e4m3 scale amax / 6 each (rule 3), float64 out."""
    xb, pad = _blocked(x.detach().to(torch.float32), dim, SAGE3_BLOCK)
    s = round_to(xb.abs().amax(dim=-1, keepdim=True) / 6.0, Format.FP8_E4M3)
    inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    e = round_to(xb * inv, Format.FP4_E2M1)
    return _unblocked(e.double() * s.double(), pad, dim)


def block_means(q: torch.Tensor, group: int = SAGE3_Q_GROUP) -> torch.Tensor:
    """Each row's group mean [B, H, L, D] over groups of `group` rows, every group divided by `group` (the
    kernel pads L with zero rows), in float32 as triton_group_mean sums."""
    n = q.shape[-2]
    pad = (-n) % group
    qp = torch.nn.functional.pad(q.to(torch.float32), (0, 0, 0, pad)) if pad else q.to(torch.float32)
    means = qp.reshape(*q.shape[:-2], -1, group, q.shape[-1]).sum(dim=-2) / group
    return means.repeat_interleave(group, dim=-2)[..., :n, :]


def sage3_inputs(q, k, v, half: Format, quantize=quantize_fp4x16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q', k', v) as SageAttention3's kernel multiplies them (rules 1-3): q' = [Qs', qm] and k' = [Ks', Ks]
    [B, H, L, 2 D], so that q' k'^T = Qs' Ks'^T + qm Ks^T (the MMA model: sage3_fp4_part and DeltaS); v
    [B, H, L, Dv] FP4 along the tokens. `quantize`: quantize_fp4x16 or a function giving its values
    (kernels.sim.quantized passes its C pass), in float64 or float32 (every value is exact in float32: the outputs
    then come in float32)."""
    qh, kh, vh = (round_to(t.to(torch.float32), half) for t in (q, k, v))
    km = round_to(kh.mean(dim=-2, keepdim=True), half)
    ks = round_to(kh - km, half)
    qm = block_means(qh)
    qs = round_to(qh - qm, half)
    qq, kq = quantize(qs, dim=-1), quantize(ks, dim=-1)
    q2 = torch.cat([qq, round_to(qm, half).to(qq.dtype)], dim=-1)  # half values: exact in float32 and float64
    k2 = torch.cat([kq, ks.to(kq.dtype)], dim=-1)
    return q2, k2, quantize(vh, dim=-2)


def sage3_fp4_part(x2: torch.Tensor) -> torch.Tensor:
    """The FP4 columns Qs' or Ks' [B, H, L, D] of sage3_inputs' q' or k' [B, H, L, 2 D] (a view)."""
    return x2[..., : x2.shape[-1] // 2]


@dataclass(frozen=True, slots=True)
class DeltaS:
    """delta_s = qm Ks^T (rule 2) per 128-row query group: values [B, H, ceil(Lq / 128), Lk] float32 holding
    `half` values (api.py's 16-bit matmul cast to float32); start: values + 0, the MMA's initial C (a -0 made +0,
    as kernels.sim.mma_ops.qk_scores starts from a copy of C plus 0), formed once."""

    values: torch.Tensor
    start: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", self.values + 0.0)

    @staticmethod
    def make(q2: torch.Tensor, k2: torch.Tensor, half: Format) -> DeltaS:
        """From sage3_inputs' q' [B, H, Lq, 2 D] (qm, in half, in its last D columns, constant per group) and
        k' [B, H, Lk, 2 D] (Ks in its last D): the float64 sum of the exact products rounded once to half."""
        d = q2.shape[-1] // 2
        qm = q2[..., ::SAGE3_Q_GROUP, d:].to(torch.float64)  # one row per group
        ks = k2[..., d:].to(torch.float64)
        return DeltaS(round_to(qm @ ks.transpose(-1, -2), half).to(torch.float32))

    def block(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """delta_s of query rows r0:r1 and keys c0:c1, [B, H, r1 - r0, c1 - c0] float32: a view of the group's
        row (stride 0 over the rows) where they lie in one group, else a new tensor (each group's row repeated)."""
        g0, g1 = r0 // SAGE3_Q_GROUP, (r1 - 1) // SAGE3_Q_GROUP + 1
        rows = self.values[..., g0:g1, c0:c1]
        if g1 - g0 == 1:
            return rows.expand(*rows.shape[:-2], r1 - r0, c1 - c0)
        off = r0 - g0 * SAGE3_Q_GROUP
        return rows.repeat_interleave(SAGE3_Q_GROUP, dim=-2)[..., off : off + r1 - r0, :]

    def start_into(self, out: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """out [B, H, r1 - r0, c1 - c0] (float32; returned) = block(r0, r1, c0, c1) + 0, each group's row copied
        straight into its rows of out (no repeated block in between)."""
        r = r0
        while r < r1:
            e = min(r1, (r // SAGE3_Q_GROUP + 1) * SAGE3_Q_GROUP)
            g = r // SAGE3_Q_GROUP
            out[..., r - r0 : e - r0, :].copy_(self.start[..., g : g + 1, c0:c1])
            r = e
        return out


def sage3_p(p: torch.Tensor, p_scale: float = SAGE3_P_SCALE) -> torch.Tensor:
    """P [..., rows, Bc] (exp(S - m), the running max m) as the P·V MMA sees it, in p_scale units (rule 4):
    e2m1(P~ / a) * e4m3(a), P~ = p_scale * P, a the 16-key group's max of P~ / 6 in float32."""
    pt = (p.detach().to(torch.float32) * p_scale).to(torch.float32)
    pb, pad = _blocked(pt, -1, SAGE3_BLOCK)
    a = pb.amax(dim=-1, keepdim=True) / 6.0
    live = a > 0
    e = round_to(pb.div_(torch.where(live, a, torch.ones_like(a))), Format.FP4_E2M1)
    # e2m1 (2 significant bits, at most 6) times e4m3 (4 bits, 2^-9 .. 448): exact in float32, as in float64
    out = e.mul_(round_to(a, Format.FP8_E4M3)).masked_fill_(~live, 0.0)
    return _unblocked(out, pad, -1).to(p.dtype)
