"""Where case groups run: a local process pool (records stream back as each case ends) or Ray.

A worker that dies (killed, out of memory) costs only its own group (core.pool: no lock is shared
between workers): no record already received is touched, the other groups finish, and the cases not
reported yet run again on a new pool (see run_local); only a group that kills its worker when run alone
is recorded as failed.

The local pool is memory-aware: each group's peak is estimated before it starts (study.memory, the estimate
that refuses impossible sizes), and a group starts only while the estimates of the groups running, its own
included, fit HEADROOM x the available memory (one group always runs, however big: it fitted alone).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from flashcheck.core.lifeline import exit_with_parent
from flashcheck.core.pool import WorkerPool, fresh_context, send_to_parent
from flashcheck.study.cases import Case, CaseRecord, environment, evaluate_group
from flashcheck.study.memory import HEADROOM, available_bytes, estimate_case_bytes

EXECUTORS = ("local", "ray")
RAY_CONNECT_TIMEOUT_S = 10.0
_DEVICE = "cpu"
PRELOAD = ["torch", "flashcheck.study.executors"]  # imported once in the fork server the workers start from

Task = Callable[[list[Case]], int]


def _init_worker(device: str = "cpu", parent_pid: int | None = None) -> None:
    global _DEVICE
    _DEVICE = device
    if parent_pid is not None:  # a study killed by SIGKILL takes its workers with it
        exit_with_parent(parent_pid)


def _pool_task(cases: list[Case]) -> int:
    return evaluate_group(cases, emit, device=_DEVICE)


def emit(rec: CaseRecord) -> None:
    """Send a record from a pool worker to the parent (for custom pool tasks)."""
    send_to_parent(rec.to_json())


def _failed(cases: list[Case], message: str) -> list[CaseRecord]:
    env = environment()
    return [CaseRecord(c.case_id, c, "failed", {}, {}, 0.0, message, env) for c in cases]


def run_local(
    groups: list[list[Case]],
    workers: int,
    on_record: Callable[[CaseRecord], None],
    task: Task = _pool_task,
    *,
    available: int | None = None,
    device: str = "cpu",
) -> int:
    """Run groups on up to `workers` worker processes, as many at once as fit in memory (`available`
    bytes, default: what this machine has now; see the module docstring); call on_record once per case
    as it finishes. `task` runs in a worker and reports each record with `emit`; the default task runs the
    simulators and FP64 references on `device`. Returns the FP64 references computed.

    When a worker dies its pool starts no new group (the running ones finish); a new pool runs every case
    not reported yet. A group whose worker died twice is then run alone, and if it kills its worker alone
    as well, its unreported cases are recorded as failed."""
    todo = {i: list(g) for i, g in enumerate(groups) if g}
    avail = available_bytes() if available is None else available
    plan = _Plan({i: max(estimate_case_bytes(c) for c in g) for i, g in todo.items()}, avail, device)
    strikes: dict[int, int] = {}
    refs = 0
    while todo:
        n, suspects, broken = _run_pool(todo, workers, on_record, task, plan)
        refs += n
        if broken is None:  # the pool ended normally: anything unreported is lost, not retried
            _fail_all(todo, "no record came back from the worker", on_record)
            break
        for gi in suspects:
            strikes[gi] = strikes.get(gi, 0) + 1
            if strikes[gi] >= 2:
                refs += _run_alone(gi, todo.pop(gi), on_record, task, device)
    return refs


def _run_alone(gi: int, cases: list[Case], on_record: Callable[[CaseRecord], None], task: Task, device: str) -> int:
    alone = {gi: cases}
    refs, _, broken = _run_pool(alone, 1, on_record, task, _Plan({}, None, device))
    why = f"{type(broken).__name__}: {broken}" if broken else "no record came back"
    _fail_all(alone, f"worker died twice in a pool, then alone ({why})", on_record)
    return refs


def _fail_all(todo: dict[int, list[Case]], message: str, on_record: Callable[[CaseRecord], None]) -> None:
    for cases in todo.values():
        for rec in _failed(cases, message):
            on_record(rec)
    todo.clear()


class _Plan:
    """Which groups may start now: each group's estimated peak (`need`, bytes) against HEADROOM x
    `available` (None: unknown, only the worker count limits). `peak_running` records the most groups
    that ran at once (for tests and reports)."""

    def __init__(self, need: dict[int, int], available: int | None, device: str = "cpu") -> None:
        self.need, self.budget = need, None if available is None else int(HEADROOM * available)
        self.device = device
        self.in_use, self.peak_running = 0, 0

    def fits(self, gi: int, running: int) -> bool:
        return running == 0 or self.budget is None or self.in_use + self.need.get(gi, 0) <= self.budget

    def start(self, gi: int, running: int) -> None:
        self.in_use += self.need.get(gi, 0)
        self.peak_running = max(self.peak_running, running + 1)

    def end(self, gi: int) -> None:
        self.in_use -= self.need.get(gi, 0)


def _run_pool(
    todo: dict[int, list[Case]], workers: int, on_record: Callable[[CaseRecord], None], task: Task, plan: _Plan
) -> tuple[int, list[int], BaseException | None]:
    """One pool over the unfinished cases of `todo`, removing each case whose record arrives and each
    group that raised (its unreported cases are recorded as failed); groups start as `plan` lets them.
    Once a worker dies no group starts; the others finish. Returns (references computed, the groups whose
    worker died, the first WorkerDied or None)."""
    owner = {c.case_id: gi for gi, cases in todo.items() for c in cases}
    refs, broken, died, errors = 0, None, [], {}
    waiting, running = list(todo), set()

    def take(line: str) -> None:
        rec = CaseRecord.from_dict(json.loads(line))
        gi = owner.pop(rec.case_id, None)
        if gi is not None:  # else not ours, or already received
            todo[gi] = [c for c in todo[gi] if c.case_id != rec.case_id]
            on_record(rec)

    slots = max(1, min(workers, len(todo)))
    with WorkerPool(slots, fresh_context(PRELOAD), _init_worker, (plan.device, os.getpid())) as pool:
        while True:
            if broken is None:
                _start_fitting(pool, task, todo, waiting, running, plan)
            if not running:
                break
            for kind, gi, value in pool.events(0.1):
                if kind == "emit":
                    take(value)
                    continue
                running.discard(gi)
                plan.end(gi)
                if kind == "done":
                    refs += value
                elif kind == "error":  # the group itself raised: deterministic, not retried
                    errors[gi] = f"worker failed: {value}"
                else:
                    broken = broken or value
                    died.append(gi)
    for gi, message in errors.items():
        _fail_all({gi: todo[gi]}, message, on_record)
    for gi in [gi for gi, cases in todo.items() if not cases] + list(errors):
        todo.pop(gi, None)
    suspects = [gi for gi in died if gi in todo]
    return refs, suspects if broken else [], broken


def _start_fitting(pool: WorkerPool, task: Task, todo, waiting: list[int], running: set[int], plan: _Plan) -> None:
    """Submit waiting groups, in order, while a worker is idle and `plan` has room (a group that does not fit
    now waits; a smaller one after it may start)."""
    for gi in list(waiting):
        if not pool.idle():
            return
        if not plan.fits(gi, len(running)):
            continue
        pool.submit(gi, task, list(todo[gi]))
        plan.start(gi, len(running))
        waiting.remove(gi)
        running.add(gi)


def _host_port(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray-address {address!r} is not allowed; give HOST:PORT (or ray://HOST:PORT, or auto)")
    return host.strip("[]"), int(port)


# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS and client server)
# answers with a SETTINGS frame (frame type 4 in the 4th byte of its 9-byte header).
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_ray_address(address: str, timeout: float | None = None) -> None:
    """Raise ValueError naming `address` and the reason unless a gRPC server (a Ray cluster) answers
    there within `timeout` seconds; ray.init itself would wait minutes and ignore SIGTERM."""
    if address in ("auto", "local"):
        return
    timeout = RAY_CONNECT_TIMEOUT_S if timeout is None else timeout
    host, port = _host_port(address)
    head = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(_H2_HELLO)
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        if not head:
            raise ValueError(f"--ray-address {address!r}: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise ValueError(f"--ray-address {address!r}: cannot connect: {exc.strerror or exc}") from None
    if len(head) < 9 or head[3] != 4:
        raise ValueError(f"--ray-address {address!r}: the server there does not speak gRPC; it is not a Ray cluster")


def run_ray(
    groups: list[list[Case]],
    workers: int,
    on_record: Callable[[CaseRecord], None],
    address: str | None = None,
    temp_dir: str | Path | None = None,
) -> int:
    """Run groups as Ray tasks (local Ray with `workers` CPUs, or the cluster at `address`)."""
    if address:
        check_ray_address(address)
    saved_env = dict(os.environ)  # importing ray and ray.init set RAY_*, PYTHONBREAKPOINT here: put them back
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
    try:
        return _ray_tasks(ray, groups, on_record)
    finally:
        if started:
            ray.shutdown()
            os.environ.clear()
            os.environ.update(saved_env)


def _ray_tasks(ray, groups: list[list[Case]], on_record: Callable[[CaseRecord], None]) -> int:
    @ray.remote(num_cpus=1)
    def task(cases: list[Case]) -> tuple[int, list[str]]:
        records: list[str] = []
        n = evaluate_group(cases, lambda rec: records.append(rec.to_json()))
        return n, records

    refs = 0
    pending = {task.remote(g): g for g in groups}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            group = pending.pop(ref)
            try:
                n, lines = ray.get(ref)
            except Exception as exc:  # Ray already retried a task whose worker died
                for rec in _failed(group, f"ray task failed: {type(exc).__name__}: {exc}"):
                    on_record(rec)
                continue
            refs += n
            for line in lines:
                on_record(CaseRecord.from_dict(json.loads(line)))
    return refs
