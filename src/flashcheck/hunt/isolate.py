"""The target run in a worker process, so that a kernel that kills its process (XLA's SIGABRT on a failed
check, torch's CPU flash kernel's SIGFPE at Lk = 0, a segfault in a user's extension) costs one case, not the
hunt.

One persistent worker (core.pool.WorkerPool of size 1: JAX's compile caches stay warm) builds the
target once (parse_target by name) and runs judge.outputs on each case it is sent: the case travels as its
text form, the inputs are rebuilt from it (make_inputs is deterministic) and the target's out, dq, dk, dv come
back as float64 CPU tensors. The worker's stderr goes to a file (the hunt's worker-stderr.txt); when the
worker dies, the call raises TargetCrashed with the signal's name and the line of that file that says why
(a fatal check, "Fatal Python error", else the last line), and the next call starts a fresh worker.

Workers are forked from a fork server (multiprocessing's forkserver: a freshly started, single-threaded process
that has imported torch and the judge, never JAX nor a BLAS pool; spawn where there is none): a restart after a
crash then costs about 40 ms instead of the 1.7 s a spawned worker takes to import torch (measured on 2 loaded
cores), which is what makes shrinking a crash, one restart per crashing step, affordable."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from flashcheck.core.fileio import open_plain, refuse_link
from flashcheck.core.pool import WorkerPool, fresh_context
from flashcheck.hunt.case import HuntCase
from flashcheck.hunt.target import Target, TargetCrashed, TargetRaised

STDERR = "worker-stderr.txt"
WHAT = "the hunt's worker-stderr.txt"
_WHY = re.compile(r"^F\d{4} |Check failed|Fatal Python error|Segmentation fault|Floating point exception|terminate")
_TARGET: Target | None = None
PRELOAD = ["torch", "flashcheck.hunt.judge", "flashcheck.hunt.isolate"]


def worker_context():
    """The forkserver context with torch and the judge preloaded (spawn where forkserver is not available)."""
    return fresh_context(PRELOAD)


def _init(name: str, device: str, stderr: str) -> None:
    """In the worker: stderr to `stderr` (appended), faulthandler on, one intra-op thread, the target built."""
    global _TARGET
    import faulthandler

    import torch

    from flashcheck.hunt.target import parse_target

    fd = open_plain(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, what=WHAT)  # never through a link
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    torch.set_num_threads(1)
    _TARGET = parse_target(name, device)


def _job(text: str) -> dict:
    from flashcheck.hunt.case import parse_case
    from flashcheck.hunt.judge import outputs

    assert _TARGET is not None
    return outputs(_TARGET, parse_case(text))


def signal_name(exitcode: int | None) -> str:
    """'SIGABRT' for exit code -6; 'exit code 3' for a plain exit; 'unknown exit' for None."""
    if exitcode is None:
        return "unknown exit"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def why_line(text: str) -> str:
    """The line of a dead worker's stderr that says why: the first fatal check or fatal error, else the last
    non-empty line ('' when none), at most 300 characters."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    said = next((x for x in lines if _WHY.search(x)), lines[-1] if lines else "")
    return said[:300]


def isolates(target: Target) -> bool:
    """Whether the hunt runs `target` in a worker by default: real backends and user callables (native code
    that may kill its process); simulator presets are flashcheck's own Python and stay in-process."""
    return target.kind in ("backend", "callable")


HANG = "hang"  # TargetCrashed's signal for a case the worker gave no answer to in time (it is killed)
CASE_TIMEOUT_S = 120.0  # hunt --case-timeout's default, and compare --case's limit


class IsolatedTarget:
    """`target` run in a worker; `stderr`: the file the worker's stderr is appended to. A context manager:
    leaving it stops the worker. `restarts`: workers started after a death. `timeout_s`: a case with no answer
    after that long (None: no limit) is a hang: the worker is killed and the call raises TargetCrashed(HANG)."""

    def __init__(self, target: Target, stderr: Path, timeout_s: float | None = None) -> None:
        self.target, self.stderr, self.timeout_s = target, Path(stderr), timeout_s
        refuse_link(self.stderr, WHAT)  # said here, before any work; the worker opens it with O_NOFOLLOW too
        self._pool: WorkerPool | None = None
        self._jobs = 0
        self.restarts = 0

    def __enter__(self) -> IsolatedTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop(kill=False)
            self._pool = None

    def outputs(self, case: HuntCase) -> dict:
        """judge.outputs(target, case) computed in the worker; TargetCrashed when the worker dies on it; the
        target's own exception as TargetRaised('Type: message')."""
        if self._pool is None:
            ctx = worker_context()  # never plain fork: unsafe once JAX or a BLAS pool runs here
            self._pool = WorkerPool(1, ctx, _init, (self.target.name, self.target.device, str(self.stderr)))
        start = self.stderr.stat().st_size if self.stderr.exists() else 0
        self._jobs += 1
        self._pool.submit(self._jobs, _job, case.to_text())
        t0 = time.monotonic()
        while True:
            if self.timeout_s is not None and time.monotonic() - t0 > self.timeout_s:
                self._pool.stop(kill=True)
                self._pool = None
                self.restarts += 1
                raise TargetCrashed(HANG, f"no answer in {self.timeout_s:g} s: the worker was killed")
            wait = 1.0 if self.timeout_s is None else max(0.01, min(1.0, t0 + self.timeout_s - time.monotonic()))
            for kind, _key, value in self._pool.events(wait):
                if kind == "done":
                    return value
                if kind == "error":
                    raise TargetRaised(value)
                if kind == "died":
                    self._pool.stop(kill=True)
                    self._pool = None
                    self.restarts += 1
                    raise TargetCrashed(signal_name(value.exitcode), why_line(self._read_from(start)))

    def _read_from(self, start: int) -> str:
        try:
            with os.fdopen(open_plain(self.stderr, os.O_RDONLY, what=WHAT), "rb") as f:
                f.seek(start)
                return f.read(1 << 20).decode("utf-8", "replace")
        except (OSError, ValueError):  # gone, or a link planted since: no line to quote
            return ""
