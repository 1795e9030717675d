"""The FP64 oracle: exact attention computed in query chunks (memory O(L * chunk), never L x L)."""

from __future__ import annotations

import torch

from flashcheck.kernels.sim.masks import tile_bias
from flashcheck.kernels.sim.ops import prescale_is_exact, settle_exp
from flashcheck.kernels.sim.tiles import mm_blocks, row_chunks, rows_max
from flashcheck.kernels.sim.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty

REFERENCE_BLOCK_BYTES = 64 * 2**20  # cap on one query chunk's FP64 scores [B, H, rows, Lk]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    chunk: int = 1024,
    return_lse: bool = False,
    sink: float | torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v in float64.

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (Hkv divides H) -> out [B, H, Lq, Dv]
    float64 (and, with `return_lse`, the log-sum-exp [B, H, Lq]). `mask`: bool (True = keep) or
    additive, broadcastable to [B, H, Lq, Lk]. Fully masked rows, and every row when Lk = 0, give 0
    and lse -inf (kernels.sim.validation has the input rule). Differentiable. `chunk`: query rows per chunk,
    fewer when one chunk's FP64 scores would pass REFERENCE_BLOCK_BYTES; products are formed in fixed row
    blocks (kernels.sim.tiles.mm_blocks), so every chunking gives the bits of one L x L block on any BLAS.
    `sink`: learnable sink logits (a float or one per head [H]; gpt-oss, FA4): an extra softmax column with no
    value, so out is scaled by sigmoid(lse - sink) and lse becomes logaddexp(lse, sink)."""
    if sink is not None:
        out, lse = reference_attention(q, k, v, causal=causal, mask=mask, scale=scale, chunk=chunk, return_lse=True)
        sk = sink_logits(sink, q.shape[1], out.device).view(1, -1, 1)
        out, lse = out * torch.sigmoid(lse - sk).unsqueeze(-1), torch.logaddexp(lse, sk)
        return (out, lse) if return_lse else out
    settle_exp()  # see ops.settle_exp: the first exp of a process can be inaccurate
    scale = check_attention_inputs(q, k, v, mask=mask, scale=scale)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be a positive integer")
    if is_empty(q, k, v):
        out, lse = empty_attention(q, k, v, dtype=torch.float64)
        return (out, lse) if return_lse else out
    k, v = expand_kv_heads(q, k, v)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = d**-0.5 if scale is None else scale
    rows = _chunk_rows(chunk, q.shape[0] * q.shape[1] * lk)
    inplace = not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    chunks = row_chunks(lq, rows)
    with torch.autocast(device_type=q.device.type, enabled=False):
        # K and V whole in float64, Q one chunk at a time (a float32 Q never has a whole float64 copy)
        k64, v64 = k.to(torch.float64), v.to(torch.float64)
        if inplace:  # no autograd: each chunk is written into the output as it comes (no list, no cat copy)
            out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float64, device=q.device)
            lse = torch.empty(q.shape[:-1], dtype=torch.float64, device=q.device)
            fold = prescale_is_exact(q, k64, s)
            buf = torch.empty(q.shape[0] * q.shape[1] * rows_max(chunks) * lk, dtype=torch.float64, device=q.device)
            for r0, r1 in chunks:
                scores = buf[: q.shape[0] * q.shape[1] * (r1 - r0) * lk].view(*q.shape[:2], r1 - r0, lk)
                out[..., r0:r1, :], lse[..., r0:r1] = _rows_into(
                    scores, q, k64, v64, (r0, r1), (lq, lk), s, fold, causal, mask
                )
        else:
            parts = [_rows(q, k64, v64, rows, (lq, lk), s, causal, mask) for rows in chunks]
            out, lse = torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1)
    return (out, lse) if return_lse else out


def sink_logits(sink: float | torch.Tensor, heads: int, device) -> torch.Tensor:
    """The sink logits as float64 [heads] (a float for every head, or one per head); ValueError otherwise."""
    t = torch.as_tensor(sink, dtype=torch.float64, device=device).flatten()
    if t.numel() == 1:
        t = t.expand(heads)
    if t.numel() != heads or not bool(torch.isfinite(t).all()):
        raise ValueError(f"sink logits must be one finite value or one per head ({heads}); got {tuple(t.shape)}")
    return t


def _rows(q, k64, v64, rows: tuple[int, int], lens: tuple[int, int], s: float, causal: bool, mask):
    """Output [B, H, r1 - r0, Dv] and log-sum-exp [B, H, r1 - r0] of query rows r0:r1, out of place (autograd)."""
    q64 = q[..., rows[0] : rows[1], :].to(torch.float64)
    scores = mm_blocks(q64, k64.transpose(-1, -2), None, rows[0], rows_total=lens[0]) * s
    return _softmax_v(scores, v64, rows, lens, causal, mask, False)


def _rows_into(scores, q, k64, v64, rows: tuple[int, int], lens: tuple[int, int], s: float, fold: bool, causal, mask):
    """_rows without autograd, the scores [B, H, r1 - r0, Lk] formed in the given buffer (a fresh one each chunk
    would fault its pages in again: most of the time at long Lk). fold: s goes into Q's rows (exact, see
    ops.prescale_is_exact), sparing a pass over the scores."""
    r0, r1 = rows
    q64 = q[..., r0:r1, :].to(torch.float64)  # q itself when float64: never written
    mm_blocks(q64 * s if fold else q64, k64.transpose(-1, -2), None, r0, out=scores, rows_total=lens[0])
    return _softmax_v(scores if fold else scores.mul_(s), v64, rows, lens, causal, mask, True)


def _softmax_v(scores, v64, rows: tuple[int, int], lens: tuple[int, int], causal: bool, mask, inplace: bool):
    """softmax(scores + mask) v64 and the log-sum-exp of the rows r0:r1 whose scaled scores these are."""
    (r0, r1), (lq, lk) = rows, lens
    bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=torch.float64)
    if bias is not None:
        bias = bias.to(scores.device)
        scores = scores.add_(bias) if inplace else scores + bias
    m = scores.detach().amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = scores.sub_(m_safe).exp_() if inplace else torch.exp(scores - m_safe)
    denom = e.sum(dim=-1, keepdim=True)
    dead = denom == 0
    out = mm_blocks(e, v64, None, r0, rows_total=lq) / torch.where(dead, torch.ones_like(denom), denom)
    lse = torch.where(dead, torch.full_like(denom, float("-inf")), m_safe + torch.log(denom)).squeeze(-1)
    return out, lse


def _chunk_rows(chunk: int, row_elems: int, max_bytes: int | None = None) -> int:
    """Query rows per chunk: at most `chunk`, and few enough that one fp64 score block fits max_bytes
    (default REFERENCE_BLOCK_BYTES, read when called)."""
    cap = REFERENCE_BLOCK_BYTES if max_bytes is None else max_bytes
    return max(1, min(chunk, cap // (8 * row_elems)))
