"""What a person sees: every command's human output (no --json), progress, and the files' modes.

Each command runs at a small size through typer's CliRunner (stdout is not a terminal there), a few
through the installed `flashcheck` script. Off a terminal the output has no ANSI escapes, no rich
highlighting inside numbers, and headings and verdicts on one line each."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.fileio import atomic_target, write_atomic
from flashcheck.progress import progress

runner = CliRunner()
ESC = "\x1b["
SMALL = ["--seq-len", "64", "--heads", "1"]
SWEEP = """name = "human"
[[sweeps]]
question = "seq_len"
methods = ["flash:bf16"]
seq_lens = [32, 64]
blocks = [[16, 16]]
seeds = [0]
"""


def human(args: list[str], env: dict | None = None):
    """Run a command without --json; it must exit 0 without a traceback or an ANSI escape."""
    res = runner.invoke(app, args, env=env)
    assert res.exit_code == 0, f"{args}: exit {res.exit_code}\n{res.output}\n{res.exception!r}"
    assert "Traceback" not in res.output and res.exception is None, res.output
    if env is None:
        assert ESC not in res.output, repr(res.output)
    return res


def one_line(output: str, *parts: str) -> str:
    """The single output line that holds every part (a heading or verdict is never wrapped)."""
    lines = [ln for ln in output.splitlines() if all(p in ln for p in parts)]
    assert len(lines) == 1, f"{parts} not together on one line:\n{output}"
    return lines[0]


# ---- progress ---------------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_prints_plain_lines_and_a_last_one():
    every = io.StringIO()
    with progress(3, "seq_len", stream=every, interval=0) as advance:
        for n in (64, 128, 256):
            advance(note=f"L={n}")
    assert every.getvalue().splitlines() == [
        "seq_len 1/3, 0 s, L=64",
        "seq_len 2/3, 0 s, L=128",
        "seq_len 3/3, 0 s, L=256",
    ]
    rare = io.StringIO()
    with progress(40, "cases", done=10, stream=rare, interval=3600) as advance:
        for _ in range(30):
            advance()
    assert rare.getvalue() == "cases 40/40, 0 s\n"  # throttled: only the line at the end


def test_progress_on_a_terminal_is_a_rich_bar_and_quiet_is_silent():
    tty = _Tty()
    with progress(2, "compare", stream=tty) as advance:
        advance(note="sdpa-math")
        advance(note="sim-flash")
    assert "2/2" in tty.getvalue() and "compare" in tty.getvalue() and ESC in tty.getvalue()
    quiet = io.StringIO()
    with progress(5, "x", stream=quiet, quiet=True) as advance:
        advance(3)
    assert quiet.getvalue() == ""


def test_progress_prints_no_last_line_when_the_work_fails():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress(3, "x", stream=out, interval=3600) as advance:
        advance()
        raise RuntimeError("boom")
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="total=-1"), progress(-1, "x"):
        pass


# ---- file modes -------------------------------------------------------------------------------------


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_atomic_gives_the_mode_of_an_ordinary_file(tmp_path, umask022):
    write_atomic(tmp_path / "summary.json", '{"a": 1}')
    write_atomic(tmp_path / "blob.bin", b"\x00\xff")
    (tmp_path / "plain.txt").write_text("x")
    assert _mode(tmp_path / "summary.json") == _mode(tmp_path / "plain.txt") == 0o644
    assert (tmp_path / "blob.bin").read_bytes() == b"\x00\xff" and _mode(tmp_path / "blob.bin") == 0o644
    os.umask(0o077)  # the umask is honoured, not overridden
    write_atomic(tmp_path / "private.json", "{}")
    assert _mode(tmp_path / "private.json") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "plain.txt", "private.json", "summary.json"]


def test_atomic_target_replaces_on_success_and_cleans_up_on_failure(tmp_path, umask022):
    target = tmp_path / "w.pt"
    with atomic_target(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".pt"
        torch.save({"x": torch.ones(2)}, tmp)
    assert torch.load(target)["x"].sum() == 2 and _mode(target) == 0o644
    with pytest.raises(OSError), atomic_target(target) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert torch.load(target)["x"].sum() == 2
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


def test_every_file_explain_and_study_write_is_0644(tmp_path, umask022):
    human(["explain", *SMALL, "--out", str(tmp_path / "e")])
    (tmp_path / "sweep.toml").write_text(SWEEP)
    human(["study", "--config", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "s"), "--workers", "1"])
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "sweep.toml"]
    names = {p.name for p in files}
    assert {"summary.json", "report.html", "report.md", "study.json", "records.jsonl", "explain.png"} <= names
    assert {p.relative_to(tmp_path).as_posix(): oct(_mode(p)) for p in files if _mode(p) != 0o644} == {}
