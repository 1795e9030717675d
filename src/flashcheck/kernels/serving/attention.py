"""FA3's forward as serving runs it, over a quantised KV cache, with its tiles, splits and accumulation.

Shapes: q [B, H, Lq, D], k, v [B, Hkv, Lk, D] (raw activations; the cache format quantises them). Causal masks
are bottom-right aligned (query i of Lq sees keys 0 .. Lk - Lq + i), so a decode step (Lq = 1) and row i of a
prefill (Lq = Lk) see the same keys.

What the simulator does, step by step, after vllm-project/flash-attention at 617264c1 (hopper/):
1. The cache: kernels.serving.kvcache quantises K and V; in the FP8 path (per-tensor or per-head e4m3) Q is quantised
   too and the MMAs see the e4m3 payloads, the descales folded into softmax_scale_log2 (q_descale * k_descale)
   and into the final 1 / l (v_descale: softmax.h finalize's final_scale). Other formats run in bf16 on the
   dequantised cache (SGLang dequantises its fp4 cache to bf16 before attention).
2. Tiles of kBlockN keys are visited from the last to the first (mainloop_fwd_sm90_tma_gmma_ws.hpp: n_block =
   n_block_max - 1, --n_block); with `splits`, the n-blocks are cut ceil(blocks / splits) per split (block.h).
3. Per tile: S = Q K^T (one MMA from zero); the running row max m; the rescale exp2((m_old - m) * scale_log2)
   (0 when m_old is -inf: softmax.h's Check_inf); P = exp2(S * scale_log2 - (m * scale_log2 - max_offset))
   with max_offset 8 for FP8 (softmax.h: P in [0, 256] uses more of e4m3's range), 0 otherwise; l = l * rescale
   + rowsum(P) on the fp32 P; P rounded to the MMA's input format (e4m3 / bf16); O = O * rescale, then O plus
   P V (the MMA): two-level (utils.h gemm with FP8 two-level accumulation: the MMA into a zeroed fragment, then
   an fp32 add into O) or one-level (the MMA accumulates into O itself, as before two-level existed).
4. Finalize: O * (1 / l * v_descale) in fp32; LSE m * scale_log2 * ln 2 + log(l / 2^max_offset). Splits merge
   as flash_fwd_combine does, in fp32: lse = log sum exp(lse_s - max) + max, O = sum exp(lse_s - lse) O_s.
5. The output is rounded to bf16 (the kernel's output dtype) unless round_output=False.

Arithmetic: every fp32 quantity is held in float64 and rounded to fp32 after each operation (exp2 and log
evaluated in float64 first), so the result depends only on the tiling, never on the batch the rows sit in or
on this CPU's vector width. The MMA is the exact dot product rounded once to fp32 (`mma=None`: an ideal
tensor core, exact here since e4m3 x e4m3 products and their sums over <= 256 terms fit float64), or a
hardware model of kernels.tensorcore.mma (`mma="hopper"`, "b200", "ada") where that module is present.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.kernels.serving.heuristics import key_spans
from flashcheck.kernels.serving.kvcache import KVCacheFormat, parse_kv_format, quantize_kv, round_fp

ACCUMULATIONS = ("two-level", "one-level")
FP8_MAX_OFFSET = 8
_LOG2E = math.log2(math.e)


def r32(x: torch.Tensor) -> torch.Tensor:
    """x (float64) rounded to fp32, kept in float64."""
    return x.to(torch.float32).to(torch.float64)


def _mma(a: torch.Tensor, b: torch.Tensor, model: str | None, c: torch.Tensor | None = None,
         fp8: bool = False) -> torch.Tensor:  # fmt: skip
    """a [..., M, K] @ b [..., K, N] as a tensor core computes it, plus c (fp32) when given; float64 holding fp32.
    `fp8`: the operands are e4m3 values (the hardware models' oracle); else dequantised values ("fp32")."""
    if model is None:
        prod = r32(a @ b)
        return prod if c is None else r32(c + prod)
    from flashcheck.kernels.tensorcore.mma import MMA_MODELS, mma_matmul  # lazily: the hardware model is optional here

    if model not in MMA_MODELS:
        raise ValueError(f"unknown MMA model {model!r}; expected one of {', '.join(MMA_MODELS)}")
    c32 = None if c is None else c.to(torch.float32)
    out = mma_matmul(a, b, MMA_MODELS[model], c=c32, fmt="e4m3" if fp8 else "fp32")
    return out.to(torch.float64)


class Operands(NamedTuple):
    """What the kernel reads (step 1): payloads q [B, H, Lq, D], k, v [B, H, Lk, D] (float64 holding e4m3 or
    bf16 values, K/V heads expanded), the softmax descale q_descale * k_descale and v_descale (scalars or
    [1, H, 1, 1]), P's format and softmax.h's max_offset."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qk_descale: torch.Tensor
    v_descale: torch.Tensor
    p_fmt: Format
    max_offset: int

    def rows(self, q_rows: slice, keys: slice) -> Operands:
        """The operands of a launch over query rows `q_rows` and cached keys `keys` (the same stored cache)."""
        return self._replace(q=self.q[..., q_rows, :], k=self.k[..., keys, :], v=self.v[..., keys, :])


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCacheFormat | str) -> Operands:
    """Quantise Q and the cache once (step 1): q [B, H, Lq, D], k, v [B, Hkv, Lk, D] -> Operands."""
    fmt = parse_kv_format(kv)
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    qq, kq, vq, scales = quantize_kv(q, k, v, fmt)
    if fmt.scheme in ("fp8", "fp8-head"):
        sq, sk, sv = (torch.tensor(scales[w], dtype=torch.float64) for w in "qkv")
        if fmt.scheme == "fp8-head":  # per-head descales [1, H, 1, 1] (FA3 takes k/v_descale per batch and kv head)
            sk, sv = (t.detach().to(torch.float64).abs().amax(dim=(0, 2, 3), keepdim=True) / 448 for t in (k, v))
            sk, sv = (torch.where(s > 0, s, torch.ones_like(s)) for s in (sk, sv))
        return Operands(qq / sq, kq / sk, vq / sv, sq * sk, sv, Format.FP8_E4M3, FP8_MAX_OFFSET)
    bf = (round_to(t.to(torch.float32), Format.BF16).to(torch.float64) for t in (qq, kq, vq))
    one = torch.tensor(1.0, dtype=torch.float64)
    return Operands(*bf, one, one, Format.BF16, 0)


def _split_pass(q, k, v, spans, scale_log2, p_fmt, max_offset, accumulation, mma, row_offset):
    """One split (step 3) over its tiles `spans`; returns (o, m, l), fp32 values in float64."""
    lq = q.shape[-2]
    shape = (*q.shape[:-1], 1)
    m = torch.full(shape, -math.inf, dtype=torch.float64)
    l = torch.zeros(shape, dtype=torch.float64)
    o = None
    row = torch.arange(lq).view(lq, 1) + row_offset
    fp8 = p_fmt == Format.FP8_E4M3
    for c0, c1 in spans:
        s = _mma(q, k[..., c0:c1, :].transpose(-1, -2), mma, fp8=fp8)
        s = s.masked_fill(torch.arange(c0, c1).view(1, -1) > row, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_use = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        rescale = r32(torch.exp2(r32((m - m_use) * scale_log2)))
        max_scaled = r32(r32(m_use * scale_log2) - max_offset)
        p = r32(torch.exp2(r32(s * scale_log2 - max_scaled)))
        l = r32(r32(l * rescale) + r32(p.sum(dim=-1, keepdim=True)))
        pq = round_fp(p, p_fmt)
        vt = v[..., c0:c1, :]
        if o is None:
            o = _mma(pq, vt, mma, fp8=fp8)
        elif accumulation == "two-level":
            o = r32(r32(o * rescale) + _mma(pq, vt, mma, fp8=fp8))
        else:
            o = _mma(pq, vt, mma, c=r32(o * rescale), fp8=fp8)
        m = m_new
    return o, m, l


def serving_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv: KVCacheFormat | str = "bf16",
    block_n: int,
    splits: int = 1,
    causal: bool = True,
    scale: float | None = None,
    accumulation: str = "two-level",
    mma: str | None = None,
    round_output: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's forward over KV cache `kv` (see the module docstring): (out [B, H, Lq, D] float64 holding bf16
    (fp32 with round_output=False), lse [B, H, Lq] natural log). `block_n`: kBlockN (kernels.serving.heuristics
    picks it per launch); `splits`: the split-KV count (1: none)."""
    return run_prepared(prepare(q, k, v, kv), block_n=block_n, splits=splits, causal=causal, scale=scale,
                        accumulation=accumulation, mma=mma, round_output=round_output)  # fmt: skip


def run_prepared(
    ops: Operands,
    *,
    block_n: int,
    splits: int = 1,
    causal: bool = True,
    scale: float | None = None,
    accumulation: str = "two-level",
    mma: str | None = None,
    round_output: bool = True,
    spans: list[list[tuple[int, int]]] | None = None,
    round_p: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """serving_attention on operands prepared once (a decode loop slices them with Operands.rows). `spans`
    (per split, its key tiles in visiting order) replaces block_n / splits; round_p=False keeps P in fp32
    (a CUDA-core kernel's P V rather than a tensor core's)."""
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"unknown accumulation {accumulation!r}; expected one of {', '.join(ACCUMULATIONS)}")
    if block_n < 1 or splits < 1:
        raise ValueError(f"block_n={block_n} and splits={splits} must be positive")
    qp, kp, vp, qk_descale, v_descale, p_fmt, offset = ops
    lq, lk, d = qp.shape[-2], kp.shape[-2], qp.shape[-1]
    sm = r32(torch.tensor(scale if scale is not None else d**-0.5, dtype=torch.float64))
    scale_log2 = r32(r32(sm * _LOG2E) * qk_descale)
    row_offset = lk - lq if causal else lk  # the last key row i sees is row_offset + i
    outs, lses = [], []
    p_fmt = p_fmt if round_p else Format.FP32
    for tiles in spans if spans is not None else key_spans(lk, block_n, splits):
        o, m, l = _split_pass(qp, kp, vp, tiles, scale_log2, p_fmt, offset, accumulation, mma, row_offset)
        inv = torch.where(l > 0, r32(1.0 / l), torch.zeros_like(l))
        outs.append(r32(o * r32(inv * v_descale)))
        ls = r32(l / 2.0**offset)
        lses.append(torch.where(l > 0, r32(r32(m * r32(scale_log2 * math.log(2))) + r32(torch.log(ls))), -math.inf))
    out, lse = outs[0], lses[0]
    if len(outs) > 1:
        out, lse = _combine(outs, lses)
    if round_output:
        out = round_to(out.to(torch.float32), Format.BF16).to(torch.float64)
    return out, lse.squeeze(-1)


def _combine(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_fwd_combine in fp32 (step 4): partial outputs O_s [..., Lq, D] with LSEs [..., Lq, 1]."""
    lse = torch.stack(lses)
    top = lse.amax(dim=0)
    top = torch.where(top == -math.inf, torch.zeros_like(top), top)
    total = r32(torch.exp(lse - top)).sum(dim=0)
    lse_all = torch.where(total > 0, r32(r32(torch.log(r32(total))) + top), -math.inf)
    acc = torch.zeros_like(outs[0])
    for o_s, lse_s in zip(outs, lses, strict=True):
        w = torch.where(lse_all > -math.inf, r32(torch.exp(r32(lse_s - lse_all))), torch.zeros_like(lse_s))
        acc = r32(acc + r32(w * o_s))
    return acc, lse_all


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCacheFormat | str, *,
                    causal: bool = True, scale: float | None = None) -> torch.Tensor:  # fmt: skip
    """FP64 softmax(Q K^T * scale) V of the same quantised Q and cache (the oracle of the kernel's error)."""
    qq, kq, vq, _ = quantize_kv(q, k, v, kv)
    if kq.shape[1] != qq.shape[1]:
        kq, vq = (t.repeat_interleave(qq.shape[1] // kq.shape[1], dim=1) for t in (kq, vq))
    lq, lk = qq.shape[-2], kq.shape[-2]
    s = (qq @ kq.transpose(-1, -2)) * (scale if scale is not None else qq.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(torch.arange(lk).view(1, -1) > torch.arange(lq).view(-1, 1) + (lk - lq), -math.inf)
    return torch.softmax(s, dim=-1) @ vq
