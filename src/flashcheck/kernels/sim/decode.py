"""Split-KV ("flash-decoding") attention: S key chunks computed independently, merged through their LSEs.

Shapes: q [B, H, Lq, D] (decoding: Lq of 1 or a few draft tokens), k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]
(a long KV cache). Quantised once: Q, K, V are rounded / quantised for the whole cache as the flash kernel does
(kernels.sim.fp8.round_inputs under the policy itself: FP8 tensor or block scales, NVFP4 block and tensor scales,
SageAttention's K smoothing by the cache's mean, the Hadamard rotation), and the tensor-core models' operands
(codes and scales, sage3's delta_s) are split once (kernels.sim.mma_ops.MMAOperands). Each split is the flash forward
over its own whole key blocks (kernels.sim.flash.forward_keys) on those codes and scales, with the policy's own step
numerics (P's quantisation against the split's running max, the MMA chains) and causal / mask positions of the
whole cache; its normalised partial output and log-sum-exp are stored in the policy's `merge` format. The
combine (lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s) also runs in `merge`, and only its result
is rounded to `output`. So splits=1 is the flash kernel bit for bit; with S > 1 the splits differ from one
flash pass by the merge's roundings and by each split's softmax starting afresh (its own running max, so P
rounds differently where P is narrow), as on the hardware.

Source: FlashAttention-3, Dao-AILab/flash-attention at 0251105a2fb19d2957484b7f023cd8c115286ced: a split's key
blocks are its ceil(n_blocks / num_splits) share of the causal block range (hopper/block.h, get_n_block_min_max,
lines 48-54); its FP8 descales are the (batch, KV head) q_descale * k_descale folded into the softmax scale
(hopper/flash_fwd_kernel_sm90.h, lines 408-414) and v_descale in softmax.finalize
(hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, line 1241), read from the same tensors whatever the split; the
epilogue stores the split's O in float (ElementPartial, O_partial[..., split_idx]) and its LSE in LSE_partial
(hopper/epilogue_fwd.hpp, lines 30, 294-306, 365); hopper/flash_fwd_combine_kernel.h (lines 596-619) merges them
(lse_sum = log sum_s exp(lse_s - lse_max) + lse_max, each O_s weighted by exp(lse_s - lse_max) / sum).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from flashcheck.core.numerics import Policy, parse_policy
from flashcheck.kernels.sim.flash import LOG2E, FlashConfig, forward_keys
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.mma_ops import MMAOperands
from flashcheck.kernels.sim.ops import resolve_scale, rnd, safe_max, settle_exp
from flashcheck.kernels.sim.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty


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
    settle_exp()  # see ops.settle_exp, as flash_attention
    k, v = expand_kv_heads(q, k, v)
    cfg = FlashConfig(
        policy=pol, block_q=block_q, block_k=block_k, algorithm=algorithm, causal=causal, mask=mask, scale=scale,
        key_order=pol.kv_order or "forward", exp2=exp2,
    )  # fmt: skip
    with torch.autocast(device_type=q.device.type, enabled=False):
        outs, lses = split_partials(q, k, v, cfg, spans)
        acc, lse = merge_partials(outs, lses, pol)
        out = rnd(acc, pol, "output")
    return (out, lse.squeeze(-1)) if return_lse else out


def split_partials(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: FlashConfig, spans: list[tuple[int, int]]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The splits' partial outputs O_s [B, H, Lq, Dv] and natural-log LSEs [B, H, Lq, 1], both in cfg.policy's
    merge format, of q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] (KV heads expanded) over the key
    chunks `spans` (whole key blocks): the inputs rounded / quantised once for the whole cache, the tensor-core
    operands split once, each split the flash forward over its own key blocks (see the module docstring)."""
    pol = cfg.policy
    parts: dict = {}  # NVFP4 inputs' pieces, for the block-scaled MMA
    qr, kr, vr, _ = round_inputs(q, k, v, pol, block_q=cfg.block_q, block_k=cfg.block_k, parts=parts)
    ops = MMAOperands.make(qr, kr, vr, pol, cfg.block_q, cfg.block_k, parts)
    outs, lses = [], []
    for span in spans:
        o_s, lse_s = forward_keys(qr, kr, vr, dataclasses.replace(cfg, keys=span), ops)
        outs.append(rnd(o_s, pol, "merge"))
        lses.append(rnd(lse_s / LOG2E if cfg.exp2 else lse_s, pol, "merge"))
    return outs, lses
