"""Test helpers: the peers' acceptance rule (flash-attention's tests/test_flash_attn.py) through the project's
own `check_budget`, so the tests judge kernels exactly as users' tests do."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from flashcheck.core.budget import check_budget


def budget_ok(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, k: float) -> tuple[bool, str]:
    """The peers' rule: max|out - ref| <= k * max|base - ref| + 2 * max|(ref + 0.3 - 0.3) - ref| (reference in
    fp32, as flash-attention's tests round it), and the same on the mean error."""
    res = check_budget(out, ref, base, k=k, dtype=torch.float32, rule="peers")
    return res.passed, res.message()


def _figure_name(fname) -> str:
    """The file name a figure is saved under (atomic_target's temporary name mapped back)."""
    return re.sub(r"^\.(.+)\.[0-9a-f]{12}\.tmp(\.\w+)$", r"\1\2", Path(str(fname)).name)


@contextlib.contextmanager
def audited_figures(save: bool = True) -> Iterator[list[tuple[str, list[str], list[str]]]]:
    """Every figure saved inside the block as (file name, reporting.figures.figure_problems, y labels):
    wraps matplotlib's Figure.savefig, so it audits any report's figures (study, train-study). save=False
    writes an empty file instead of the PNG (the audit without the rendering, for speed)."""
    from matplotlib.figure import Figure

    from flashcheck.reporting.figures import figure_problems

    seen: list[tuple[str, list[str], list[str]]] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        name = _figure_name(fname)
        seen.append((name, figure_problems(self), [ax.get_ylabel() for ax in self.axes]))
        if not save:
            Path(fname).write_bytes(b"")
            return None
        return original(self, fname, *args, **kwargs)

    Figure.savefig = savefig
    try:
        yield seen
    finally:
        Figure.savefig = original


@contextlib.contextmanager
def figures_from(folder: Path) -> Iterator[list[str]]:
    """The file names of every figure saved inside the block; each is written as a copy of the PNG of that
    name in `folder` (a report already rendered from the same records) instead of being rasterised again, and
    rendered as usual where `folder` has none."""
    from matplotlib.figure import Figure

    saved: list[str] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        name = _figure_name(fname)
        saved.append(name)
        if not (folder / name).is_file():
            return original(self, fname, *args, **kwargs)
        Path(fname).write_bytes((folder / name).read_bytes())
        return None

    Figure.savefig = savefig
    try:
        yield saved
    finally:
        Figure.savefig = original


def scale_qkv(lq: int, lk: int, d: int = 16, heads: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded FP64 q [1, H, Lq, D], k, v [1, H, Lk, D] (keys doubled) for the scale and memory tests."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, heads, lk, d, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, heads, lk, d, generator=g, dtype=torch.float64)
    return q, k, v


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n inside the block, the caller's restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# Runs scripts or modules as `python [-I] -m MODULE` / `python [-I] SCRIPT` would, each as its own process forked
# from one interpreter that imported `preload` once (torch: seconds in every fresh interpreter): one JSON line
# [how, what, argv, cwd, log] in, one JSON line [exit code or None] out. The child starts its own session, runs
# the module or script as __main__ with its output in the file `log`, and exits through the interpreter's own exit
# (an uncaught exception: a traceback and exit 1); one still running after the timeout is killed with its process
# group (None: a hang).
_FORKER = """
import json, os, runpy, signal, sys, time
for name in filter(None, sys.argv[1].split(",")):
    __import__(name)
timeout = float(sys.argv[2])
for line in sys.stdin:
    how, what, argv, cwd, log = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.chdir(cwd)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.argv = argv
        if how == "module":
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(what, run_name="__main__")
        sys.exit(0)
    deadline, code = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.02)
    else:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print(json.dumps([code]), flush=True)
"""


@contextlib.contextmanager
def forked_runs(
    preload: list[str], timeout_s: float, *, isolated: bool = False, env: dict | None = None, cwd: str | None = None
) -> Iterator[Callable[..., tuple[int | None, str]]]:
    """run(how, what, argv, cwd, log) -> (exit code or None for a hang, the run's stdout + stderr): `how` "module"
    (python -m what) or "path" (python what), with sys.argv = argv, in folder `cwd`, its output in the file `log`;
    each forked from one interpreter (`isolated`: -I; `env`, `cwd`: its environment and folder) that imported
    `preload` once (see _FORKER)."""
    import json
    import subprocess
    import sys

    flags = ["-I"] if isolated else []
    forker = subprocess.Popen([sys.executable, *flags, "-c", _FORKER, ",".join(preload), str(timeout_s)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)  # fmt: skip

    def run(how: str, what: str, argv: list[str], folder: str, log: Path) -> tuple[int | None, str]:
        forker.stdin.write(json.dumps([how, what, argv, folder, str(log)]) + "\n")
        forker.stdin.flush()
        answer = forker.stdout.readline()
        assert answer, "the forking interpreter died"
        (code,) = json.loads(answer)
        return code, (log.read_text("utf-8", "replace") if code is not None and log.exists() else "")

    try:
        yield run
    finally:
        forker.stdin.close()
        forker.wait(timeout=60)


# `python -m flashcheck.cli ARGS` as a process of its own, forked from one interpreter that imported torch and the
# CLI's commands once (a fresh interpreter spends seconds of CPU on torch alone), for the tests that kill, interrupt
# or watch a running command (its pool's fork server and workers are its own, as for a fresh one). One JSON line in
# per request, one out: ["start", argv, env, cwd, stdout file, stderr file, new session, SIGINT default] -> pid;
# ["poll", pid] -> exit code or None (running); ["wait", pid, timeout] -> exit code or None (still running).
# The child runs the module as __main__ and exits through the interpreter's own exit (sys.exit, or an uncaught
# exception: a traceback and exit 1), its exit code as Popen gives it (-N: killed by signal N).
_CLI_FORKER = """
import json, os, runpy, signal, sys, time
for name in filter(None, sys.argv[1].split(",")):
    __import__(name)

def status(pid, block_s):
    deadline = time.monotonic() + block_s
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(st)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)

codes = {}
for line in sys.stdin:
    req = json.loads(line)
    if req[0] == "start":
        _, argv, env, cwd, out, err, session, sigint = req
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            if session:
                os.setsid()
            if sigint:  # as a fresh interpreter started with SIGINT's default action sets it
                signal.signal(signal.SIGINT, signal.default_int_handler)
            os.environ.clear()
            os.environ.update(env)
            os.chdir(cwd)
            for fd, path in ((0, os.devnull), (1, out), (2, err)):
                f = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(f, fd)
                os.close(f)
            sys.argv = ["flashcheck", *argv]
            runpy.run_module("flashcheck.cli", run_name="__main__", alter_sys=True)
            sys.exit(0)
        answer = pid
    else:
        pid = req[1]
        if pid not in codes:
            code = status(pid, req[2] if req[0] == "wait" else 0.0)
            if code is not None:
                codes[pid] = code
        answer = codes.get(pid)
    print(json.dumps(answer), flush=True)
"""
CLI_PRELOAD = ["torch", "flashcheck.cli", "flashcheck.cli.study", "flashcheck.cli.training", "flashcheck.study.runner",
               "flashcheck.training.experiments"]  # fmt: skip


class ForkedCLI:
    """A running `flashcheck ARGS` (cli_forker), with the part of subprocess.Popen the tests use: pid, poll(),
    wait(timeout), communicate(timeout) -> (stdout, stderr) as text, returncode."""

    def __init__(self, ask: Callable[[list], Any], pid: int, out: Path, err: Path) -> None:
        self._ask, self.pid, self._out, self._err = ask, pid, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._ask(["poll", self.pid])
        return self.returncode

    def wait(self, timeout: float = 300.0) -> int:
        if self.returncode is None:
            self.returncode = self._ask(["wait", self.pid, timeout])
        if self.returncode is None:
            raise TimeoutError(f"flashcheck (PID {self.pid}) still runs after {timeout:g} s")
        return self.returncode

    def communicate(self, timeout: float = 300.0) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text("utf-8", "replace"), self._err.read_text("utf-8", "replace")


@contextlib.contextmanager
def cli_forker(folder: Path, preload: list[str] = CLI_PRELOAD) -> Iterator[Callable[..., ForkedCLI]]:
    """start(args, *, new_session=False, sigint_default=False) -> ForkedCLI: `python -m flashcheck.cli *args`
    in its own process (`new_session`: os.setsid, as Popen's start_new_session; `sigint_default`: SIGINT raises
    KeyboardInterrupt, as in a fresh interpreter started with SIGINT's default action), with this process's
    environment and folder at the call, its output in files under `folder`; each forked from one interpreter
    that imported `preload` once (see _CLI_FORKER)."""
    import json
    import os
    import subprocess
    import sys

    forker = subprocess.Popen([sys.executable, "-c", _CLI_FORKER, ",".join(preload)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    count = [0]

    def ask(request: list) -> Any:
        forker.stdin.write(json.dumps(request) + "\n")
        forker.stdin.flush()
        answer = forker.stdout.readline()
        assert answer, "the forking interpreter died"
        return json.loads(answer)

    def start(args: list[str], *, new_session: bool = False, sigint_default: bool = False) -> ForkedCLI:
        count[0] += 1
        out, err = folder / f"cli-{count[0]}.out", folder / f"cli-{count[0]}.err"
        request = ["start", [str(a) for a in args], dict(os.environ), os.getcwd(), str(out), str(err), new_session,
                   sigint_default]  # fmt: skip
        return ForkedCLI(ask, ask(request), out, err)

    try:
        yield start
    finally:
        forker.stdin.close()
        forker.wait(timeout=60)
