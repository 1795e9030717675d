"""SageBwd-like 8-bit attention for training: an autograd Function whose forward and backward quantise the
operands of six of attention's seven matrix products to INT8, as SageBwd does.

Sources: SageAttention3 (arXiv 2505.11594), its "8-bit attention for training" (SageBwd), whose abstract reports
"lossless performance in fine-tuning tasks but ... slower convergence in pretraining tasks"; arXiv 2603.02170
(SageBwd: A Trainable Low-bit Attention): "quantizes six of seven attention matrix multiplications", keeps the
score-gradient product dP = dO V^T in FP16, finds dS the dominant error source, and K smoothing essential while
Q smoothing helps little in pre-training. Where the papers leave a choice open (scale granularity of P, dO and
dS in the backward) this module takes the one below; it is a simulation of the numerics, not of the kernel's
tiling: scores are formed for whole rows (the forward's P has its exact row max, 1).

Forward, q, k, v [B, H, L, D] (Dv for v), scale s = 1/sqrt(D):
  K_s = K - mean_tokens(K) (a per-row constant of the scores, which softmax cancels; dropped, as the kernels do)
  Q^ = int8(Q) per block of BLOCK_Q tokens, K^ = int8(K_s) per block of BLOCK_K tokens, V^ = int8(V) likewise
  S = s Q^ K^^T (fp32), m = rowmax S, P~ = exp(S - m) (row max exactly 1), l = rowsum P~ (fp32, unquantised)
  P^ = int8(P~) per token with the static scale 1/127; O = (P^ V^) / l (fp32); LSE = m + log l
Backward, dO [B, H, L, Dv]:
  S = s Q^ K^^T again, P = exp(S - LSE)                                            (8-bit product 3)
  dV = int8(P)^T int8(dO): P per BLOCK_Q x BLOCK_K tile, dO per block of BLOCK_Q tokens (8-bit product 4)
  dP = fp16(dO) fp16(V)^T, fp32 accumulation                                       (the 16-bit product)
  D = rowsum(dO * O), dS = P * (dP - D) (fp32); dS^ = int8(dS) per BLOCK_Q x BLOCK_K tile
  dQ = s dS^ K^, dK = s dS^^T Q^                                                    (8-bit products 5, 6)
The quantisers are straight-through: their own derivative is taken as 1. int8(x): scale = amax / 127 + 1e-7,
value round_half_away(x / scale) clamped to +-127, times scale, in float32 (core.quant.quantize_int's rule)."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from flashcheck.core.quant import round_half_away

BLOCK_Q, BLOCK_K = 128, 64  # SageAttention's per_block_int8: 128 query rows, 64 key rows per scale
QMAX, EPS = 127.0, 1e-7


def int8_tiles(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x [..., R, C] quantised to INT8 with one scale per tile of `rows` x `cols` (the last tiles may be
    smaller), returned dequantised in float32 [..., R, C]."""
    x32 = x.detach().to(torch.float32)
    r, c = x32.shape[-2:]
    pr, pc = (-r) % rows, (-c) % cols
    xp = F.pad(x32, (0, pc, 0, pr))
    t = xp.reshape(*xp.shape[:-2], (r + pr) // rows, rows, (c + pc) // cols, cols)
    scale = t.abs().amax(dim=(-3, -1), keepdim=True) / QMAX + EPS
    out = round_half_away(t / scale).clamp(-QMAX, QMAX) * scale
    return out.reshape(xp.shape)[..., :r, :c]


def _causal_keep(lq: int, lk: int, device: torch.device) -> torch.Tensor:
    """[Lq, Lk] bool, True where query i may see key j (bottom-right aligned, as the simulators)."""
    i = torch.arange(lq, device=device).unsqueeze(1)
    return torch.arange(lk, device=device).unsqueeze(0) <= i + (lk - lq)


class _SageBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, block_q: int, block_k: int):
        q32, k32, v32 = (t.detach().to(torch.float32) for t in (q, k, v))
        s = 1.0 / math.sqrt(q.shape[-1])
        qh = int8_tiles(q32, block_q, q.shape[-1])
        kh = int8_tiles(k32 - k32.mean(dim=-2, keepdim=True), block_k, k.shape[-1])
        vh = int8_tiles(v32, block_k, v.shape[-1])
        scores = (qh @ kh.transpose(-1, -2)) * s
        keep = _causal_keep(q.shape[-2], k.shape[-2], q.device) if causal else None
        if keep is not None:
            scores = scores.masked_fill(~keep, -math.inf)
        m = scores.amax(dim=-1, keepdim=True)
        p = torch.exp(scores - m)
        l = p.sum(dim=-1, keepdim=True)
        ph = round_half_away(p * QMAX) / QMAX  # per token, static scale 1/127: P~'s row max is exactly 1
        o = (ph @ vh) / l
        ctx.save_for_backward(qh, kh, v32, o, m + torch.log(l))
        ctx.keep, ctx.s, ctx.blocks, ctx.dtypes = keep, s, (block_q, block_k), (q.dtype, k.dtype, v.dtype)
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        qh, kh, v32, o, lse = ctx.saved_tensors
        bq, bk = ctx.blocks
        do32 = do.to(torch.float32)
        scores = (qh @ kh.transpose(-1, -2)) * ctx.s
        if ctx.keep is not None:
            scores = scores.masked_fill(~ctx.keep, -math.inf)
        p = torch.exp(scores - lse)
        dv = int8_tiles(p, bq, bk).transpose(-1, -2) @ int8_tiles(do32, bq, do.shape[-1])
        dp = do32.to(torch.float16).to(torch.float32) @ v32.to(torch.float16).to(torch.float32).transpose(-1, -2)
        delta = (do32 * o).sum(dim=-1, keepdim=True)
        dsh = int8_tiles(p * (dp - delta), bq, bk)
        dq = (dsh @ kh) * ctx.s
        dk = (dsh.transpose(-1, -2) @ qh) * ctx.s
        dtq, dtk, dtv = ctx.dtypes
        return dq.to(dtq), dk.to(dtk), dv.to(dtv), None, None, None


def sagebwd_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> torch.Tensor:
    """SageBwd-like attention (module docstring): q, k [B, H, L, D], v [B, H, L, Dv] -> out [B, H, L, Dv] in
    q's dtype; differentiable, its backward quantised as SageBwd's. Autocast is off inside (float32 math)."""
    if q.dim() != 4 or k.shape[:-1] != v.shape[:-1] or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"sagebwd_attention takes q, k [B, H, L, D] and v [B, H, L, Dv] with equal B, H and q/k D; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal sagebwd_attention needs Lq <= Lk (no query without a key); got {q.shape[-2]}, "
                         f"{k.shape[-2]}")  # fmt: skip
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _SageBwd.apply(q, k, v, causal, block_q, block_k)
