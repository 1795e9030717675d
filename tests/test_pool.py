"""core.pool: a worker killed at any instant costs only its own job, and the pool always stops."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from flashcheck.core.pool import WorkerDied, WorkerPool, send_to_parent

CTX = mp.get_context("spawn")


def _square(x: int) -> int:
    send_to_parent(f"working on {x}")
    return x * x


def _boom(x: int) -> int:
    raise ValueError(f"bad {x}")


def _flood_then_die(n: int) -> int:
    """Send n large messages from a second thread while the main thread kills the process mid-stream."""
    sender = threading.Thread(target=lambda: [send_to_parent(b"x" * 200_000) for _ in range(n)], daemon=True)
    sender.start()
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


def _slow(x: int) -> int:
    time.sleep(x)
    return x


def _collect(pool: WorkerPool, want: int, limit_s: float = 60.0) -> list[tuple]:
    got, end = [], time.time() + limit_s
    while sum(kind != "emit" for kind, *_ in got) < want:
        assert time.time() < end, got
        got.extend(pool.events(0.1))
    return got


def test_jobs_emit_then_answer_and_an_exception_is_reported_not_fatal():
    with WorkerPool(2, CTX) as pool:
        pool.submit("a", _square, 3)
        pool.submit("b", _boom, 4)
        got = _collect(pool, 2)
        assert ("emit", "a", "working on 3") in got and ("done", "a", 9) in got
        assert ("error", "b", "ValueError: bad 4") in got
        pool.submit("c", _square, 5)  # the worker that raised lives on
        assert ("done", "c", 25) in _collect(pool, 1)
        with pytest.raises(ValueError, match="no idle worker"):
            pool.submit("d", _slow, 1)
            pool.submit("e", _slow, 1)
            pool.submit("f", _slow, 1)


def test_a_worker_killed_while_it_sends_costs_only_its_job_and_the_pool_stops_at_once():
    start = time.time()
    with WorkerPool(2, CTX) as pool:
        pool.submit("dies", _flood_then_die, 50)
        pool.submit("lives", _square, 7)
        got = _collect(pool, 2)
        died = [g for g in got if g[0] == "died"]
        assert len(died) == 1 and died[0][1] == "dies" and isinstance(died[0][2], WorkerDied)
        assert "exit code -9" in str(died[0][2]) and died[0][2].exitcode == -9
        assert ("done", "lives", 49) in got
        assert all(len(p) == 200_000 for kind, key, p in got if kind == "emit" and key == "dies")  # whole only
        pool.submit("after", _square, 2)  # the surviving worker takes more
        assert ("done", "after", 4) in _collect(pool, 1)
    assert time.time() - start < 60


def test_leaving_on_an_exception_kills_busy_workers_without_waiting():
    start = time.time()
    with pytest.raises(KeyboardInterrupt), WorkerPool(1, CTX) as pool:
        pool.submit("long", _slow, 120)
        raise KeyboardInterrupt
    assert time.time() - start < 30


def test_fresh_context_leaves_the_process_wide_forkserver_preload_as_it_was() -> None:
    from multiprocessing import forkserver

    from flashcheck.core.pool import fresh_context

    if "forkserver" not in mp.get_all_start_methods():
        pytest.skip("no forkserver start method here")
    mine = ["json", "os"]
    mp.get_context("forkserver").set_forkserver_preload(mine)
    try:
        fresh_context(["torch"])
        assert forkserver._forkserver._preload_modules == mine
    finally:
        mp.get_context("forkserver").set_forkserver_preload(["__main__"])
