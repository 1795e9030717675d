"""One input rule for every kernel and backend: what is rejected, and the defined result of empty inputs.

Layout: q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]; Hkv == H, or (grouped-query attention,
where the caller supports it) Hkv >= 1 divides H. A mask is bool (True = keep) or real floating
(additive) and broadcasts to [B, H, Lq, Lk]. `scale` is None (1/sqrt(D)) or a finite real number:
0 gives every visible key the same weight, a negative scale reverses the order of the scores.

Rejected with a ValueError that names the value: tensors that are not 4-D, not real floating
(int, bool, complex), of different dtypes or devices; D = 0; shapes that disagree; non-finite scales.
Defined results, the same in every kernel and backend (`empty_attention`): Lk = 0 gives zeros (every
query row sees no key, as a fully masked row does) and log-sum-exp -inf; B, H, Lq or Dv = 0 gives an
empty output [B, H, Lq, Dv].
"""

from __future__ import annotations

import math
import numbers

import torch

_FLOATS = "float16, bfloat16, float32, float64 (or float8)"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor [B, H, L, D]; got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D [B, H, L, D]; got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise ValueError(f"{name} has dtype {_dtype_name(t.dtype)}; expected a real floating dtype: {_FLOATS}")
    return t


def check_scale(scale: object) -> float | None:
    """`scale` as a float (None stays None); ValueError unless it is a finite real number."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor) and scale.numel() == 1 and not scale.is_complex():
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale={scale!r} must be a finite real number (or None for 1/sqrt(D))")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale={scale!r} must be finite (or None for 1/sqrt(D))")
    return float(scale)


def check_heads(hq: int, hkv: int, *, gqa: bool = True) -> None:
    """K/V heads equal Q heads, or with `gqa` divide them (grouped-query attention)."""
    if hq == hkv:
        return
    if not gqa:
        raise ValueError(
            f"q has {hq} heads and k, v have {hkv}; this implementation needs equal head counts "
            "(grouped-query attention is not supported here)"
        )
    if hkv < 1 or hq % hkv:
        raise ValueError(
            f"q has {hq} heads and k, v have {hkv}; for grouped-query attention the K/V heads must divide "
            f"the Q heads (e.g. {hq} or a divisor of it)"
        )


def check_mask(mask: object, b: int, h: int, lq: int, lk: int) -> None:
    """A bool or real floating mask of 2 to 4 dims that broadcasts to [B, H, Lq, Lk]."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor (bool or floating); got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(
            f"mask has dtype {_dtype_name(mask.dtype)}; expected bool (True = keep) or a floating additive mask"
        )
    target = (b, h, lq, lk)
    shape = tuple(mask.shape)
    if not 2 <= len(shape) <= 4 or any(m not in (1, t) for m, t in zip(shape[::-1], target[::-1], strict=False)):
        raise ValueError(
            f"mask of shape {shape} does not broadcast to [B, H, Lq, Lk] = {list(target)}: a mask has 2 to 4 dims, "
            "each 1 or the size it meets (a key padding mask: [B, 1, 1, Lk])"
        )


def check_attention_inputs(
    q: object,
    k: object,
    v: object,
    *,
    mask: object = None,
    scale: object = None,
    gqa: bool = True,
) -> float | None:
    """Validate q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv], mask and scale; returns the
    scale as a float (None: the caller's default 1/sqrt(D)). See the module docstring for the rule."""
    q, k, v = (_check_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    if not q.dtype == k.dtype == v.dtype:
        names = ", ".join(_dtype_name(t.dtype) for t in (q, k, v))
        raise ValueError(f"q, k, v must share one dtype; got {names}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    b, hq, lq, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch sizes differ: {shapes}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same heads and length [B, Hkv, Lk, *]: {shapes}")
    if k.shape[3] != d:
        raise ValueError(f"q and k head dims differ ({d} vs {k.shape[3]}): {shapes}")
    if d == 0:
        raise ValueError(f"head dim D=0 is not allowed ({shapes}); D must be at least 1")
    check_heads(hq, k.shape[1], gqa=gqa)
    check_mask(mask, b, hq, lq, k.shape[2])
    return check_scale(scale)


def is_empty(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Nothing to compute: no key (Lk = 0) or an empty output (B, H, Lq or Dv = 0)."""
    return k.shape[-2] == 0 or q.shape[0] * q.shape[1] * q.shape[2] * v.shape[-1] == 0


def empty_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The defined result of inputs with `is_empty`: out [B, H, Lq, Dv] zeros (no key visible, as a fully
    masked row) and lse [B, H, Lq] -inf, in `dtype` on q's device. Differentiable, with zero gradients."""
    b, h, lq, _ = q.shape
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=dtype, device=q.device)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # A zero that depends on q, k and v (no NaN even for inf inputs): the gradients are zeros.
        anchor = sum(t.reshape(-1)[:0].to(dtype).sum() for t in (q, k, v))
        out = out + anchor
    return out, torch.full((b, h, lq), -math.inf, dtype=dtype, device=q.device)


def expand_kv_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v with their Hkv heads repeated to q's H (grouped-query attention); unchanged when Hkv == H."""
    groups = q.shape[1] // k.shape[1] if k.shape[1] else 1
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def check_backend_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: object = None,
    mask: object = None,
    gqa: bool = False,
) -> torch.Tensor | None:
    """What a backend's run does first: check the inputs with the rule above (grouped-query heads only
    with `gqa`), and return the defined result [B, H, Lq, Dv] in q's dtype for empty inputs (None: run
    the implementation)."""
    check_attention_inputs(q, k, v, mask=mask, scale=scale, gqa=gqa)
    return empty_attention(q, k, v, dtype=q.dtype)[0] if is_empty(q, k, v) else None
