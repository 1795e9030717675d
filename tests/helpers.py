"""Test helpers: the peers' acceptance rule (flash-attention's tests/test_flash_attn.py) through the project's
own `check_budget`, so the tests judge kernels exactly as users' tests do."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

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
