"""Attention masks shared by every kernel: causal (bottom-right aligned) and user masks, by tile."""

from __future__ import annotations

import torch


def causal_offset(lq: int, lk: int) -> int:
    """Query i sees key j iff j <= i + offset (bottom-right alignment, as flash-attn does)."""
    return lk - lq


def first_row_needing(k0: int, lq: int, lk: int) -> int:
    """First query row that sees any key at index >= k0 under the causal mask."""
    return min(lq, max(0, k0 - causal_offset(lq, lk)))


def tile_bias(
    rows: tuple[int, int],
    cols: tuple[int, int],
    lq: int,
    lk: int,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Additive bias (0 / -inf, or the user's float mask) for the score tile rows x cols, or None.

    Returned shape broadcasts to [B, H, r1 - r0, c1 - c0]."""
    r0, r1 = rows
    c0, c1 = cols
    bias = None
    if causal:
        i = torch.arange(r0, r1).unsqueeze(-1)
        j = torch.arange(c0, c1).unsqueeze(0)
        keep = j <= i + causal_offset(lq, lk)
        if not bool(keep.all()):
            bias = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
    if mask is not None:
        m = mask
        m = m[..., r0:r1, :] if m.shape[-2] != 1 else m
        m = m[..., :, c0:c1] if m.shape[-1] != 1 else m
        m = torch.zeros(m.shape, dtype=dtype).masked_fill(~m, float("-inf")) if m.dtype == torch.bool else m.to(dtype)
        bias = m if bias is None else bias + m
    return bias


# a float mask's entries below this (and -inf) keep a NaN-free score block NaN-free: the scores are below 2^126
# (ops.scores_are_finite), so score + bias (times log2(e) under exp2) stays below float32's overflow threshold
MASK_BOUND = 2.0**125


def bias_is_bounded(mask: torch.Tensor | None) -> bool:
    """True when adding the mask's bias (tile_bias) to NaN-free scores below 2^126 cannot make a NaN or +inf:
    no mask, a bool mask (0 / -inf), or a float mask whose every entry is -inf or finite below MASK_BOUND (no
    NaN, no +inf: -inf + inf would be NaN, and a score of +inf gives inf - inf in the softmax). One pass."""
    if mask is None or mask.dtype == torch.bool or mask.numel() == 0:
        return True
    return float(mask.detach().max()) < MASK_BOUND  # NaN: False


PADDING_SIDES = ("right", "left")


def key_padding_mask(lengths: list[int] | tuple[int, ...], length: int, *, side: str = "right") -> torch.Tensor:
    """bool [B, 1, 1, length], True at each sequence's real tokens: first (`side` "right": padding after)
    or last ("left": padding first, as decoders batch prompts). A length of 0 is all padding."""
    if side not in PADDING_SIDES:
        raise ValueError(f"unknown padding side {side!r}; expected one of {', '.join(PADDING_SIDES)}")
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length]
    if bad:
        raise ValueError(f"padding lengths {bad} must be integers in [0, {length}]")
    pos = torch.arange(length)
    n = torch.tensor(list(lengths), dtype=torch.long).unsqueeze(-1)
    keep = pos < n if side == "right" else pos >= length - n
    return keep[:, None, None, :]


def rows_with_keys(lq: int, lk: int, *, causal: bool, mask: torch.Tensor | None) -> torch.Tensor:
    """bool, broadcastable to [B, H, Lq, 1]: True where a query row sees at least one key."""
    bias = tile_bias((0, lq), (0, lk), lq, lk, causal=causal, mask=mask, dtype=torch.float64)
    if bias is None:
        return torch.ones(1, 1, lq, 1, dtype=torch.bool)
    seen = torch.isfinite(bias).any(dim=-1, keepdim=True)
    return seen.reshape((1,) * (4 - seen.dim()) + tuple(seen.shape))
