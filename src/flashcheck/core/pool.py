"""A process pool with one private pipe per worker and no lock shared between workers.

concurrent.futures' pool sends every worker's results through one queue guarded by a lock that all workers
share: a worker killed while it holds that lock (SIGKILL, the OOM killer) can leave the others, and the
pool's shutdown, waiting forever. Here each worker talks to the parent on its own pipe, so a death at any
instant costs only that worker's unfinished job: the parent sees the worker's sentinel or the pipe's end,
reads every whole message sent before it, and never waits on a thread or a lock to stop the pool.

Protocol: the parent sends (key, function, args) or None (stop); the worker answers with any number of
("emit", payload) messages (`send_to_parent`), then ("done", key, value) or ("error", key, text).

Workers start with the parent's environment variables as they are when the pool starts (as spawned ones do),
whatever the context: a fork server's children otherwise inherit the server's, frozen when it started.
`fresh_context` is the context for workers with fresh torch state that start in milliseconds.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

STOP_WAIT_S = 5.0  # how long stop() waits for a worker to exit after None before it kills it

_SEND: Callable[[tuple], None] | None = None


class WorkerDied(RuntimeError):
    """A worker process ended while it ran a job (killed, out of memory, crashed); `exitcode`: the process's
    exit code (-N: killed by signal N), None when unknown."""

    def __init__(self, message: str, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.exitcode = exitcode


def send_to_parent(payload: Any) -> None:
    """From inside a job: send `payload` to the parent now (it arrives as an ("emit", key, payload) event)."""
    if _SEND is None:
        raise RuntimeError("send_to_parent is only for jobs running in a flashcheck pool worker")
    _SEND(("emit", payload))


def fresh_context(preload: list[str]):
    """Multiprocessing's forkserver context with `preload` (module names; torch first) imported once in the
    fork server, a freshly started, single-threaded interpreter that never runs torch code, JAX nor a BLAS
    pool: each worker is forked from it with fresh torch state in about 40 ms instead of the 1.7-2.5 s a
    spawned worker takes to import torch; the spawn context where forkserver is not available. The server is
    one per process and started here if it is not running yet (a running one keeps the modules it has); the
    process-wide preload list is given back as it was, so the caller's own forkserver settings stay its own."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    before = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))  # no public getter
    ctx.set_forkserver_preload(preload)
    try:
        with _server_ignores_ctrl_c():
            forkserver.ensure_running()  # reads the list now: the only moment it matters
    finally:
        ctx.set_forkserver_preload(before)
    return ctx


@contextlib.contextmanager
def _server_ignores_ctrl_c() -> Iterator[None]:
    """SIGINT ignored while the fork server is started, so that it inherits SIG_IGN (kept across exec, and by
    Python): a Ctrl-C while it imports its preload (seconds of torch) is the parent's to handle (one line, exit
    130), not a 30-line traceback from the server. The server's children ignore it too, as pool workers do."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _worker_main(conn: Connection, init: Callable[..., None] | None, initargs: tuple, env: dict) -> None:
    global _SEND
    if env != os.environ:  # a fork server's child: the parent's variables, as a spawned worker has them
        os.environ.clear()
        os.environ.update(env)
    lock = threading.Lock()  # a job may send from several threads; the pipe is this worker's alone

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    _SEND = send
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    if init is not None:
        init(*initargs)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if job is None:
            return
        key, fn, args = job
        try:
            value = fn(*args)
        except Exception as exc:  # the job's own failure: reported, the worker lives on
            send(("error", key, f"{type(exc).__name__}: {exc}"))
        else:
            send(("done", key, value))


@dataclass
class _Worker:
    process: Any
    conn: Connection
    key: Any = None  # the job it runs now, None when idle
    busy: bool = False
    alive: bool = True
    inbox: list = field(default_factory=list)


class WorkerPool:
    """`size` workers started by context `ctx` (spawn, or `fresh_context`), each started with init(*initargs).
    Use as a context manager: leaving it stops every worker (killing those still running a job, or all when an
    exception left it)."""

    def __init__(self, size: int, ctx, init: Callable[..., None] | None = None, initargs: tuple = ()) -> None:
        self._workers: list[_Worker] = []
        try:
            for _ in range(size):
                parent, child = ctx.Pipe(duplex=True)
                args = (child, init, initargs, dict(os.environ))
                proc = ctx.Process(target=_worker_main, args=args, name="flashcheck-worker")
                proc.start()
                child.close()  # the worker holds the only other end: its death ends the pipe
                self._workers.append(_Worker(proc, parent))
        except BaseException:
            self.stop(kill=True)
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.stop(kill=exc_type is not None)

    def pids(self) -> list[int]:
        """The process ids of the workers, in the order they were started."""
        return [w.process.pid for w in self._workers]

    def idle(self) -> int:
        return sum(w.alive and not w.busy for w in self._workers)

    def running(self) -> int:
        return sum(w.alive and w.busy for w in self._workers)

    def submit(self, key: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Give job `key` (fn(*args), fn importable by name) to an idle worker; ValueError when none is idle."""
        worker = next((w for w in self._workers if w.alive and not w.busy), None)
        if worker is None:
            raise ValueError("no idle worker")
        worker.conn.send((key, fn, args))
        worker.key, worker.busy = key, True

    def events(self, timeout: float) -> Iterator[tuple[str, Any, Any]]:
        """Wait up to `timeout` seconds, then yield what arrived: ("emit", key, payload), ("done", key, value),
        ("error", key, text) and ("died", key, WorkerDied) for a worker that ended while running job `key`."""
        live = [w for w in self._workers if w.alive]
        by_handle = {w.conn: w for w in live} | {w.process.sentinel: w for w in live}
        for handle in wait(list(by_handle), timeout):
            worker = by_handle[handle]
            if worker.alive:
                yield from self._read(worker)

    def _read(self, worker: _Worker) -> Iterator[tuple[str, Any, Any]]:
        while True:
            try:
                if not worker.conn.poll():
                    if worker.process.is_alive():
                        return
                    raise EOFError
                message = worker.conn.recv()
            except (EOFError, OSError):  # the pipe ended: every whole message sent before has been read
                yield from self._bury(worker)
                return
            if message[0] == "emit":
                yield "emit", worker.key, message[1]
            else:
                worker.busy, worker.key = False, None
                yield message[0], message[1], message[2]

    def _bury(self, worker: _Worker) -> Iterator[tuple[str, Any, Any]]:
        worker.alive = False
        worker.process.join(STOP_WAIT_S)
        code = worker.process.exitcode
        worker.conn.close()
        if worker.busy:
            why = f"worker process {worker.process.pid} ended with exit code {code} while it ran a job"
            yield "died", worker.key, WorkerDied(why, code)

    def stop(self, kill: bool = False) -> None:
        """Stop every worker: idle ones are asked to exit (killed after STOP_WAIT_S); busy ones, or all with
        `kill`, are killed at once. Never waits on a lock or a thread."""
        for w in self._workers:
            if w.alive and not (kill or w.busy):
                with contextlib.suppress(OSError):
                    w.conn.send(None)
        for w in self._workers:
            if w.alive and not (kill or w.busy):
                w.process.join(STOP_WAIT_S)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.alive = False
            w.conn.close()
