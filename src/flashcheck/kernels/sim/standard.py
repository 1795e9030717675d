"""Standard ("baseline") attention: scores, softmax, P·V, each stage under a policy, in query chunks.

A query row's result depends on its own scores only, so the kernel runs over chunks of query rows whose
score block [B, H, rows, Lk] fits CHUNK_BYTES: memory O(rows * Lk), the same numbers as one L x L block.
Every product is formed in fixed blocks of query rows (kernels.sim.tiles.mm_blocks), so chunked and unchunked
results are bit-identical on any BLAS (tests/test_scale.py checks it against chunk_rows=Lq)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcheck.core.numerics import Policy, parse_policy
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.masks import tile_bias
from flashcheck.kernels.sim.ops import cast_scratch, prescale_is_exact, resolve_scale, rnd, rnd_, safe_max, settle_exp
from flashcheck.kernels.sim.tiles import mm_blocks, row_chunks, rows_max, rows_per_chunk
from flashcheck.kernels.sim.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty

CHUNK_BYTES = 32 * 2**20  # one chunk's scores [B, H, rows, Lk] in the working dtype


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
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Baseline attention under `policy`; differentiable (autograd rounds gradients at the same casts).

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (Hkv divides H) -> out [B, H, Lq, Dv] in
    the policy's working dtype, its values in policy.output. Causal masks are bottom-right aligned;
    `mask` is bool (True = keep) or additive, broadcastable to [B, H, Lq, Lk]; Lk = 0 gives zeros
    (kernels.sim.validation has the input rule). `chunk_rows`: query rows per chunk (None: sized by
    CHUNK_BYTES; Lq: one L x L block; every chunking gives the same bits). Memory O(chunk_rows * Lk)
    (O(Lq * Lk) with autograd)."""
    settle_exp()  # see ops.settle_exp: the first exp of a process can be inaccurate
    pol = parse_policy(policy)
    s = resolve_scale(check_attention_inputs(q, k, v, mask=mask, scale=scale), q.shape[-1])
    if pol.fp8_scaling == "block":
        raise ValueError("fp8_scaling='block' needs tiles; the standard kernel supports 'tensor' only")
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows={chunk_rows!r} must be a positive integer (or None)")
    if is_empty(q, k, v):
        return empty_attention(q, k, v, dtype=pol.work_dtype)[0]
    k, v = expand_kv_heads(q, k, v)
    lq, lk = q.shape[-2], k.shape[-2]
    if chunk_rows is None:
        row_bytes = q.shape[0] * q.shape[1] * lk * pol.work_dtype.itemsize
        chunk_rows = rows_per_chunk(lq, row_bytes, CHUNK_BYTES)
    with torch.autocast(device_type=q.device.type, enabled=False):
        qr, kr, vr, _ = round_inputs(q, k, v, pol, hadamard_seed=hadamard_seed)
        kt = kr.transpose(-1, -2)
        chunks = row_chunks(lq, chunk_rows)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            outs = [_rows(qr, kt, vr, rows, (lq, lk), pol, s, causal, mask) for rows in chunks]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
        out = qr.new_empty((*qr.shape[:-1], vr.shape[-1]))  # each chunk written in place: no list, no cat copy
        bufs = _Buffers.make(qr.shape[0] * qr.shape[1] * rows_max(chunks) * lk, qr.dtype, pol, qr.device)
        fold = prescale_is_exact(qr, kr, s)
        for r0, r1 in chunks:
            out[..., r0:r1, :] = _rows_inplace(bufs, qr, kt, vr, (r0, r1), (lq, lk), pol, s, fold, causal, mask)
    return out


@dataclass(frozen=True, slots=True)
class _Buffers:
    """One chunk's score block in the working dtype and, when the `p` stage is narrower, its cast: reused by
    every chunk (a fresh block per chunk faults its pages in again, most of the time at long Lk)."""

    scores: torch.Tensor
    cast: torch.Tensor

    @staticmethod
    def make(n: int, dtype: torch.dtype, pol: Policy, device: torch.device) -> _Buffers:
        return _Buffers(torch.empty(n, dtype=dtype, device=device), cast_scratch(n, dtype, pol, "p", device))


def _rows_inplace(bufs: _Buffers, qr, kt, vr, rows, lens, pol: Policy, s: float, fold: bool, causal=False, mask=None):
    """_rows without autograd, every L-sized step in one reused buffer: the same operations on the same values
    (exp in place, the division in place), so the same bits. fold: Q's rows are scaled by s (exact, see
    ops.prescale_is_exact) and the scores are not."""
    (r0, r1), (lq, lk) = rows, lens
    q_r = qr[..., r0:r1, :] * s if fold else qr[..., r0:r1, :]
    scores = bufs.scores[: q_r.shape[0] * q_r.shape[1] * (r1 - r0) * lk].view(*q_r.shape[:-1], lk)
    mm_blocks(q_r, kt, pol, r0, out=scores, rows_total=lq)
    rnd_(scores if fold else scores.mul_(s), pol, "score")
    bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=scores.dtype)
    if bias is not None:
        scores.add_(bias.to(scores.device))
    e = rnd_(scores.sub_(safe_max(scores.amax(dim=-1, keepdim=True))).exp_(), pol, "p", bufs.cast)
    denom = rnd(e.sum(dim=-1, keepdim=True), pol, "stats")
    p = rnd_(e.div_(torch.where(denom == 0, torch.ones_like(denom), denom)), pol, "p", bufs.cast)
    return rnd(rnd(mm_blocks(p, vr, pol, r0, rows_total=lq), pol, "accum"), pol, "output")


def _rows(qr, kt, vr, rows: tuple[int, int], lens: tuple[int, int], pol: Policy, s: float, causal: bool, mask):
    """Output rows r0:r1 [B, H, r1 - r0, Dv]: scores, softmax and P·V of those query rows alone."""
    (r0, r1), (lq, lk) = rows, lens
    scores = rnd(mm_blocks(qr[..., r0:r1, :], kt, pol, r0, rows_total=lq) * s, pol, "score")
    bias = tile_bias((r0, r1), (0, lk), lq, lk, causal=causal, mask=mask, dtype=scores.dtype)
    if bias is not None:
        scores = scores + bias.to(scores.device)
    m = safe_max(scores.detach().amax(dim=-1, keepdim=True))
    e = rnd(torch.exp(scores - m), pol, "p")
    del scores  # at most two score-sized arrays alive beside a rounding temporary
    denom = rnd(e.sum(dim=-1, keepdim=True), pol, "stats")
    denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    p = rnd(e / denom, pol, "p")
    del e
    return rnd(rnd(mm_blocks(p, vr, pol, r0, rows_total=lq), pol, "accum"), pol, "output")
