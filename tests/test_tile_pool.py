"""The forward's query-tile pool (kernels.sim.flash._run_tiles): sized by the cores free, the same bits whatever
the worker count, single-threaded ops under a pool or a serial run of several tiles."""

from __future__ import annotations

import os
import threading

import torch

import flashcheck.kernels.sim.flash as flash_mod
from flashcheck.core.numerics import parse_policy
from flashcheck.kernels import flash_attention
from flashcheck.kernels.sim.tiles import free_cores

QUERY_TILE = flash_mod._query_tile


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def test_free_cores_reads_the_instant_and_the_average_load():
    n = _cores()
    assert free_cores("0.00 0.00 0.00 1/300 42\n") == n  # only this task running
    assert free_cores("1.00 0.00 0.00 3/300 42\n", own_running=3) == n  # this caller's own minute of work
    assert free_cores(f"{n + 20:.2f} 20.0 20.0 {n + 30}/400 42\n") == 1  # busy by both counts: never below 1
    assert free_cores(f"{n + 20:.2f} 20.0 20.0 1/400 42\n") == 1  # a busy minute, a quiet instant: busy
    assert free_cores(f"0.10 20.0 20.0 {n + 30}/400 42\n", own_running=1) == 1  # others running now: busy
    assert free_cores("2.00 0.00 0.00 1/300 42\n", own_load=0.0) == max(1, n - 1)  # one other core's worth of load
    assert 1 <= free_cores("not a loadavg") <= n  # falls back to os.getloadavg
    assert 1 <= free_cores() <= n
    # this process's own two threads of the last minute are not another task's load
    assert free_cores("2.00 0.00 0.00 1/300 42\n", own_running=1, own_load=2.0) == n
    assert free_cores("3.00 0.00 0.00 1/300 42\n", own_running=1, own_load=2.0) == max(1, n - 1)


def _run(monkeypatch, free: int, threads: int):
    """(out, lse, {thread idents}, {intra-op thread counts}) of a 4-tile forward at `threads` threads."""
    monkeypatch.setattr(flash_mod, "free_cores", lambda: free)
    monkeypatch.setattr(flash_mod, "TILE_BYTES", 2 * 32 * 4 * 24)  # 24 rows of one fp32 key block, H=2
    real, idents, counts = QUERY_TILE, set(), set()

    def spy(*a):
        idents.add(threading.get_ident())
        counts.add(torch.get_num_threads())
        return real(*a)

    monkeypatch.setattr(flash_mod, "_query_tile", spy)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 90, 16, generator=g, dtype=torch.float64) for _ in range(3))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse = flash_attention(q, k, v, policy="bf16-mixed", block_k=32, causal=True, return_lse=True)
        assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    return out, lse, idents, counts


def test_pool_worker_count_moves_no_bit(monkeypatch):
    serial = _run(monkeypatch, free=1, threads=2)
    pooled = _run(monkeypatch, free=2, threads=2)
    one = _run(monkeypatch, free=2, threads=1)
    assert serial[2] == {threading.get_ident()} and serial[3] == {1}  # busy: no pool, ops single-threaded
    assert pooled[3] == {1}  # each worker's ops single-threaded
    assert len(one[2]) == 1 and one[3] == {1}
    for other in (pooled, one):
        assert torch.equal(serial[0], other[0]) and torch.equal(serial[1], other[1])


def test_single_tile_keeps_the_intra_op_threads(monkeypatch):
    monkeypatch.setattr(flash_mod, "free_cores", lambda: 1)
    seen = []
    monkeypatch.setattr(flash_mod, "_query_tile", lambda *a: seen.append(torch.get_num_threads()) or QUERY_TILE(*a))
    q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.float64) for _ in range(3))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        flash_attention(q, k, v, policy="bf16-mixed", block_k=16)
    finally:
        torch.set_num_threads(before)
    assert seen == [2]  # one tile: its ops on every intra-op thread, busy or not (the BLAS's sums stay as they were)


def test_busy_rounds_the_inputs_single_threaded(monkeypatch):
    """Busy, several tiles: the input rounding runs on one thread too (element-wise casts: no bit moves); idle, on
    every intra-op thread."""
    monkeypatch.setattr(flash_mod, "TILE_BYTES", 2 * 32 * 4 * 24)
    real, seen = flash_mod.round_inputs, []
    monkeypatch.setattr(
        flash_mod, "round_inputs", lambda *a, **kw: seen.append(torch.get_num_threads()) or real(*a, **kw)
    )
    q, k, v = (torch.randn(1, 2, 90, 16, dtype=torch.float64) for _ in range(3))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs = []
        for free in (1, 2):
            monkeypatch.setattr(flash_mod, "free_cores", lambda free=free: free)
            outs.append(flash_attention(q, k, v, policy="bf16-mixed", block_k=32))
            assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2] and torch.equal(outs[0], outs[1])


def test_the_pool_is_kept_and_made_again_after_a_fork(monkeypatch):
    """The workers of one forward serve the next (no threads made per forward); in another process (a forked
    child, whose copy of the pool has no threads) a new pool is made, with the same bits."""
    first = _run(monkeypatch, free=2, threads=2)
    pool = flash_mod._POOL["pool"]
    second = _run(monkeypatch, free=2, threads=2)
    assert flash_mod._POOL["pool"] is pool and flash_mod._POOL["pid"] == os.getpid()
    workers = {t.ident for t in pool._threads} | {threading.get_ident()}  # the pool's one thread and the caller
    assert first[2] | second[2] <= workers
    assert torch.equal(first[0], second[0])
    real_pid = os.getpid()
    monkeypatch.setattr(flash_mod.os, "getpid", lambda: real_pid + 1)  # as in a forked child: the pool's threads
    third = _run(monkeypatch, free=2, threads=2)  # are the parent's, so a new pool is made
    assert flash_mod._POOL["pool"] is not pool and flash_mod._POOL["pid"] == real_pid + 1
    assert torch.equal(first[0], third[0])


def test_the_pool_takes_the_costliest_tiles_first():
    """Under the causal mask later query rows see more keys: the pool hands tiles out by their score elements, most
    first (greedy largest-first), so two workers end together; without a mask every tile costs the same and the
    row order stays."""
    lq = 2048
    cfg = flash_mod.FlashConfig(policy=parse_policy("bf16-mixed"), block_k=128, causal=True)
    steps = flash_mod._steps(cfg, lq, lq)
    tiles = [(r, r + 512) for r in range(0, lq, 512)]
    order = flash_mod._costliest_first(tiles, steps)
    assert order == tiles[::-1]

    def work(rows):  # the score elements of a tile, counted row by row from the causal rule (j <= i)
        return sum(min(-(-(i + 1) // 128) * 128, lq) for i in range(*rows))

    ends = [0, 0]
    for rows in order:  # each tile to the worker free first, as _pool's workers take the next tile
        ends[ends.index(min(ends))] += work(rows)
    in_rows = [0, 0]
    for rows in tiles:
        in_rows[in_rows.index(min(in_rows))] += work(rows)
    assert max(ends) < max(in_rows) and max(ends) <= sum(ends) / 2 * 1.05
    plain = flash_mod._steps(flash_mod.FlashConfig(policy=parse_policy("bf16-mixed"), block_k=128), lq, lq)
    assert flash_mod._costliest_first(tiles, plain) == tiles
