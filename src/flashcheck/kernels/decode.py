"""Split-KV ("flash-decoding") attention: S key chunks computed independently, merged through their LSEs.

Shapes: q [B, H, Lq, D] (decoding: Lq of 1 or a few draft tokens), k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]
(a long KV cache). Each chunk is one flash pass (kernels.flash) whose normalised partial output and
log-sum-exp are stored in the policy's `merge` format; the combine (FA2's flash_fwd_combine: lse =
log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s) also runs in `merge`, and only its result is
rounded to `output`. The merge is the numerics source unique to decoding.
"""

from __future__ import annotations

import math

import torch

from flashcheck.core.numerics import Format, Policy, parse_policy
from flashcheck.kernels.flash import flash_attention
from flashcheck.kernels.fp8 import round_inputs
from flashcheck.kernels.masks import tile_bias
from flashcheck.kernels.ops import resolve_scale, rnd, safe_max
from flashcheck.kernels.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty


def split_spans(lk: int, splits: int, block_k: int) -> list[tuple[int, int]]:
    """Key chunks (start, stop): whole key blocks, ceil(blocks / splits) per chunk (as FA2 splits them),
    so fewer than `splits` chunks when there are fewer blocks."""
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits={splits!r} must be a positive integer")
    blocks = math.ceil(lk / block_k)
    step = math.ceil(blocks / splits) * block_k
    return [(c0, min(lk, c0 + step)) for c0 in range(0, lk, step)]


def merge_partials(
    outs: list[torch.Tensor], lses: list[torch.Tensor], policy: Policy
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial outputs O_s [B, H, Lq, Dv] with their LSEs [B, H, Lq, 1] (-inf: the chunk had no
    visible key) in policy.merge; returns (out in merge, lse [B, H, Lq, 1]). Rows with no visible key in
    any chunk give 0 and -inf."""
    lse = torch.stack(lses)
    m = safe_max(lse.amax(dim=0))
    total = rnd(torch.exp(lse - m).sum(dim=0), policy, "merge")
    dead = total == 0
    lse_all = torch.where(dead, torch.full_like(m, -math.inf), rnd(m + torch.log(total), policy, "merge"))
    lse_safe = torch.where(dead, torch.full_like(m, math.inf), lse_all)
    acc = torch.zeros_like(outs[0])
    for o_s, lse_s in zip(outs, lses, strict=True):
        w = rnd(torch.exp(lse_s - lse_safe), policy, "merge")
        acc = rnd(acc + rnd(w * o_s, policy, "merge"), policy, "merge")
    return acc, lse_all


def split_kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    policy: Policy | str = "bf16-mixed",
    splits: int = 4,
    block_q: int = 128,
    block_k: int = 128,
    algorithm: str = "fa2",
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    exp2: bool = False,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Split-KV attention under `policy` (see the module docstring); forward only (decoding is inference).

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, H, Lq, Dv] in the policy's working
    dtype (with `return_lse`, also the natural-log LSE [B, H, Lq]). Causal masks are bottom-right aligned
    over the whole cache; fully masked rows give 0. `splits`: the number of key chunks S."""
    pol = parse_policy(policy)
    scale = resolve_scale(check_attention_inputs(q, k, v, mask=mask, scale=scale), q.shape[-1])
    spans = split_spans(k.shape[-2], splits, block_k) if k.shape[-2] else []
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("split_kv_attention is forward only (a decoding kernel); call it under torch.no_grad()")
    if is_empty(q, k, v):
        out, lse = empty_attention(q, k, v, dtype=pol.work_dtype)
        return (out, lse) if return_lse else out
    k, v = expand_kv_heads(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    with torch.autocast(device_type=q.device.type, enabled=False):
        qr, kr, vr, _ = round_inputs(q, k, v, pol, block_q=block_q, block_k=block_k)
        work = Format.FP64 if pol.work_dtype == torch.float64 else Format.FP32
        # inputs are rounded once above; each chunk keeps them (exact) and stores its result in merge
        part = pol.replace(input=work, output=pol.merge, hadamard=False, fp8_scaling="tensor")
        outs, lses = [], []
        for c0, c1 in spans:
            bias = tile_bias((0, lq), (c0, c1), lq, lk, causal=causal, mask=mask, dtype=qr.dtype)
            o_s, lse_s = flash_attention(
                qr, kr[..., c0:c1, :], vr[..., c0:c1, :], policy=part, block_q=block_q, block_k=block_k,
                algorithm=algorithm, mask=bias, scale=scale, exp2=exp2, return_lse=True,
            )  # fmt: skip
            outs.append(rnd(o_s, pol, "merge"))
            lses.append(rnd(lse_s.unsqueeze(-1), pol, "merge"))
        acc, lse = merge_partials(outs, lses, pol)
        out = rnd(acc, pol, "output")
    return (out, lse.squeeze(-1)) if return_lse else out
