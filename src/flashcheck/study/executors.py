"""Where case groups run: a local process pool (records stream back as each case ends) or Ray."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from flashcheck.study.cases import Case, CaseRecord, environment, evaluate_group

EXECUTORS = ("local", "ray")
_QUEUE = None


def _init_worker(q) -> None:
    global _QUEUE
    _QUEUE = q


def _pool_task(cases: list[Case]) -> int:
    return evaluate_group(cases, lambda rec: _QUEUE.put(rec.to_json()))


def _failed(cases: list[Case], message: str) -> list[CaseRecord]:
    env = environment()
    return [CaseRecord(c.case_id, c, "failed", {}, {}, 0.0, message, env) for c in cases]


def run_local(groups: list[list[Case]], workers: int, on_record: Callable[[CaseRecord], None]) -> int:
    """Run groups on `workers` spawned processes; call on_record for each case as it finishes.
    Returns the number of FP64 references computed."""
    import json

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    refs = 0

    def drain(block: bool) -> None:
        while True:
            try:
                line = q.get(timeout=0.05) if block else q.get_nowait()
            except queue_mod.Empty:
                return
            on_record(CaseRecord.from_dict(json.loads(line)))
            block = False

    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as pool:
        pending = {pool.submit(_pool_task, g): g for g in groups}
        while pending:
            done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            drain(block=False)
            for fut in done:
                group = pending.pop(fut)
                try:
                    refs += fut.result()
                except Exception as exc:  # the worker died: its unfinished cases are recorded as failed
                    drain(block=True)
                    for rec in _failed(group, f"worker failed: {type(exc).__name__}: {exc}"):
                        on_record(rec)
        drain(block=True)
    return refs


def run_ray(
    groups: list[list[Case]],
    workers: int,
    on_record: Callable[[CaseRecord], None],
    address: str | None = None,
    temp_dir: str | Path | None = None,
) -> int:
    """Run groups as Ray tasks (local Ray with `workers` CPUs, or the cluster at `address`)."""
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs ray: pip install 'flashcheck[ray]'") from None
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = False
    if not ray.is_initialized():
        kwargs = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        if temp_dir and not address:
            kwargs["_temp_dir"] = str(Path(temp_dir).resolve())
        ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        started = True

    @ray.remote(num_cpus=1)
    def task(cases: list[Case]) -> tuple[int, list[str]]:
        records: list[str] = []
        n = evaluate_group(cases, lambda rec: records.append(rec.to_json()))
        return n, records

    import json

    refs = 0
    try:
        pending = {task.remote(g): g for g in groups}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                group = pending.pop(ref)
                try:
                    n, lines = ray.get(ref)
                except Exception as exc:
                    for rec in _failed(group, f"ray task failed: {type(exc).__name__}: {exc}"):
                        on_record(rec)
                    continue
                refs += n
                for line in lines:
                    on_record(CaseRecord.from_dict(json.loads(line)))
    finally:
        if started:
            ray.shutdown()
    return refs
