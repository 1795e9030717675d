"""The target run in a worker process, so that a kernel that kills its process (XLA's SIGABRT on a failed
check, torch's CPU flash kernel's SIGFPE at Lk = 0, a segfault in a user's extension), hangs, forks or prints
without end costs one case, not the hunt.

One persistent worker (core.pool.WorkerPool of size 1: JAX's compile caches stay warm) builds the target once
(parse_target by name: a user's module is imported there, never in the hunt's own process) and runs each call it is
sent (judge.outputs on a case, a semantics probe, the import check of `load`): the case travels as its text form,
the inputs are rebuilt from it (make_inputs is deterministic) and the target's out, dq, dk, dv come back as float64
CPU tensors. Every call has the timeout: no answer in `timeout_s` is a hang (TargetCrashed(HANG)).

The worker leads a process group of its own; a hang, a death or the end of the hunt kills the whole group (SIGKILL),
so processes a target forked die with it. Its stdout and stderr go into one pipe that a thread of this process reads:
appended to the hunt's worker-stderr.txt until that file holds OUTPUT_CAP bytes (then one line says the rest is left
out), the last TAIL bytes of the current call kept in memory. When the worker dies, the call raises TargetCrashed
with the signal's name and the line of that tail that says why (a fatal check, "Fatal Python error", else the last
line), and the next call starts a fresh worker. Nothing a target prints reaches this process's stdout (--json).

Workers are forked from a fork server (multiprocessing's forkserver: a freshly started, single-threaded process
that has imported torch and the judge, never JAX nor a BLAS pool; spawn where there is none): a restart after a
crash then costs about 40 ms instead of the 1.7 s a spawned worker takes to import torch (measured on 2 loaded
cores), which is what makes shrinking a crash, one restart per crashing step, affordable."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flashcheck.core.fileio import open_plain, refuse_link
from flashcheck.core.pool import WorkerPool, fresh_context
from flashcheck.hunt.case import HuntCase
from flashcheck.hunt.target import BadOutput, Target, TargetCrashed, TargetRaised

STDERR = "worker-stderr.txt"
WHAT = "the hunt's worker-stderr.txt"
OUTPUT_CAP = 4 << 20  # bytes of the target's stdout and stderr kept in worker-stderr.txt, over a whole hunt
TAIL = 64 << 10  # bytes of the current call's output kept in memory: where a dying worker says why
_WHY = re.compile(r"^F\d{4} |Check failed|Fatal Python error|Segmentation fault|Floating point exception|terminate")
_TARGET: Target | None = None
_LOAD_ERROR = ""
PRELOAD = ["torch", "flashcheck.hunt.judge", "flashcheck.hunt.isolate"]
HANG = "hang"  # TargetCrashed's signal for a call the worker gave no answer to in time (it is killed)
CASE_TIMEOUT_S = 120.0  # hunt --case-timeout's default, and compare --case's limit
HEARTBEAT_S = 5.0  # how often a call still waited on is reported (on_wait)


def worker_context():
    """The forkserver context with torch and the judge preloaded (spawn where forkserver is not available)."""
    return fresh_context(PRELOAD)


def _init(name: str, device: str, sink) -> None:
    """In the worker: a process group of its own, stdout and stderr into the pipe `sink`, faulthandler on, one
    intra-op thread, the target built (an exception kept for the calls to report; an exit or a signal at import
    ends the worker, which the parent reports)."""
    global _TARGET, _LOAD_ERROR
    import faulthandler

    import torch

    from flashcheck.hunt.target import parse_target

    os.setpgid(0, 0)
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    sink.close()
    faulthandler.enable()
    torch.set_num_threads(1)
    try:
        _TARGET = parse_target(name, device)
    except Exception as exc:  # an import error, a bad signature: said by the first call
        _LOAD_ERROR = f"{type(exc).__name__}: {exc}"


def _loaded() -> Target:
    if _TARGET is None:
        raise _NotLoaded(_LOAD_ERROR or "the target was not built")
    return _TARGET


class TargetLoadFailed(ValueError):
    """The target could not be built in its worker (an import error, an exit, a signal or a hang at import): one
    line naming the target and what happened."""


class _NotLoaded(RuntimeError):
    """The worker could not build the target (its message: why)."""


def _call(fn: Callable[..., object], *args: object) -> object:
    """In the worker: fn(target, *args); a BadOutput or a target that could not be built as a tagged answer."""
    try:
        return fn(_loaded(), *args)
    except BadOutput as exc:
        return {"__bad_output__": str(exc)}
    except _NotLoaded as exc:
        return {"__not_loaded__": str(exc)}


def _outputs(target: Target, text: str) -> dict:
    from flashcheck.hunt.case import parse_case
    from flashcheck.hunt.judge import outputs

    return outputs(target, parse_case(text))


def _name(target: Target) -> str:
    return target.name


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
    """The line of a dead worker's output that says why: the first fatal check or fatal error, else the last
    non-empty line ('' when none), at most 300 characters, control characters left out."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    said = next((x for x in lines if _WHY.search(x)), lines[-1] if lines else "")
    return "".join(c for c in said if c.isprintable())[:300]


def isolates(target: Target) -> bool:
    """Whether the hunt runs `target` in a worker by default: real backends and user callables (native code
    that may kill its process); simulator presets are flashcheck's own Python and stay in-process."""
    return target.kind in ("backend", "callable")


class _Capture:
    """A worker's stdout and stderr, read from the pipe `reader` on a thread: appended to the file `fd` while it
    holds under OUTPUT_CAP bytes (then one line says the rest is left out), the last TAIL bytes since `mark` kept."""

    def __init__(self, reader, fd: int) -> None:
        self._reader, self._fd = reader, fd
        self._size = os.fstat(fd).st_size
        self._tail, self._lock = bytearray(), threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="flashcheck-target-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while chunk := os.read(self._reader.fileno(), 1 << 16):
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-TAIL]
                self._keep(chunk)
        except OSError:  # the pipe closed under us: nothing more to read
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _keep(self, chunk: bytes) -> None:
        if self._size >= OUTPUT_CAP:
            return
        part = chunk[: OUTPUT_CAP - self._size]
        self._size += len(part)
        if self._size >= OUTPUT_CAP:
            part += f"\n[flashcheck: the target's output past {OUTPUT_CAP >> 20} MiB is left out here]\n".encode()
        with contextlib.suppress(OSError):  # a full disk costs the log, not the hunt
            os.write(self._fd, part)

    def mark(self) -> None:
        with self._lock:
            self._tail.clear()

    def text(self, wait_s: float = 0.0) -> str:
        """The output since `mark`, after waiting up to `wait_s` for the pipe's end (a dead worker's last words)."""
        self._thread.join(wait_s)
        with self._lock:
            return self._tail.decode("utf-8", "replace")

    def close(self) -> None:
        self._thread.join(2.0)
        with contextlib.suppress(OSError):
            self._reader.close()


class IsolatedTarget:
    """`target` run in a worker; `stderr`: the file the worker's output is appended to (bounded). A context manager:
    leaving it stops the worker and its process group. `restarts`: workers started after a death or a hang.
    `timeout_s`: a call with no answer after that long (None: no limit) is a hang: the worker's group is killed and
    the call raises TargetCrashed(HANG). `on_wait(seconds)`: called every HEARTBEAT_S while a call is waited on."""

    def __init__(
        self,
        target: Target,
        stderr: Path,
        timeout_s: float | None = None,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.target, self.stderr, self.timeout_s, self.on_wait = target, Path(stderr), timeout_s, on_wait
        refuse_link(self.stderr, WHAT)  # said here, before any work; opened with O_NOFOLLOW too
        self._pool: WorkerPool | None = None
        self._capture: _Capture | None = None
        self._pid = 0
        self._jobs = 0
        self.restarts = 0

    def __enter__(self) -> IsolatedTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop(kill=False)
            self._end()

    def _start(self) -> None:
        fd = open_plain(self.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, what=WHAT)  # never via a link
        ctx = worker_context()  # never plain fork: unsafe once JAX or a BLAS pool runs here
        reader, writer = ctx.Pipe(duplex=False)
        try:
            self._pool = WorkerPool(1, ctx, _init, (self.target.name, self.target.device, writer))
        except BaseException:
            os.close(fd)
            reader.close()
            raise
        finally:
            writer.close()  # the worker's group holds the only write ends: their deaths end the pipe
        self._pid = self._pool.pids()[0]
        self._capture = _Capture(reader, fd)

    def _end(self, kill: bool = False) -> None:
        """Stop the worker (kill: at once) and kill its process group: nothing the target forked outlives it."""
        if self._pool is not None:
            if kill:
                self._pool.stop(kill=True)
            self._pool = None
        if self._pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)
            self._pid = 0
        if self._capture is not None:
            self._capture.close()
            self._capture = None

    def call(self, fn: Callable[..., object], *args: object) -> object:
        """fn(target, *args) in the worker (fn importable by name). TargetCrashed when the worker dies on it or gives
        no answer in time; the target's own exception as TargetRaised('Type: message'); BadOutput for an output
        that is not a tensor of the right shape; ValueError when the worker could not build the target."""
        if self._pool is None:
            self._start()
        assert self._pool is not None and self._capture is not None
        self._capture.mark()
        self._jobs += 1
        self._pool.submit(self._jobs, _call, fn, *args)
        t0 = beat = time.monotonic()
        while True:
            now = time.monotonic()
            if self.timeout_s is not None and now - t0 > self.timeout_s:
                self._end(kill=True)
                self.restarts += 1
                raise TargetCrashed(HANG, f"no answer in {self.timeout_s:g} s: the worker was killed")
            if self.on_wait is not None and now - beat >= HEARTBEAT_S:
                beat = now
                self.on_wait(now - t0)
            left = 1.0 if self.timeout_s is None else t0 + self.timeout_s - now
            for kind, _key, value in self._pool.events(max(0.01, min(1.0, left))):
                if kind == "done":
                    return _unwrap(value, self.target.name)
                if kind == "error":
                    raise TargetRaised(value)
                if kind == "died":
                    capture = self._capture
                    self._pool.stop(kill=True)
                    self._pool = None
                    self._end()  # the group killed first: then the pipe ends and its last words are read
                    self.restarts += 1
                    raise TargetCrashed(signal_name(value.exitcode), why_line(capture.text()))

    def outputs(self, case: HuntCase) -> dict:
        """judge.outputs(target, case) computed in the worker (see `call`)."""
        return self.call(_outputs, case.to_text())

    def load(self) -> None:
        """Build the target in the worker (a user's module imported there); ValueError, one line naming the target,
        when that fails: an import error, a bad signature, an exit, a signal or a hang at import."""
        try:
            self.call(_name)
        except TargetCrashed as exc:
            what = "gave no answer" if exc.signal == HANG else f"killed its process ({exc.signal})"
            said = f"; its output said: {exc.line}" if exc.line and exc.signal != HANG else ""
            raise TargetLoadFailed(f"target {self.target.name!r}: loading it {what}{said}") from None
        except TargetRaised as exc:
            raise TargetLoadFailed(f"target {self.target.name!r}: loading it raised {exc}") from None
        except ValueError as exc:
            raise TargetLoadFailed(str(exc)) from None


def _unwrap(value: object, name: str) -> object:
    if isinstance(value, dict) and "__bad_output__" in value:
        raise BadOutput(value["__bad_output__"])
    if isinstance(value, dict) and "__not_loaded__" in value:
        said = value["__not_loaded__"]
        own = said.startswith("ValueError: target ")  # parse_target's own one line
        raise ValueError(said.removeprefix("ValueError: ") if own else f"target {name!r}: {said}")
    return value
