"""Planted serving bugs for `flashcheck consistency` (module:function targets): fp32 attention whose arithmetic
per request does or does not depend on the batch it is run in.

Signature: fn(q, k, v, *, causal, scale, mask) with q [B, H, Lq, D], k, v [B, Hkv, Lk, D]; causal bottom-right."""

from __future__ import annotations

import math

import torch


def _attend(q, k, v, causal: bool, scale, splits: int = 1):
    """One request ([1, H, Lq, D]) in fp32: scores, softmax and P·V; with `splits` > 1 the keys in that many
    chunks merged through their log-sum-exps (flash-decoding's combine: a different order of the sums)."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).float()
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).float()
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * s
    lq, lk = scores.shape[-2:]
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        scores = scores.masked_fill(~keep, -math.inf)
    if splits == 1:
        return torch.matmul(torch.softmax(scores, dim=-1), v).to(q.dtype)
    # the planted path: split keys merged through their log-sum-exps
    outs, lses = [], []
    for idx in torch.arange(lk).chunk(splits):
        part = scores[..., idx]
        lse = torch.logsumexp(part, dim=-1, keepdim=True)
        outs.append(torch.matmul(torch.exp(part - lse).nan_to_num(0.0), v[..., idx, :]))
        lses.append(lse)
    lse = torch.logsumexp(torch.cat(lses, dim=-1), dim=-1, keepdim=True)
    return sum(o * torch.exp(x - lse).nan_to_num(0.0) for o, x in zip(outs, lses, strict=True)).to(q.dtype)


def _exact_rows(q, k, v, causal: bool, scale):
    """Each query row on its own in float64 (elementwise products, one reduction per row), rounded once: the same
    bits for a row whatever the batch, the query length or the rows beside it."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).double()
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).double()
    scores = (q.double()[..., :, None, :] * k[..., None, :, :]).sum(-1) * s
    lq, lk = scores.shape[-2:]
    if causal:
        scores = scores.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), -math.inf)
    p = torch.softmax(scores, dim=-1)
    return (p[..., None] * v[..., None, :, :]).sum(-2).to(q.dtype)


def batch_invariant(q, k, v, *, causal, scale, mask):
    """Correct: every request and row computed alone, the same way whatever the batch or the phase."""
    return torch.cat([_exact_rows(q[i : i + 1], k[i : i + 1], v[i : i + 1], causal, scale) for i in range(q.shape[0])])


def prefill_batch_dependent(q, k, v, *, causal, scale, mask):
    """The planted bug: a prefill (Lq > 1) in a batch of 3 or more splits its keys in two (a heuristic that picks
    the split count from the batch size, as split-KV launchers do); decode steps and small batches do not."""
    splits = 2 if q.shape[-2] > 1 and q.shape[0] >= 3 else 1
    return torch.cat(
        [_attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], causal, scale, splits) for i in range(q.shape[0])]
    )
