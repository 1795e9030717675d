"""Realistic attention-kernel bugs as kernels: one clean tiled kernel, and mutants that each add one bug.

The clean kernel is FlashAttention-2 as GPU kernels run it: inputs in their dtype, scores, running max m,
running sum l and the output accumulator in fp32, P rounded to the input dtype before each product, one
division at the end, LSE saved for a recomputing backward (delta = rowsum(dO * O) from the fp32 O, dS
rounded to the input dtype before dQ and dK). Every kernel has a user kernel's signature:

    fn(q, k, v, *, causal=False, scale=None) -> out
    q [B, H, Lq, D], k and v [B, Hkv, Lk, D] (Hkv divides H), out [B, H, Lq, D] in q's dtype; causal
    masks bottom-right aligned; differentiable (the backward is the kernel's own, not autograd's).

Suffixes: _j one key block, _f fp32 working copy. Keys are padded with zeros to a multiple of the block.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

BLOCK_K = 64  # keys per tile, as flash-attn 2 uses for head dim > 64 (128 x 64 tiles)
LN2 = math.log(2.0)
LOW = (torch.bfloat16, torch.float16)
ALL = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bug:
    """The one thing a mutant does wrong (all defaults: the correct kernel)."""

    scale_error: float = 0.0  # softmax scale multiplied by (1 + scale_error) in the forward
    drop_keys: int = 0  # the last `drop_keys` keys are skipped (a loop bound off by that much)
    drop_last_block: bool = False  # the last key block is never visited
    causal_shift: int = 0  # -1: the diagonal is masked too; +1: one future key is visible
    skip_rescale_block: int | None = None  # in this key block, O is not rescaled when the max grows
    stale_max: bool = False  # the new running max is never stored back
    stale_sum: bool = False  # O is divided by the running sum from before the last key block
    accum_lowp: bool = False  # the output accumulator is kept in the input dtype, not fp32
    gqa_modulo: bool = False  # query head h reads K/V head h % Hkv instead of h // (H / Hkv)
    pad_unmasked: bool = False  # the zero keys padding the last block are not masked
    lse_log2: bool = False  # LSE saved in log2 units (exp2 kernel), read back as natural log
    dk_scale_error: float = 0.0  # dK multiplied by (1 + dk_scale_error) (a wrong scale in the backward)
    delta_lowp_o: bool = False  # delta = rowsum(dO * O) from O rounded to the input dtype
    ds_row_error: float = 0.0  # dS = P (dP - (1 + e) delta): dS rows no longer sum to zero

    def describe(self) -> str:
        """The fields that differ from the correct kernel's, as 'name=value' ('none' for the correct one)."""
        changed = [
            f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) != _NONE[f.name]
        ]
        return ", ".join(changed) or "none"


_NONE = {f.name: f.default for f in fields(Bug)}
CORRECT = Bug()


def _round(x_f: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32) rounded to `dtype` and back: what storing it in that dtype keeps."""
    return x_f.to(dtype).to(torch.float32)


def _head_map(hq: int, hkv: int, bug: Bug) -> torch.Tensor:
    """For each query head, the K/V head it reads."""
    h = torch.arange(hq)
    return h % hkv if bug.gqa_modulo else h // (hq // hkv)


def _key_blocks(lk: int, bug: Bug) -> list[tuple[int, int]]:
    """Key tiles (start, stop) over the keys padded to a multiple of BLOCK_K."""
    padded = -(-lk // BLOCK_K) * BLOCK_K
    spans = [(c0, c0 + BLOCK_K) for c0 in range(0, padded, BLOCK_K)]
    return spans[:-1] if bug.drop_last_block and len(spans) > 1 else spans


def _visible(rows: int, c0: int, c1: int, lq: int, lk: int, causal: bool, bug: Bug) -> torch.Tensor:
    """[Lq, c1 - c0] bool: which keys of the tile each query row may see."""
    j = torch.arange(c0, c1).unsqueeze(0)
    keep = j < lk - bug.drop_keys
    if bug.pad_unmasked:
        keep = keep | (j >= lk)
    if causal:
        i = torch.arange(rows).unsqueeze(-1)
        keep = keep & (j <= i + (lk - lq) + bug.causal_shift)
    return keep


def _scores(q_f, k_j, c0, c1, lq, lk, sc, causal, bug):
    s = torch.matmul(q_f, k_j.transpose(-1, -2)) * sc
    return s.masked_fill(~_visible(lq, c0, c1, lq, lk, causal, bug), -math.inf)


def _pad_keys(x: torch.Tensor) -> torch.Tensor:
    """x [B, H, Lk, D] with zero rows appended up to a multiple of BLOCK_K."""
    return torch.nn.functional.pad(x, (0, 0, 0, -x.shape[-2] % BLOCK_K))


def _forward(q_f, k_f, v_f, lk, sc, causal, bug, dtype):
    """Online softmax over key tiles. Returns (O fp32 [B, H, Lq, D], LSE [B, H, Lq, 1] natural log)."""
    lq = q_f.shape[-2]
    o = torch.zeros(*q_f.shape[:-1], v_f.shape[-1])
    m = torch.full((*q_f.shape[:-1], 1), -math.inf)
    l = torch.zeros_like(m)
    l_before_last = l
    blocks = _key_blocks(lk, bug)
    for n, (c0, c1) in enumerate(blocks):
        s = _scores(q_f, k_f[..., c0:c1, :], c0, c1, lq, lk, sc * (1 + bug.scale_error), causal, bug)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        l_before_last = l
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        o = (o if bug.skip_rescale_block == n else alpha * o) + torch.matmul(_round(p, dtype), v_f[..., c0:c1, :])
        if bug.accum_lowp:
            o = _round(o, dtype)
        if not bug.stale_max:
            m = m_new
    l_div = l_before_last if bug.stale_sum else l
    o = o / torch.where(l_div == 0, torch.ones_like(l_div), l_div)
    lse = torch.where(l == 0, torch.full_like(l, -math.inf), m + torch.log(l))
    return o, lse


def _backward(q_f, k_f, v_f, o_f, lse, do_f, lk, sc, causal, bug, dtype):
    """FA2 backward: P recomputed from LSE, dS = P (dP - delta), dS rounded to the dtype for dQ and dK."""
    lq = q_f.shape[-2]
    o_d = _round(o_f, dtype) if bug.delta_lowp_o else o_f
    delta = (do_f * o_d).sum(dim=-1, keepdim=True) * (1 + bug.ds_row_error)
    lse_read = lse / LN2 if bug.lse_log2 else lse  # log2 units read as natural log
    lse_safe = torch.where(torch.isneginf(lse_read), torch.full_like(lse_read, math.inf), lse_read)
    dq, dk, dv = torch.zeros_like(q_f), torch.zeros_like(k_f), torch.zeros_like(v_f)
    for c0, c1 in _key_blocks(lk, bug):
        k_j, v_j = k_f[..., c0:c1, :], v_f[..., c0:c1, :]
        p = torch.exp(_scores(q_f, k_j, c0, c1, lq, lk, sc * (1 + bug.scale_error), causal, bug) - lse_safe)
        dv[..., c0:c1, :] = torch.matmul(_round(p, dtype).transpose(-1, -2), do_f)
        ds = _round(p * (torch.matmul(do_f, v_j.transpose(-1, -2)) - delta), dtype)
        dq = dq + torch.matmul(ds, k_j) * sc
        dk[..., c0:c1, :] = torch.matmul(ds.transpose(-1, -2), q_f) * sc * (1 + bug.dk_scale_error)
    return dq, dk, dv


def _sum_heads(g: torch.Tensor, heads: torch.Tensor, hkv: int, lk: int) -> torch.Tensor:
    """Per-query-head K/V gradients [B, H, Lpad, D] summed into the K/V heads they read [B, Hkv, Lk, D]."""
    out = torch.zeros(g.shape[0], hkv, *g.shape[2:], dtype=g.dtype)
    out.index_add_(1, heads, g)
    return out[..., :lk, :]


class _TiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float | None, bug: Bug):
        hq, hkv, lk = q.shape[1], k.shape[1], k.shape[-2]
        heads = _head_map(hq, hkv, bug)
        k_f, v_f = _pad_keys(k.float()[:, heads]), _pad_keys(v.float()[:, heads])
        sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
        o_f, lse = _forward(q.float(), k_f, v_f, lk, sc, causal, bug, q.dtype)
        ctx.save_for_backward(q, k_f, v_f, o_f, lse)
        ctx.args = (causal, sc, bug, heads, hkv, lk)
        return o_f.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k_f, v_f, o_f, lse = ctx.saved_tensors
        causal, sc, bug, heads, hkv, lk = ctx.args
        do_f = dout.to(q.dtype).float()
        dq, dk, dv = _backward(q.float(), k_f, v_f, o_f, lse, do_f, lk, sc, causal, bug, q.dtype)
        dk, dv = (_sum_heads(g, heads, hkv, lk) for g in (dk, dv))
        return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), None, None, None


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    bug: Bug = CORRECT,
) -> torch.Tensor:
    """FA2 with fp32 statistics and accumulator, plus `bug` (default none): q [B, H, Lq, D], k, v
    [B, Hkv, Lk, D] on the CPU in one dtype -> [B, H, Lq, D] in that dtype."""
    if q.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"expected q [B, H, Lq, D] and k, v [B, Hkv, Lk, D] with Hkv | H; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _TiledFunction.apply(q, k, v, causal, scale, bug)


@dataclass(frozen=True, slots=True)
class Mutant:
    """A kernel with one bug. `dtypes`: where it is a bug (rounding to fp32 is no bug in fp32);
    `causal_only`: the bug lives in the causal mask; `needs_gqa`: in the K/V head mapping; `backward`:
    only gradients are wrong; `source`: where the bug is reported."""

    name: str
    description: str
    bug: Bug
    dtypes: tuple[torch.dtype, ...] = ALL
    causal_only: bool = False
    needs_gqa: bool = False
    backward: bool = False
    source: str = ""

    @property
    def fn(self) -> Callable[..., torch.Tensor]:
        return functools.partial(tiled_attention, bug=self.bug)


def correct_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """The mutants' kernel without a bug (see tiled_attention)."""
    return tiled_attention(q, k, v, causal=causal, scale=scale)


def _m(name: str, description: str, **kw) -> Mutant:
    opts = {key: kw.pop(key) for key in ("dtypes", "causal_only", "needs_gqa", "backward", "source") if key in kw}
    return Mutant(name, description, Bug(**kw), **opts)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        _m("scale-0.5%", "softmax scale off by 0.5%", scale_error=0.005),
        _m("scale-1%", "softmax scale off by 1%", scale_error=0.01),
        _m("scale-3%", "softmax scale off by 3%", scale_error=0.03),
        _m("drop-last-key", "the last key is skipped (loop bound off by one)", drop_keys=1),
        _m("drop-last-block", "the last key block is never visited", drop_last_block=True),
        _m("causal-no-diagonal", "causal mask excludes the diagonal", causal_shift=-1, causal_only=True),
        _m("causal-future-key", "causal mask lets one future key through", causal_shift=1, causal_only=True),
        _m("no-rescale-block-1", "O not rescaled when the running max grows in key block 1", skip_rescale_block=1),
        _m("stale-max", "the running max is never stored back across blocks", stale_max=True),
        _m("stale-sum", "O divided by the running sum from before the last key block", stale_sum=True),
        _m("accum-lowp", "output accumulator in the input dtype instead of fp32", accum_lowp=True, dtypes=LOW),
        _m("gqa-modulo", "GQA head mapping h % Hkv instead of h // group", gqa_modulo=True, needs_gqa=True),
        _m("pad-unmasked", "zero keys padding the last block are not masked", pad_unmasked=True),
        _m("lse-log2", "LSE saved in log2 units, read as natural log", lse_log2=True, backward=True),
        _m("dk-scale-1%", "dK scaled 1% off", dk_scale_error=0.01, backward=True),
        _m(
            "delta-lowp-o",
            "delta = rowsum(dO * O) from O rounded to the input dtype",
            delta_lowp_o=True,
            dtypes=LOW,
            backward=True,
            source="arXiv 2510.04212",
        ),
        _m(
            "ds-row-sum",
            "dS rows sum to -2^-8 * delta instead of zero (delta one bf16 step off)",
            ds_row_error=2.0**-8,
            backward=True,
            source="arXiv 2609.34272",
        ),
    )
}


def get_mutant(name: str) -> Mutant:
    """The mutant called `name`; ValueError names the allowed ones."""
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; expected one of {', '.join(MUTANTS)}") from None
