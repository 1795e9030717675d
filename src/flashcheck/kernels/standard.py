"""Standard ("baseline") attention: materialised scores, softmax, P·V, each stage under a policy."""

from __future__ import annotations

import torch

from flashcheck.core.numerics import Policy, parse_policy
from flashcheck.kernels.fp8 import round_inputs
from flashcheck.kernels.masks import tile_bias
from flashcheck.kernels.ops import mm, resolve_scale, rnd, safe_max
from flashcheck.kernels.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty


def standard_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    policy: Policy | str = "fp64",
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    hadamard_seed: int = 0,
) -> torch.Tensor:
    """Baseline attention under `policy`; differentiable (autograd rounds gradients at the same casts).

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (Hkv divides H) -> out [B, H, Lq, Dv] in
    the policy's working dtype, its values in policy.output. Causal masks are bottom-right aligned;
    `mask` is bool (True = keep) or additive, broadcastable to [B, H, Lq, Lk]; Lk = 0 gives zeros
    (kernels.validation has the input rule). Memory O(Lq * Lk)."""
    pol = parse_policy(policy)
    s = resolve_scale(check_attention_inputs(q, k, v, mask=mask, scale=scale), q.shape[-1])
    if pol.fp8_scaling == "block":
        raise ValueError("fp8_scaling='block' needs tiles; the standard kernel supports 'tensor' only")
    if is_empty(q, k, v):
        return empty_attention(q, k, v, dtype=pol.work_dtype)[0]
    k, v = expand_kv_heads(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    with torch.autocast(device_type=q.device.type, enabled=False):
        qr, kr, vr, _ = round_inputs(q, k, v, pol, hadamard_seed=hadamard_seed)
        scores = rnd(mm(qr, kr.transpose(-1, -2), pol) * s, pol, "score")
        bias = tile_bias((0, lq), (0, lk), lq, lk, causal=causal, mask=mask, dtype=scores.dtype)
        if bias is not None:
            scores = scores + bias
        m = safe_max(scores.detach().amax(dim=-1, keepdim=True))
        e = rnd(torch.exp(scores - m), pol, "p")
        denom = rnd(e.sum(dim=-1, keepdim=True), pol, "stats")
        denom = torch.where(denom == 0, torch.ones_like(denom), denom)
        p = rnd(e / denom, pol, "p")
        return rnd(rnd(mm(p, vr, pol), pol, "accum"), pol, "output")
