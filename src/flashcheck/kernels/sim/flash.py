"""Tiled Flash Attention (FA1 and FA2 forward, FA2 backward) with every stage under a numerics policy.

Shapes: q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv]. The forward runs over query tiles of
TILE_BYTES' worth of score rows (so a step's block stays in cache), and within a tile over key blocks,
each step updating the tile's rows at once (a row's result depends on the key tiling, not on block_q,
which sets FP8 block scales and which rows a causal tile touches; the query tiles move it by a few units in
the last place at most, where a BLAS sums a tile's partial row panel in another order: see kernels.sim.tiles).
The backward's loop runs over key blocks only. Suffixes: _r rows of a step, _j the current key block.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flashcheck.core.numerics import Format, Policy, info, parse_policy
from flashcheck.kernels.formats.fastmath import column_mask, exp2_fa4, mm_accumulate, rcp_approx
from flashcheck.kernels.native import backward as native_bwd
from flashcheck.kernels.native.presets import ex2_columns
from flashcheck.kernels.native.rounding import max_sub_
from flashcheck.kernels.native.step import acc_update, softmax_step, tile_forward
from flashcheck.kernels.sim.fp8 import casts_only, round_inputs
from flashcheck.kernels.sim.gradfix import RowSumFix, delta_operand, visible
from flashcheck.kernels.sim.masks import bias_is_bounded, first_row_needing, tile_bias
from flashcheck.kernels.sim.mma_ops import MMAOperands, held_v_scale, p_operand, pv_accumulate, qk_scores
from flashcheck.kernels.sim.ops import (
    cast_scratch,
    mm,
    prescale_is_exact,
    resolve_scale,
    rnd,
    rnd_,
    rnd_fresh,
    safe_max,
    scores_are_finite,
    settle_exp,
)
from flashcheck.kernels.sim.quantized import quantize_p, uses_quantized_inputs
from flashcheck.kernels.sim.reference import sink_logits
from flashcheck.kernels.sim.tiles import MIN_ROWS, free_cores, mm_rows, row_chunks, rows_per_chunk
from flashcheck.kernels.sim.validation import check_attention_inputs, empty_attention, expand_kv_heads, is_empty

ALGORITHMS = ("fa1", "fa2")
KEY_ORDERS = ("forward", "reverse", "shuffle")
LOG2E = math.log2(math.e)
TILE_BYTES = 2 * 2**20  # one forward step's score block [B, H, rows, Bc]: cache-sized


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashConfig:
    """Everything but the tensors. `key_order`: forward, reverse, shuffle (seeded by order_seed) or an
    explicit permutation of key-block indices. `exp2`: scores in log2 units with log2(e) folded into
    the scale, as FA2 kernels compute them. `p_probe(p, p_cast)`: called with each forward step's P before and
    after its cast (see _knob_step); from the query tiles' threads, so it must be thread-safe. `sink`: sink
    logits [H] (forward only), added to l at the end as FA4's finalize does. `keys`: the key range (start, stop),
    whole key blocks, the forward runs over (one split of split-KV decoding, see forward_keys); None: every key."""

    policy: Policy
    block_q: int = 128
    block_k: int = 128
    algorithm: str = "fa2"
    causal: bool = False
    mask: torch.Tensor | None = None
    scale: float | None = None
    key_order: str | tuple[int, ...] = "forward"
    order_seed: int = 0
    exp2: bool = False
    hadamard_seed: int = 0
    tie_beta: float | None = None
    p_probe: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    sink: torch.Tensor | None = None
    keys: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.tie_beta is not None and (self.algorithm != "fa2" or not self.tie_beta > 1):
            raise ValueError(f"tie_beta={self.tie_beta!r} needs algorithm fa2 and a value > 1")
        if (step_knobs(self.policy) or self.p_probe is not None) and (self.algorithm != "fa2" or self.tie_beta):
            raise ValueError(
                f"the stage knobs {sorted(self.policy.knobs())} and p_probe need algorithm fa2 without tie_beta"
            )
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.keys is not None and (self.keys[0] % self.block_k or not 0 <= self.keys[0] <= self.keys[1]):
            raise ValueError(f"keys={self.keys!r} must be a range (start, stop) of whole key blocks of {self.block_k}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
        if isinstance(self.key_order, str) and self.key_order not in KEY_ORDERS:
            raise ValueError(
                f"unknown key_order {self.key_order!r}; expected one of "
                f"{', '.join(KEY_ORDERS)} or a permutation of block indices"
            )

    def blocks(self, lk: int) -> list[tuple[int, int]]:
        """Key blocks (start, stop) in processing order (those inside `keys` only, in the same order)."""
        spans = self._ordered([(c0, min(lk, c0 + self.block_k)) for c0 in range(0, lk, self.block_k)])
        if self.keys is None:
            return spans
        k0, k1 = self.keys
        return [(c0, c1) for c0, c1 in spans if k0 <= c0 and c1 <= k1]

    def _ordered(self, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        order = self.key_order
        if order == "forward":
            return spans
        if order == "reverse":
            return spans[::-1]
        if order == "shuffle":
            g = torch.Generator().manual_seed(self.order_seed)
            return [spans[i] for i in torch.randperm(len(spans), generator=g).tolist()]
        idx = list(order)
        if sorted(idx) != list(range(len(spans))):
            raise ValueError(f"key_order {tuple(idx)} is not a permutation of range({len(spans)})")
        return [spans[i] for i in idx]


@dataclass(frozen=True, slots=True)
class _Tiles:
    """One step's key block and the query rows it touches."""

    c0: int
    c1: int
    r0: int


def _steps(cfg: FlashConfig, lq: int, lk: int) -> list[_Tiles]:
    out = []
    for c0, c1 in cfg.blocks(lk):
        r0 = first_row_needing(c0, lq, lk) if cfg.causal else 0
        if r0 < lq:
            out.append(_Tiles(c0, c1, r0))
    return out


def _scores(q_r, k_j, t: _Tiles, lq: int, lk: int, cfg: FlashConfig, pol: Policy, sc: float):
    """rnd_score(sc * q_r k_j^T) plus the tile's mask, [B, H, Lq - r0, c1 - c0]."""
    s = rnd(mm(q_r, k_j.transpose(-1, -2), pol).mul_(sc), pol, "score")
    bias = tile_bias((t.r0, lq), (t.c0, t.c1), lq, lk, causal=cfg.causal, mask=cfg.mask, dtype=s.dtype)
    if bias is not None:
        s = s + (bias * LOG2E if cfg.exp2 else bias)
    return s


def _forward(q, k, v, cfg: FlashConfig, pol: Policy, tile_rows: int | None = None, parts: dict | None = None, ops=None):
    """Returns (out_hi, out, lse): the normalised accumulator before output rounding, the output, and
    the log-sum-exp [B, H, Lq, 1] (in log2 units when cfg.exp2). Query tiles of `tile_rows` rows
    (None: sized by TILE_BYTES; Lq: one tile, every row at once) agree to a few units in the last place
    (bit for bit where the BLAS sums every row of a product alike; tests/test_scale.py bounds it). `parts`:
    round_inputs' NVFP4 pieces of q, k, v (the block-scaled MMA's operands, kernels.sim.mma_ops), or None. `ops`:
    the MMAOperands of q, k, v made already (None: made here).

    On a busy CPU (fewer cores free than threads) a run of several tiles is single-threaded throughout: its
    tiles' ops are so already (see _run_tiles), and the few ops around them are element-wise or exact
    (amax, amin), so no bit moves; each parallel region would wait on a descheduled thread (measured at
    load 8-13 on 2 cores, L=2048: 3.1 s at 2 threads with the tiles serial, 1.3 s at 1 thread)."""
    if tile_rows is None:
        tile_rows = _tile_rows(q.shape, k.shape[-2], cfg.block_k, q.dtype, _mma(pol))
    if not _busy(q, tile_rows):
        return _forward_tiles(q, k, v, cfg, pol, tile_rows, parts, ops)
    with _one_thread():
        return _forward_tiles(q, k, v, cfg, pol, tile_rows, parts, ops)


def _tile_rows(q_shape: torch.Size, lk: int, block_k: int, work: torch.dtype, even: bool = False) -> int:
    """Query rows per tile: a step's score block [B, H, rows, block_k] within TILE_BYTES. even: an odd number
    of tiles (more than one) becomes the next even one of about equal rows, so two workers share them evenly
    (fa3-fp8-fp22 at L=2048: 5 tiles of 409 rows ran as 3 + 2; the count does not depend on the workers)."""
    b, h, lq, _ = q_shape
    rows = rows_per_chunk(lq, b * h * min(block_k, lk) * work.itemsize, TILE_BYTES)
    n = len(row_chunks(lq, rows))
    return max(MIN_ROWS, -(-lq // (n + 1))) if even and n > 1 and n % 2 else rows


def _mma(pol: Policy) -> bool:
    """Whether both of the policy's products are a tensor core's MMA (kernels.tensorcore.mma): exact row by row, so its
    bits do not depend on the tile rows (a BLAS product's may), and its tiles are costly enough to balance."""
    return bool(pol.qk_mma and pol.score != Format.FP64 and pol.pv_mma and pol.accum != Format.FP64)


def _busy(q: torch.Tensor, tile_rows: int) -> bool:
    """True when a forward of several query tiles on the CPU should run single-threaded throughout: fewer cores
    are free than intra-op threads (see _forward; a single tile keeps its thread count, which its BLAS products
    may depend on)."""
    threads = torch.get_num_threads()
    if q.device.type != "cpu" or threads == 1 or len(row_chunks(q.shape[-2], tile_rows)) == 1:
        return False
    return free_cores() < threads


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _forward_tiles(q, k, v, cfg: FlashConfig, pol: Policy, tile_rows: int, parts: dict | None = None, ops=None):
    """_forward at tile_rows rows per query tile."""
    b, h, lq, _ = q.shape
    lk, dv = k.shape[-2], v.shape[-1]
    work = q.dtype
    o = torch.empty(b, h, lq, dv, dtype=work, device=q.device)
    m = torch.empty(b, h, lq, 1, dtype=work, device=q.device)
    l = torch.empty(b, h, lq, 1, dtype=work, device=q.device)
    steps = _steps(cfg, lq, lk)
    tiles = row_chunks(lq, tile_rows)
    if ops is None:  # the tensor-core models' operands, or None
        ops = MMAOperands.make(q, k, v, pol, cfg.block_q, cfg.block_k, parts)
    sc = _score_scale(cfg, q.shape[-1])
    fold = prescale_is_exact(q, k, sc) and (ops is None or ops.model_qk is None)
    # a scale that is no power of two (head dims 32, 96, 128, 256): NaN-free scores still take the tile in C; a
    # user mask too where its bias cannot make a NaN (_mask_keeps_nan_free)
    finite = fold or (_plain_config(q.dtype, cfg, pol, ops) and scores_are_finite(q, k, sc))
    finite = finite and _mask_keeps_nan_free(cfg, pol)
    kv = _GroupedKV(q, k, v) if k.shape[1] != h else None  # grouped heads: repeated only where a tile needs it
    _run_tiles(q, k, v, tiles, steps, cfg, pol, fold, ops, out=(o, m, l), finite=finite, kv=kv)
    if cfg.sink is not None:  # FA4 finalize: l += exp(sink - m), m the row max without the sink (or the sink)
        sk = cfg.sink.to(l.dtype).view(1, -1, 1, 1) * (LOG2E if cfg.exp2 else 1.0)
        m = torch.where(torch.isneginf(m), sk, m)
        exp = torch.exp2 if cfg.exp2 else torch.exp
        l = rnd(l + exp(sk - m), pol, "stats")
    dead = l == 0
    v_scale = held_v_scale(ops, pol, work)
    if v_scale is not None:  # o in the P·V MMA's units: V's descale folded into 1 / row sum, as the kernels do
        o = rnd(o * _held_factor(l, dead, v_scale, pol), pol, "accum")
    elif cfg.algorithm == "fa2" and pol.approx_recip and pol.stats != Format.FP64:
        o = rnd(o * rcp_approx(torch.where(dead, torch.ones_like(l), l)), pol, "accum")
    elif cfg.algorithm == "fa2":
        o = rnd(o / torch.where(dead, torch.ones_like(l), l), pol, "accum")
    log = torch.log2 if cfg.exp2 else torch.log
    lse = torch.where(dead, torch.full_like(l, -math.inf), rnd(m + log(l), pol, "stats"))
    return o, rnd_fresh(o, pol, "output"), lse


def _mask_keeps_nan_free(cfg: FlashConfig, pol: Policy) -> bool:
    """Whether the user mask's bias (if any) keeps NaN-free scores below 2^126 NaN-free: a bool mask or a bounded
    float one (masks.bias_is_bounded), added to scores rounded to a format that holds 2^126 (an fp16 score of
    +inf, plus a -inf bias, would be NaN)."""
    if cfg.mask is None:
        return True
    return info(pol.stage("score")).max >= 2.0**126 and bias_is_bounded(cfg.mask)


def _held_factor(l: torch.Tensor, dead: torch.Tensor, v_scale: torch.Tensor, pol: Policy) -> torch.Tensor:
    """The float32 factor that takes O from MMA units to its normalised value [B, H, Lq, 1]: 1 / (the row sum of
    P in the MMA's units, l * p_scale) times V's descale in float32, as FA3's Softmax::finalize(v_descale)
    (hopper/softmax.h: inv_sum * final_scale, 0 where the sum is 0) and FA4's correction epilogue
    (flash_attn/cute/flash_fwd_sm100.py: rcp_approx(row_sum) * v_descale) form it; one rounding each."""
    row_sum = l * pol.p_scale if pol.p_scale != 1.0 else l
    inv = rcp_approx(torch.where(dead, torch.ones_like(row_sum), row_sum))
    inv = torch.where(dead, torch.zeros_like(inv), inv)
    return inv * v_scale.to(torch.float32)


def _run_tiles(
    q,
    k,
    v,
    tiles: list[tuple[int, int]],
    steps: list[_Tiles],
    cfg: FlashConfig,
    pol: Policy,
    fold: bool,
    ops,
    out,
    finite: bool = False,
    kv: _GroupedKV | None = None,
) -> None:
    """_query_tile of every tile, each written into its rows of out = (o, m, l) by the thread that ran it. On the
    CPU, tiles run side by side on up to torch's intra-op thread count (no more than the cores free now, see
    tiles.free_cores), each op single-threaded: a step's ops are small, and one parallel region per op waits on
    every core (on a busy machine, tens of milliseconds per op). With one worker the tiles run one after another,
    still single-threaded (as each worker's ops run); a single tile runs its ops on all the intra-op threads (a
    BLAS may sum a product's rows in another order on another thread count, so that count stays as it was). The
    tiles are the same whatever the worker count (tile_rows does not depend on it), so every op sees the same
    tensors and no bit moves. The workers are a pool kept for the process (_pool): threads, and the BLAS's
    per-thread buffers, are not made again for every forward."""

    def put(rows: tuple[int, int], res) -> None:
        r0, r1 = rows
        for full, part in zip(out, res, strict=True):
            full[..., r0:r1, :] = part

    threads = torch.get_num_threads()
    if q.device.type != "cpu" or threads == 1 or len(tiles) == 1:
        for rows in tiles:
            put(rows, _query_tile(q, k, v, rows, steps, cfg, pol, fold, ops, finite, kv))
        return
    workers = min(len(tiles), threads, free_cores())

    inference = torch.is_inference_mode_enabled()  # thread-local: the pool's threads take the caller's mode

    def one(rows: tuple[int, int]) -> None:
        torch.set_num_threads(1)
        with torch.inference_mode(inference):  # out made under inference mode is written in place by the workers
            put(rows, _query_tile(q, k, v, rows, steps, cfg, pol, fold, ops, finite, kv))

    try:
        if workers <= 1:
            for rows in tiles:
                one(rows)
            return
        _pool(workers, _costliest_first(tiles, steps), one)
    finally:
        torch.set_num_threads(threads)


def _costliest_first(tiles: list[tuple[int, int]], steps: list[_Tiles]) -> list[tuple[int, int]]:
    """The tiles by their score elements (rows each step reaches times its key block's width), most first: under
    the causal mask a tile's work grows with its rows, so workers taking tiles in row order end unevenly (L=2048,
    4 tiles of work 1:2:3:4 on 2 workers: 6 units against 5). Largest first is the classic greedy schedule; each
    tile's rows are computed alone, so the order moves no bit."""

    def work(rows: tuple[int, int]) -> int:
        return sum(max(0, rows[1] - max(rows[0], t.r0)) * (t.c1 - t.c0) for t in steps)

    return sorted(tiles, key=work, reverse=True)  # stable: equal tiles (non-causal) keep their order


_POOL: dict = {}  # "pid", "size", "pool": the tile workers of this process (see _pool)


def _pool(workers: int, tiles: list[tuple[int, int]], one: Callable[[tuple[int, int]], None]) -> None:
    """one(rows) for every tile on `workers` threads: the calling thread and workers - 1 threads of a pool kept
    for the process (made again after a fork, or to grow), each taking the next tile as it finishes one (in the
    order given: _run_tiles gives the costliest first, so the last ones finish about together)."""
    from concurrent.futures import ThreadPoolExecutor

    if _POOL.get("pid") != os.getpid() or _POOL.get("size", 0) < workers - 1:
        _POOL.update(pid=os.getpid(), size=workers - 1, pool=ThreadPoolExecutor(workers - 1, "flashcheck-tile"))
    todo, lock = iter(tiles), threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                rows = next(todo, None)
            if rows is None:
                return
            one(rows)

    futures = [_POOL["pool"].submit(drain) for _ in range(workers - 1)]
    try:
        drain()
    finally:
        for f in futures:
            f.result()


@dataclass(frozen=True, slots=True)
class _Scratch:
    """A query tile's reused step buffers (flat, so a step of fewer rows or a narrower key block takes a
    contiguous prefix, laid out as a fresh tensor would be): the score block, its copy cast to the `p`
    stage's dtype, the P·V product, and a second score block (_knob_step's P or its cast, whichever s does
    not hold). Allocating these per step cost more than the arithmetic (each is a fresh mapping of zeroed
    pages), and a step's values are the same in either."""

    s: torch.Tensor
    p: torch.Tensor
    pv: torch.Tensor
    e: torch.Tensor

    @staticmethod
    def make(rows: int, cols: int, dv: int, dtype: torch.dtype, pol: Policy, device: torch.device) -> _Scratch:
        """rows: B * H * tile rows; cols: the widest key block."""
        s, pv, e = (torch.empty(n, dtype=dtype, device=device) for n in (rows * cols, rows * dv, rows * cols))
        return _Scratch(s, cast_scratch(rows * cols, dtype, pol, "p", device), pv, e)

    @staticmethod
    def view(buf: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return buf[: math.prod(shape)].view(shape)


def _query_tile(
    q, k, v, rows: tuple[int, int], steps: list[_Tiles], cfg: FlashConfig, pol: Policy, fold: bool = False, ops=None,
    finite: bool = False, kv: _GroupedKV | None = None,
):  # fmt: skip
    """(o, m, l) [B, H, r1 - r0, Dv or 1] of query rows r0:r1 after every key block: the online softmax of
    those rows alone, each step on the rows its key block reaches (from max(r0, t.r0)), in place. `fold`:
    the score scale is a power of two that ops.prescale_is_exact allows into the tile's Q (same bits, one
    pass over each score block fewer). `ops`: the MMAOperands of the policy's tensor-core models (or None).
    `finite`: the scores, the mask's bias added, are NaN-free (fold, or ops.scores_are_finite, and
    masks.bias_is_bounded: see _forward_tiles). `kv`: k and v hold
    grouped K / V heads (fewer than q's), which the whole-tile C reads as they are; the step loop takes them
    repeated to q's heads from kv."""
    r0, r1 = rows
    (b, h), dv = q.shape[:2], v.shape[-1]
    sc = _score_scale(cfg, q.shape[-1])
    q_t = q[..., r0:r1, :] * sc if fold else q[..., r0:r1, :]
    exp = torch.exp2 if cfg.exp2 else torch.exp
    o = torch.zeros(b, h, r1 - r0, dv, dtype=q.dtype, device=q.device)
    m = torch.full((b, h, r1 - r0, 1), -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros(b, h, r1 - r0, 1, dtype=q.dtype, device=q.device)
    step = _fa1_step if cfg.algorithm == "fa1" else _fa2_step
    extra = {"tie_beta": cfg.tie_beta} if cfg.tie_beta is not None else {}
    if step is _fa2_step and finite:  # finite inputs, no overflow, a bounded mask (see _forward_tiles)
        extra["nan_free"] = True
    if step_knobs(pol) or cfg.p_probe is not None:
        step, extra = _knob_step, {"log2": cfg.exp2, "probe": cfg.p_probe, "block_k": cfg.block_k}
    lq, lk, sc_s = q.shape[-2], k.shape[-2], 1.0 if fold else sc
    whole = step is _fa2_step and extra.get("nan_free")  # the whole tile in one C call where it applies
    if whole and _whole_tile(q_t, (k, v, lq), rows, steps, cfg, pol, ops, sc_s, (o, m, l)):
        return o, m, l
    k, v = kv.repeated() if kv is not None else (k, v)
    width = max((t.c1 - t.c0 for t in steps), default=0)
    scratch = _Scratch.make(b * h * (r1 - r0), width, dv, q.dtype, pol, q.device)
    pv_full = _Scratch.view(scratch.pv, (b, h, r1 - r0, dv))
    held = held_v_scale(ops, pol, q.dtype) is not None  # o in the P·V MMA's units throughout (see pv_accumulate)
    for t in steps:
        a = max(r0, t.r0)
        if a >= r1:
            continue
        i = a - r0  # i = 0 (every non-causal step): the tile's own tensors, no slicing, m and l rebound
        rows_i = (
            (q_t, o, m, l, pv_full) if i == 0 else (q_t[..., i:, :], o[..., i:, :], m[..., i:, :], l[..., i:, :], None)
        )
        q_i, o_i, m_i, l_i, pv = rows_i
        mma_qk = None
        if ops is not None and ops.model_qk is not None:
            mma_qk = (ops.q.rows(a, r1), ops.k.rows(t.c0, t.c1), ops.model_qk, ops.qk_c(a, r1, t.c0, t.c1))
        s = _tile_scores(q_i, k, (a, r1, lq, lk), t, cfg, pol, sc_s, scratch.s, mma_qk)
        pv = _Scratch.view(scratch.pv, (b, h, r1 - a, dv)) if pv is None else pv
        args = (s, v[..., t.c0 : t.c1, :], o_i, m_i, l_i, pol, exp, lq - t.r0)  # lq - t.r0: the rows unchunked
        more = {}
        if step is _knob_step and ops is not None and ops.model_pv is not None:
            more = {"mma_v": (ops.v_block(t.c0, t.c1), ops.model_pv, held)}
        m_new, l_new = step(*args, (scratch.p, pv, scratch.e), **extra, **more)
        if i == 0:
            m, l = m_new, l_new
        else:
            m[..., i:, :], l[..., i:, :] = m_new, l_new
    return o, m, l


def _whole_tile(
    q_t, kvl, rows: tuple[int, int], steps: list[_Tiles], cfg: FlashConfig, pol: Policy, ops, scale: float, oml
) -> bool:
    """True when the nan_free FA2 query tile of `rows` (q_t: its rows of Q; kvl: K, V and Lq) ran in one C call
    (kernels.native.step.tile_forward: _fused_step's bits, the scores times `scale` unless 1) into oml = (o, m, l),
    or had no step to run; False (nothing touched): the step loop runs it."""
    k, v, lq = kvl
    plan = _tile_plan(steps, rows, lq)
    if plan is None or not _plain_config(q_t.dtype, cfg, pol, ops):
        return False
    if not plan[0]:  # no key block reaches these rows (causal, Lq > Lk): nothing to run
        return True
    p_dtype = _p_dtype(pol, q_t.dtype)
    causal = (rows[0], k.shape[-2] - lq) if cfg.causal else None
    o, m, l = oml
    mask = None if cfg.mask is None else _rows_mask(cfg.mask, rows)
    return p_dtype is not None and tile_forward(
        q_t, k, v, plan[0], o, m, l, p_dtype, starts=plan[1], scale=scale, causal=causal, mask=mask
    )


def _rows_mask(mask: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
    """The user mask (2 to 4 dims, broadcastable to [B, H, Lq, Lk]) of query rows r0:r1 as 4 dims, bool, or
    float32 (a float mask's m.to(float32), as masks.tile_bias takes it: the same values): a view where it can be."""
    m = mask[(None,) * (4 - mask.dim())]
    m = m[..., rows[0] : rows[1], :] if m.shape[-2] != 1 else m
    return m if m.dtype == torch.bool else m.to(torch.float32)


class _GroupedKV:
    """Grouped K / V heads [B, Hkv, Lk, D] of a forward of H query heads, repeated to H heads (expand_kv_heads)
    once, by the first query tile that needs them (thread-safe: the tile pool's workers share it)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.q, self.k, self.v = q, k, v
        self.full: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lock = threading.Lock()

    def repeated(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            if self.full is None:
                self.full = expand_kv_heads(self.q, self.k, self.v)
            return self.full


def _plain_config(work: torch.dtype, cfg: FlashConfig, pol: Policy, ops) -> bool:
    """Whether every step of a nan_free FA2 query tile takes _fused_step's path with the whole accumulator
    update in C and nothing else on the rows but the masks' bias (causal, and a user mask: tile_forward adds it),
    torch's float32 product for the scores (no MMA model, no narrow accumulator) in the working dtype, the stats
    and accumulator stages the working dtype, natural exp, no tie_beta, no stage knobs or probe."""
    return (
        work == torch.float32
        and cfg.algorithm == "fa2"
        and not cfg.exp2
        and cfg.tie_beta is None
        and cfg.p_probe is None
        and not step_knobs(pol)
        and (ops is None or ops.model_qk is None)
        and not (pol.qk_acc_bits and pol.score != Format.FP64)
        and all(info(pol.stage(st)).dtype == work for st in ("score", "stats", "accum"))
    )


def _tile_plan(steps: list[_Tiles], rows: tuple[int, int], lq: int) -> tuple[list, list[int]] | None:
    """The key blocks (c0, c1) a query tile's rows r0:r1 run through, and each one's first row in the tile (a
    causal step starts at its first row that sees the block, as _query_tile's loop); None where a step's product
    would be padded (mm_rows: fewer rows than min(MIN_ROWS, its rows unchunked)), which tile_forward does not do."""
    r0, r1 = rows
    spans, starts = [], []
    for t in steps:
        a = max(r0, t.r0)
        if a >= r1:
            continue
        if r1 - a < min(MIN_ROWS, lq - t.r0):
            return None
        spans.append((t.c0, t.c1))
        starts.append(a - r0)
    return spans, starts


def _p_dtype(pol: Policy, work: torch.dtype) -> torch.dtype | None:
    """The dtype _fused_step rounds P to in C (the working dtype: none), or None where it cannot."""
    p_fmt = pol.stage("p")
    return work if info(p_fmt).dtype == work else _NATIVE_P.get(p_fmt)


def _score_scale(cfg: FlashConfig, head_dim: int) -> float:
    return resolve_scale(cfg.scale, head_dim) * (LOG2E if cfg.exp2 else 1.0)


def _tile_scores(
    q_r, k, rows: tuple[int, int, int, int], t: _Tiles, cfg: FlashConfig, pol: Policy, sc: float, buf, mma_qk=None
):
    """rnd_score(sc * q_r k_j^T) plus the tile's mask, for query rows r0:r1 (q_r, of Lq) and key block t (of
    Lk): [B, H, r1 - r0, c1 - c0], formed in the flat buffer `buf`. sc = 1 skips the multiply. mma_qk (the
    step's Q and K operands, the policy's qk_mma model and the MMA's initial C or None): the tensor core's
    product of the codes, descaled."""
    r0, r1, lq, lk = rows
    out = _Scratch.view(buf, (*q_r.shape[:-2], r1 - r0, t.c1 - t.c0))
    if mma_qk is not None:  # kernels.tensorcore.mma: the FP8/FP4 MMA as the hardware computes it, scale folded in once
        q_op, k_op, model, c = mma_qk
        prod, sc = qk_scores(q_op, k_op, model, sc, out=out, c=c), 1.0
    elif pol.qk_acc_bits and pol.score != Format.FP64:  # the Q K^T MMA's narrow accumulator (fastmath)
        k_t = k[..., t.c0 : t.c1, :].transpose(-1, -2)
        prod = out.copy_(mm_accumulate(q_r, k_t, pol.qk_acc_bits))
    else:
        prod = mm_rows(q_r, k[..., t.c0 : t.c1, :].transpose(-1, -2), pol, lq - t.r0, out=out)
    s = rnd_(prod if sc == 1.0 else prod.mul_(sc), pol, "score")
    bias = tile_bias((r0, r1), (t.c0, t.c1), lq, lk, causal=cfg.causal, mask=cfg.mask, dtype=s.dtype)
    if bias is not None:
        bias = bias.to(s.device)
        s.add_(bias * LOG2E if cfg.exp2 else bias)
    return s


def _fa2_step(
    s, v_j, o, m, l, pol: Policy, exp, untiled: int, bufs, tie_beta: float | None = None, nan_free: bool = False
):
    """Rescale the unnormalised accumulator o (updated in place; returns m, l); P~ stays in the working
    dtype until the P·V product. bufs: the p-stage scratch and the P·V output (see _Scratch).

    With tie_beta (arXiv 2510.04212's fix), a row whose block maximum is tied subtracts beta * max
    (max > 0) or 0 (max < 0) instead of max, so no entry of P is exactly 1; softmax is unchanged.
    nan_free: no score can be NaN (finite inputs, no overflow, no float mask), so the max step may run fused in
    one pass (kernels.native.rounding.max_sub_) where the stats stage is the working dtype, or the whole softmax and the
    accumulator update in C (kernels.native.step), where that applies: the same bits either way."""
    fused = None
    if nan_free and tie_beta is None and info(pol.stats).dtype == s.dtype:
        done = _fused_step(s, v_j, o, m, l, pol, untiled, bufs) if exp is torch.exp else None
        if done is not None:
            return done
        fused = max_sub_(s, m)
    if fused is not None:
        m_new, ms = fused
    else:
        mt = s.amax(dim=-1, keepdim=True)
        if tie_beta is not None:
            tied = (s == mt).sum(dim=-1, keepdim=True) >= 2
            mt = torch.where(tied, torch.where(mt > 0, tie_beta * mt, torch.zeros_like(mt)), mt)
        m_new = rnd(torch.maximum(m, mt), pol, "stats")
        ms = safe_max(m_new)
        s.sub_(ms)
    alpha = rnd(exp(m - ms), pol, "stats")
    p = exp(s, out=s)
    l = rnd(alpha * l + p.sum(dim=-1, keepdim=True), pol, "stats")
    pv = rnd_(mm_rows(rnd_(p, pol, "p", bufs[0]), v_j, pol, untiled, out=bufs[1]), pol, "accum")
    rnd_(rnd_(o.mul_(alpha), pol, "accum").add_(pv), pol, "accum")
    return m_new, l


def _fused_step(s, v_j, o, m, l, pol: Policy, untiled: int, bufs):
    """_fa2_step (natural exp, no tie_beta, NaN-free s, stats in the working dtype) with its softmax in one C pass
    per row (kernels.native.step.softmax_step) and, where the accumulator is the working dtype, its update
    too: (m_new, l_new), or None (nothing touched) where the routine does not apply."""
    p_dtype = _p_dtype(pol, s.dtype)
    done = None if p_dtype is None else softmax_step(s, m, l, p_dtype)
    if done is None:
        return None
    m_new, l_new, alpha = done
    pv = rnd_(mm_rows(s, v_j, pol, untiled, out=bufs[1]), pol, "accum")
    if info(pol.stage("accum")).dtype != o.dtype or not acc_update(o, alpha, pv):
        rnd_(rnd_(o.mul_(alpha), pol, "accum").add_(pv), pol, "accum")
    return m_new, l_new


_NATIVE_P = {Format.BF16: torch.bfloat16, Format.FP16: torch.float16}  # P formats kernels.native.rounding rounds


def step_knobs(pol: Policy) -> bool:
    """True when the policy sets a knob of the forward step (P scaling, accumulator, exp2, rescale threshold)."""
    return bool(
        pol.p_scale != 1.0 or pol.p_scaling or pol.acc_bits or pol.pv_mma or pol.exp2_emu or pol.rescale_threshold
    )


def _knob_step(
    s, v_j, o, m, l, pol: Policy, exp, untiled: int, bufs, *, log2: bool, block_k: int, probe=None, mma_v=None
):
    """_fa2_step with the stage knobs of FA4 and the quantized kernels (see Policy): conditional rescaling
    (the max moves only when it grows by more than rescale_threshold, in log2 units; P then reaches up to
    2^threshold), FA4's emulated exp2 on its columns, P scaled / quantised before P·V (kernels.sim.quantized),
    and the P·V MMA's narrow accumulator, one-level (into O) or promoted every acc_promote keys. Without knobs
    it computes what _fa2_step does; `probe(p, p_cast)` (FlashConfig.p_probe) sees each step's P before and
    after its cast (the cast in p_scale units), e.g. to count P values that underflow. mma_v (V's operand for
    the key block, the policy's pv_mma model, and whether O stays in the MMA's units, mma_ops.held_v_scale):
    the P·V MMA as kernels.tensorcore.mma computes it (kernels.sim.mma_ops)."""
    mt = s.amax(dim=-1, keepdim=True)
    m_new = rnd(torch.maximum(m, mt), pol, "stats")
    if pol.rescale_threshold > 0:
        thr = pol.rescale_threshold if log2 else pol.rescale_threshold * math.log(2.0)
        m_new = torch.where(torch.isfinite(m) & (m_new - m <= thr), m, m_new)
    ms = safe_max(m_new)
    alpha = rnd(exp(m - ms), pol, "stats")
    x = s.sub_(ms)
    low_p = pol.p != Format.FP64
    # a second block for P or its cast (bufs[2]; not where a probe sees them: it may keep them)
    e = _Scratch.view(bufs[2], s.shape) if len(bufs) > 2 and s.dtype == torch.float32 and probe is None else None
    if pol.exp2_emu and low_p:
        # FA4's key block is always block_k columns wide (a ragged last one masked): columns by that width
        cols = column_mask(max(x.shape[-1], block_k), pol.exp2_emu, pol.exp2_emu_res, pol.exp2_emu_start)
        cols = cols[: x.shape[-1]]
        # natural-log scores: one more rounding than FA4's FMA
        p = exp2_fa4(x if log2 else x * LOG2E, cols, ex2_columns, out=e)
    else:
        p = exp(x, out=s)
    l = rnd(alpha * l + p.sum(dim=-1, keepdim=True), pol, "stats")
    spare = None if probe is not None else (e if p is s else s)  # the scores are spent: s may take P's cast
    pc, sc = (quantize_p(p, pol, out=spare), pol.p_scale) if low_p else (p, 1.0)
    if probe is not None:
        probe(p, pc)
    if mma_v is not None and info(pol.stage("accum")).dtype == o.dtype:  # the rescale folded into the P·V MMA's start
        pv_accumulate(p_operand(pc, pol), mma_v[0], o, sc, pol, mma_v[1], alpha=alpha, buf=bufs[1], held=mma_v[2])
        return m_new, l
    rnd_(o.mul_(alpha), pol, "accum")
    if mma_v is not None:
        pv_accumulate(p_operand(pc, pol), mma_v[0], o, sc, pol, mma_v[1])
        rnd_(o, pol, "accum")
        return m_new, l
    if pol.acc_bits and pol.accum != Format.FP64:
        if pol.acc_promote:
            pv = mm_accumulate(pc, v_j, pol.acc_bits, promote=pol.acc_promote, nearest=pol.acc_nearest)
            o.add_(pv.div_(sc) if sc != 1.0 else pv)
        else:
            init = o * sc if sc != 1.0 else o
            o.copy_(mm_accumulate(pc, v_j, pol.acc_bits, init=init, nearest=pol.acc_nearest))
            if sc != 1.0:
                o.div_(sc)
        rnd_(o, pol, "accum")
        return m_new, l
    pv = mm_rows(pc, v_j, pol, untiled)
    rnd_(o.add_(rnd_(pv.div_(sc) if sc != 1.0 else pv, pol, "accum")), pol, "accum")
    return m_new, l


def _fa1_step(s, v_j, o, m, l, pol: Policy, exp, untiled: int, bufs):
    """FlashAttention-1 Algorithm 1: the output is kept normalised after every key block (o updated in
    place; returns m, l)."""
    mt = s.amax(dim=-1, keepdim=True)
    pt = rnd_(exp(s.sub_(safe_max(mt)), out=s), pol, "p", bufs[0])
    lt = rnd(pt.sum(dim=-1, keepdim=True), pol, "stats")
    m_new = rnd(torch.maximum(m, mt), pol, "stats")
    ms = safe_max(m_new)
    a = rnd(exp(m - ms), pol, "stats")
    bt = rnd(exp(mt - ms), pol, "stats")
    l_new = rnd(a * l + bt * lt, pol, "stats")
    pv = rnd_(mm_rows(pt, v_j, pol, untiled, out=bufs[1]), pol, "accum")
    rnd_(o.mul_(rnd(l * a, pol, "stats")).add_(pv.mul_(bt)), pol, "accum")
    rnd_(o.div_(torch.where(l_new == 0, torch.ones_like(l_new), l_new)), pol, "accum")
    return m_new, l_new


def _backward(q, k, v, out_hi, lse, dout, cfg: FlashConfig, pol: Policy):
    """FA2 backward: recompute P from the saved LSE; delta = rowsum(dO * O); dS = P * (dP - delta)."""
    lq, lk = q.shape[-2], k.shape[-2]
    s_nat = resolve_scale(cfg.scale, q.shape[-1])
    sc = s_nat * (LOG2E if cfg.exp2 else 1.0)
    exp = torch.exp2 if cfg.exp2 else torch.exp
    do = rnd(dout.to(q.dtype), pol, "grad_input")
    delta = rnd((do * delta_operand(out_hi, pol)).sum(dim=-1, keepdim=True), pol, "grad_score")
    lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    fix = RowSumFix(q) if pol.ds_correction else None
    p_dtype = _native_backward((q, k, v, do, dq, dk, dv, lse_safe, delta), cfg, pol, sc) if fix is None else None
    mask = None if p_dtype is None or cfg.mask is None else _rows_mask(cfg.mask, (0, lq))  # float32 once
    for t in _steps(cfg, lq, lk):
        q_r, do_r = q[..., t.r0 :, :], do[..., t.r0 :, :]
        k_j, v_j = k[..., t.c0 : t.c1, :], v[..., t.c0 : t.c1, :]
        if p_dtype is not None:  # the same products; the passes between them in C (kernels.native.backward)
            s = mm(q_r, k_j.transpose(-1, -2), pol)
            causal = (t.r0, t.c0, lk - lq) if cfg.causal else None
            p_g = native_bwd.probs(s, sc, lse_safe[..., t.r0 :, :], p_dtype, causal, _block_mask(mask, t))  # s: P
            dv[..., t.c0 : t.c1, :] = mm(p_g.transpose(-1, -2), do_r, pol)
            ds = native_bwd.ds(mm(do_r, v_j.transpose(-1, -2), pol), s, delta[..., t.r0 :, :], p_dtype)
            native_bwd.scale_add(dq[..., t.r0 :, :], mm(ds, k_j, pol), s_nat, True)
            native_bwd.scale_add(dk[..., t.c0 : t.c1, :], mm(ds.transpose(-1, -2), q_r, pol), s_nat, False)
            continue
        p = exp(_scores(q_r, k_j, t, lq, lk, cfg, pol, sc).sub_(lse_safe[..., t.r0 :, :]))
        dv[..., t.c0 : t.c1, :] = rnd(mm(rnd(p, pol, "grad_p").transpose(-1, -2), do_r, pol), pol, "grad_accum")
        dp = rnd(mm(do_r, v_j.transpose(-1, -2), pol), pol, "grad_score")
        ds = rnd(rnd(p * (dp - delta[..., t.r0 :, :]), pol, "grad_score"), pol, "grad_p")
        if fix is not None:
            fix.add(t.r0, ds, k_j, _visible(t, lq, lk, cfg, q.dtype))
        dq_r = rnd(mm(ds, k_j, pol) * s_nat, pol, "grad_accum")
        dq[..., t.r0 :, :] = rnd(dq[..., t.r0 :, :] + dq_r, pol, "grad_accum")
        dk[..., t.c0 : t.c1, :] = rnd(mm(ds.transpose(-1, -2), q_r, pol) * s_nat, pol, "grad_accum")
    if fix is not None:
        dq, dk = _remove_ds_row_sums(fix, q, dq, dk, cfg, pol, s_nat)
    return tuple(rnd(g, pol, "grad_output") for g in (dq, dk, dv))


def _backward_heads(q, k, v, out_hi, lse, dout, cfg: FlashConfig, pol: Policy):
    """_backward on the CPU's free cores: the B * H heads in as many parts as workers, side by side on the tile
    pool (_pool), each part's ops single-threaded; busy (fewer cores free than threads), one part on one thread.
    A head's gradients depend on that head alone (no op of _backward mixes heads; Policy.ds_correction's row-sum
    fix and a user mask with its own batch or head entries stay whole), and the products of one thread give the
    bits of two (each matrix of a batched product is summed alike: tests/test_backward_heads.py, bit_identity), so
    no bit moves. Before, the backward's ops each ran on every intra-op thread: on a busy machine each of its
    ~100 parallel regions waited on a descheduled thread (2 threads at load 4-6: 2-3x SDPA's time)."""
    n, threads = q.shape[0] * q.shape[1], torch.get_num_threads()
    mask = cfg.mask
    whole = pol.ds_correction or (mask is not None and any(s != 1 for s in mask.shape[:-2]))
    if q.device.type != "cpu" or threads == 1 or n == 1 or whole:
        return _backward(q, k, v, out_hi, lse, dout, cfg, pol)
    workers = min(n, threads, free_cores())
    if workers == 1:
        with _one_thread():
            return _backward(q, k, v, out_hi, lse, dout, cfg, pol)
    flat = [t.reshape(n, 1, *t.shape[2:]) for t in (q, k, v, out_hi, lse, dout)]
    parts = [(n * i // workers, n * (i + 1) // workers) for i in range(workers)]
    grads: dict = {}

    def one(part: tuple[int, int]) -> None:
        torch.set_num_threads(1)
        with torch.no_grad():
            grads[part] = _backward(*(t[part[0] : part[1]] for t in flat), cfg, pol)

    try:
        _pool(workers, parts, one)
    finally:
        torch.set_num_threads(threads)
    return tuple(
        torch.cat([grads[p][i] for p in parts]).reshape(*t.shape[:2], *grads[parts[0]][i].shape[2:])
        for i, t in enumerate((q, k, v))
    )


def _native_backward(tensors, cfg: FlashConfig, pol: Policy, sc: float) -> torch.dtype | None:
    """The dtype of the grad_p stage (float32: none) where _backward's passes between its products may run in C
    (kernels.native.backward) with torch's bits, else None: float32 CPU tensors (q, k, v, dO, the gradients, the
    LSE and delta, contiguous), natural exp, the score, grad_score and grad_accum stages float32 itself, and inputs
    whose scores, dP and delta are finite (so nothing is NaN: a NaN's rounding to bf16 has more than one answer), a
    user mask's bias included (masks.bias_is_bounded)."""
    q, k, v, do = tensors[:4]
    if cfg.exp2 or any(pol.stage(st) != Format.FP32 for st in ("score", "grad_score", "grad_accum")):
        return None
    p_dtype = {Format.FP32: torch.float32, **_NATIVE_P}.get(pol.stage("grad_p"))
    if p_dtype is None or not native_bwd.usable(p_dtype):
        return None
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return None
    finite = scores_are_finite(q, k, sc) and scores_are_finite(do, v, 1.0) and bias_is_bounded(cfg.mask)
    return p_dtype if finite else None


def _block_mask(mask: torch.Tensor | None, t: _Tiles) -> torch.Tensor | None:
    """The backward step's block of the user mask (4-D, _rows_mask's of every row): rows t.r0.., keys t.c0:t.c1."""
    if mask is None:
        return None
    mask = mask[..., t.r0 :, :] if mask.shape[-2] != 1 else mask
    return mask[..., t.c0 : t.c1] if mask.shape[-1] != 1 else mask


def _visible(t: _Tiles, lq: int, lk: int, cfg: FlashConfig, dtype: torch.dtype) -> torch.Tensor:
    return visible((t.r0, lq), (t.c0, t.c1), lq, lk, causal=cfg.causal, mask=cfg.mask, dtype=dtype)


def _remove_ds_row_sums(fix: RowSumFix, q, dq, dk, cfg: FlashConfig, pol: Policy, s_nat: float):
    """Policy.ds_correction: the rank-one corrections of dQ and dK (kernels.sim.gradfix), a second key pass."""
    lq, lk = q.shape[-2], dk.shape[-2]
    dk = dk.clone()
    for t in _steps(cfg, lq, lk):
        vis = _visible(t, lq, lk, cfg, q.dtype)
        dk[..., t.c0 : t.c1, :] = fix.fix_dk_tile(dk[..., t.c0 : t.c1, :], q[..., t.r0 :, :], t.r0, vis, s_nat, pol)
    return fix.fix_dq(dq, s_nat, pol), dk


def forward_keys(q, k, v, cfg: FlashConfig, ops: MMAOperands | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One split of split-KV decoding (kernels.sim.decode): the forward of q [B, H, Lq, D], k [B, H, Lk, D],
    v [B, H, Lk, Dv] as round_inputs returned them for the whole cache, over the key blocks of cfg.keys only
    (masks and causal alignment by the cache's own indices), the tensor-core models on `ops` (MMAOperands.make
    of the same q, k, v: the whole cache's codes and scales, or None). Returns the normalised accumulator before
    output rounding [B, H, Lq, Dv] and the LSE [B, H, Lq, 1] (log2 units when cfg.exp2; -inf where a row sees
    no key of the range)."""
    out_hi, _, lse = _forward(q, k, v, cfg, cfg.policy, ops=ops)
    return out_hi, lse


class _FlashFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg: FlashConfig):
        pol = cfg.policy
        tile_rows = _tile_rows(q.shape, k.shape[-2], cfg.block_k, pol.work_dtype, _mma(pol))
        # busy: the input rounding (element-wise, so bit for bit on any thread count) single-threaded too
        parts: dict = {}  # NVFP4 inputs' pieces, for the block-scaled MMA
        with _one_thread() if _busy(q, tile_rows) else contextlib.nullcontext():
            qr, kr, vr, rot = round_inputs(
                q.detach(),
                k.detach(),
                v.detach(),
                pol,
                block_q=cfg.block_q,
                block_k=cfg.block_k,
                hadamard_seed=cfg.hadamard_seed,
                parts=parts,
            )
            out_hi, out, lse = _forward(qr, kr, vr, cfg, pol, parts=parts)
        ctx.save_for_backward(qr, kr, vr, out_hi, lse)
        ctx.cfg, ctx.rot, ctx.dtypes = cfg, rot, (q.dtype, k.dtype, v.dtype)
        ctx.mark_non_differentiable(lse)
        return out, lse.squeeze(-1)

    @staticmethod
    def backward(ctx, dout, _dlse):
        qr, kr, vr, out_hi, lse = ctx.saved_tensors
        dq, dk, dv = _backward_heads(qr, kr, vr, out_hi, lse, dout, ctx.cfg, ctx.cfg.policy)
        if ctx.rot is not None:  # Q' = Q M, K' = K M, so dQ = dQ' M^T (straight through the rounding)
            rot_t = ctx.rot.T.to(dq.dtype)
            dq, dk = dq @ rot_t, dk @ rot_t
        dq, dk, dv = (g.to(dt) for g, dt in zip((dq, dk, dv), ctx.dtypes, strict=True))
        return dq, dk, dv, None


def _grouped_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: FlashConfig) -> bool:
    """Whether a forward (no autograd) may keep grouped K / V heads as they are (no repeated copy): its inputs are
    only cast, element by element (so rounding the groups and repeating them is the same), and its query tiles
    may run in C (_plain_config), which reads each group for its query heads; the step loop repeats them itself."""
    pol = cfg.policy
    if k.shape[1] == q.shape[1] or cfg.sink is not None or pol.qk_mma or pol.pv_mma or not casts_only(q, k, v, pol):
        return False
    return _plain_config(pol.work_dtype, cfg, pol, None) and cfg.keys is None


def _refuse_autograd(cfg: FlashConfig, grads: bool) -> None:
    """ValueError for what the FA2 backward cannot differentiate: a mask that requires grad (it would get none and
    silently not train), sink logits or a policy that quantizes its inputs under autograd."""
    mask, pol = cfg.mask, cfg.policy
    if torch.is_grad_enabled() and mask is not None and mask.requires_grad:
        raise ValueError(
            "mask requires grad, but the simulated kernel differentiates q, k and v only (the mask would get no "
            "gradient and silently not train): pass mask.detach(), or use standard_attention for a learned bias"
        )
    if cfg.sink is not None and (cfg.algorithm != "fa2" or grads):
        raise ValueError("sink logits run in the fa2 forward only (no autograd)")
    if grads and uses_quantized_inputs(pol):  # the backward would round dO to int8 / fp4 without scales
        raise ValueError(
            f"policy {pol.name!r} quantizes its inputs (SageAttention / FP4 presets): forward only, no autograd; "
            "the forward stage knobs of FA4 (exp2_emu, rescale_threshold, p_scale) run with the FA2 backward"
        )


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    policy: Policy | str = "bf16-mixed",
    block_q: int = 128,
    block_k: int = 128,
    algorithm: str = "fa2",
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    key_order: str | Sequence[int] = "forward",
    order_seed: int = 0,
    exp2: bool = False,
    hadamard_seed: int = 0,
    tie_beta: float | None = None,
    p_probe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    sink: float | torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Tiled online-softmax attention under `policy`, differentiable through the FA2 backward.

    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (Hkv divides H) -> out [B, H, Lq, Dv] in
    the policy's working dtype (and with `return_lse` the log-sum-exp [B, H, Lq], natural log unless
    exp2). Causal masks are bottom-right aligned (query i sees key j <= i + Lk - Lq); fully masked
    rows, and every row when Lk = 0, give 0 (kernels.sim.validation has the input rule). `mask`: bool
    (True = keep) or floating (added to the scores), 2 to 4 dims broadcasting to [B, H, Lq, Lk] (a key padding
    mask [B, 1, 1, Lk]: kernels.sim.masks.key_padding_mask), combined with `causal`; it gets no gradient (one
    that requires grad is refused: pass mask.detach()). Memory O(Lq * block_k). See FlashConfig for the options."""
    settle_exp()  # see ops.settle_exp: the first exp of a process can be inaccurate
    pol = parse_policy(policy)
    # resolved before the inputs are rounded: SageAttention3's rounded Q and K carry 2 D columns (kernels.formats.sage3)
    scale = resolve_scale(check_attention_inputs(q, k, v, mask=mask, scale=scale), q.shape[-1])
    order = key_order if isinstance(key_order, str) else tuple(int(i) for i in key_order)
    order = pol.kv_order or order  # the policy's KV iteration order, when it names one
    cfg = FlashConfig(
        policy=pol, block_q=block_q, block_k=block_k, algorithm=algorithm, causal=causal, mask=mask, scale=scale,
        key_order=order, order_seed=order_seed, exp2=exp2, hadamard_seed=hadamard_seed, tie_beta=tie_beta,
        p_probe=p_probe, sink=None if sink is None else sink_logits(sink, q.shape[1], q.device),
    )  # fmt: skip
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    _refuse_autograd(cfg, grads)
    if is_empty(q, k, v):
        out, lse = empty_attention(q, k, v, dtype=pol.work_dtype)
        return (out, lse) if return_lse else out
    if grads or not _grouped_forward(q, k, v, cfg):
        k, v = expand_kv_heads(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        out, lse = _FlashFunction.apply(q, k, v, cfg)
    if return_lse:
        return out, (lse / LOG2E if exp2 else lse)
    return out
