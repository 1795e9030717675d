"""Bounds on what a hostile file or a Ctrl-C can make the tool do (issue 47, item 7): a dump's declared arrays are
checked against the shapes the judge can use and the memory here before anything is inflated; study.json is bounded
before it is parsed; a rewritten or repaired file keeps its mode; text from records reaches the terminal and the
reports without control characters; Ctrl-C while the fork server starts is one line, exit 130."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import flashcheck
from flashcheck.cli import app
from flashcheck.study.store import ResultStore

runner = CliRunner()
SRC = str(Path(flashcheck.__file__).resolve().parents[1])  # the sources under test, for child processes


def _npz_with_a_huge_zero_member(path: Path, name: str, shape: tuple[int, ...], small: dict) -> None:
    """An .npz whose member `name` declares `shape` (float32 zeros, deflated in 16 MiB pieces at zlib's fastest
    level, a third of the default's CPU: about 1/230 on disk) beside the small arrays `small`; its directory size
    and header agree, as a careful forger makes them."""
    from numpy.lib import format as npy

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for key, arr in small.items():
            with z.open(f"{key}.npy", "w") as f:
                npy.write_array(f, arr)
        with z.open(f"{name}.npy", "w", force_zip64=True) as f:
            npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
            left, piece = int(np.prod(shape)) * 4, bytes(1 << 24)
            while left:
                f.write(piece[: min(left, len(piece))])
                left -= min(left, len(piece))


def _judge_peaks_kib(*paths: Path) -> list[tuple[int, str]]:
    """[(peak resident KiB after it, its stderr line)] of `flashcheck judge PATH` for each path in turn, in one
    process of their own (the peak only grows: each path's is the most of it and of those before)."""
    code = (
        "import resource, sys\nfrom flashcheck.cli import main\nfor path in sys.argv[1:]:\n"
        "    sys.argv = ['flashcheck', 'judge', path]\n    try:\n        main()\n    except SystemExit as e:\n"
        "        print('exit', e.code, file=sys.stderr)\n"
        "    print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
    )
    res = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": SRC})  # fmt: skip
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 3 * len(paths) and all(x == "exit 2" for x in lines[1::3]), res.stderr
    return [(int(peak.split()[1]), error) for error, peak in zip(lines[::3], lines[2::3], strict=True)]


def test_a_small_npz_declaring_a_huge_output_is_refused_before_inflating(tmp_path):
    """The trial's 2 MB file inflated 2.39 GB in judge before it refused (the shapes disagree): the shapes are now
    checked once every header is read, before any data is. The judge's peak memory is that of the same refusal of
    a file whose wrong output is small, run first in the same process (main: about 580 MiB more with a 512 MiB
    member inflated; 256 MiB here, twice the bound)."""
    small = {n: np.zeros((1, 1, 4, 8), np.float32) for n in ("q", "k", "v")}
    path = tmp_path / "bomb.npz"
    _npz_with_a_huge_zero_member(path, "out", (1, 1, 2**23, 8), small)  # 256 MiB inflated
    assert path.stat().st_size < 2**21
    np.savez(tmp_path / "plain.npz", **small, out=np.zeros((1, 1, 5, 8), np.float32))
    (baseline, _), (peak, error) = _judge_peaks_kib(tmp_path / "plain.npz", path)
    assert "tensor 'out' has shape" in error and "8388608" in error, error
    assert peak < baseline + 2**17, f"peak {peak} KiB against {baseline} KiB: the 256 MiB member was inflated"


def test_a_dump_larger_than_the_memory_here_is_refused_on_its_declared_size(tmp_path, monkeypatch):
    import flashcheck.kernels.sim.memory as memory
    import flashcheck.measure.dumpfile as dumpfile

    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * 2**20)  # 8 MiB free: a dump may take 4 MiB
    inflated = []
    monkeypatch.setattr(dumpfile, "_npy_data", lambda *a: inflated.append(a) or None)
    q = np.zeros((1, 1, 2**12, 64), np.float32)  # 1 MiB each, 4 MiB with out: over the half of 8 MiB
    np.savez_compressed(tmp_path / "d.npz", q=q, k=q, v=q, out=q, extra=q[..., :1])
    with pytest.raises(dumpfile.DumpError, match=r"more than the 4194304 bytes a dump may take here \(half the"):
        dumpfile.read_dump(tmp_path / "d.npz")
    assert inflated == []


def test_a_huge_study_json_is_refused_before_it_is_parsed(tmp_path):
    from flashcheck.study.store import MAX_STUDY_JSON

    out = tmp_path / "s"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"name": "x", "sweeps": [], "pad": "x" * MAX_STUDY_JSON}))
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "study.json" in res.stderr and f"more than the {MAX_STUDY_JSON} bytes" in res.stderr, res.stderr


def test_a_repaired_store_keeps_its_private_mode(tmp_path):
    store = tmp_path / "records.jsonl"
    store.write_text('{"half": \n')
    store.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ResultStore(tmp_path).repair() == 1
    assert store.read_text() == "" and stat.S_IMODE(store.stat().st_mode) == 0o600


def test_control_characters_of_a_forged_record_never_reach_the_terminal_or_the_reports(tmp_path):
    from flashcheck.study.cases import CaseRecord, evaluate_group, expand, group_by_inputs
    from flashcheck.study.config import StudyConfig, Sweep

    cfg = StudyConfig(name="one", sweeps=(Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,),
                                                blocks=((8, 8),), heads=1, seeds=(0,), baseline=False),))  # fmt: skip
    recs: list[CaseRecord] = []
    for group in group_by_inputs(expand(cfg)):
        evaluate_group(group, recs.append)
    d = json.loads(recs[0].to_json())
    hostile = "\x1b[2J\x1b]0;owned\x07\x1b[31mred\r\u202eevil"
    d |= {"status": "failed", "errors": {}, "errors_rounded": {}, "error": f"boom {hostile}"}
    d["env"]["torch"] = hostile
    out = tmp_path / "s"
    out.mkdir()
    (out / "study.json").write_text(json.dumps(cfg.to_dict()))
    (out / "records.jsonl").write_text(json.dumps(d) + "\n")
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assr = "\\x1b[2J\\x1b]0;owned\\x07\\x1b[31mred\\r\\u202eevil"
    assert f"boom {assr}" in res.output, res.output  # shown as escapes, readable
    for name in ("report.md", "report.html", "summary.json"):
        text = (out / name).read_text()
        assert not any(c in text for c in "\x1b\x07\r\u202e"), name


def test_ctrl_c_anywhere_in_a_command_is_one_line_exit_130(monkeypatch, capsys):
    import flashcheck.cli as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_inside_a_command_through_typer_is_the_same_one_line(monkeypatch, capsys):
    """typer turns a command's KeyboardInterrupt into a silent Exit(130): compare ran minutes and exited 130 without a
    word (a new-user trial). Through the real app: one line; a command that said its own line says no second."""
    import typer

    import flashcheck.backends
    import flashcheck.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(flashcheck.backends, "all_backends", interrupted)
    monkeypatch.setattr(sys, "argv", ["flashcheck", "backends"])
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 130 and capsys.readouterr().err.strip() == "interrupted"

    def says_its_own(*args, **kwargs):
        typer.echo("interrupted: what is stored", err=True)
        raise typer.Exit(130) from None  # as study and hunt do

    monkeypatch.setattr(flashcheck.backends, "all_backends", says_its_own)
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 130 and capsys.readouterr().err.strip() == "interrupted: what is stored"


def _sigint_ignored(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError("no SigIgn line")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_fork_server_ignores_ctrl_c_from_its_start_and_the_parent_keeps_its_handler(tmp_path):
    """Ctrl-C while the server imported torch printed its 30-line traceback: it now starts with SIGINT ignored
    (inherited across exec), so the parent alone answers a Ctrl-C."""
    (tmp_path / "slow_preload.py").write_text("import time\ntime.sleep(20)\n")  # as torch takes seconds
    code = (  # the parent's handler after as before (default_int_handler; SIG_IGN where started in the background)
        "import signal; from multiprocessing import forkserver; from flashcheck.core.pool import fresh_context;"
        "before = signal.getsignal(signal.SIGINT);"
        "fresh_context(['slow_preload']); print(forkserver._forkserver._forkserver_pid, flush=True);"
        "print(signal.getsignal(signal.SIGINT) is before, flush=True)"
    )
    env = {**os.environ, "PYTHONPATH": f"{SRC}:{tmp_path}"}
    p = subprocess.Popen([sys.executable, "-c", code + "; import time; time.sleep(30)"], stdout=subprocess.PIPE,
                         text=True, env=env)  # fmt: skip
    try:
        pid, restored = int(p.stdout.readline()), p.stdout.readline().strip()
        assert restored == "True"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not Path(f"/proc/{pid}/status").exists():
            time.sleep(0.05)
        time.sleep(1.0)  # the server runs, importing its preload (20 s): main's took Ctrl-C there
        assert _sigint_ignored(pid)
    finally:
        p.kill()
        p.wait()


def test_a_small_study_json_naming_millions_of_cases_is_refused_before_expanding(tmp_path):
    """New probe: 690 kB of study.json (100,000 lengths x 100 seeds x 2 methods) kept `report` expanding 20 million
    cases for minutes; the count is bounded on the declared lists, before any case is made."""
    from flashcheck.study.config import MAX_CASES, StudyConfig, Sweep

    sw = Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,), blocks=((8, 8),), heads=1, seeds=(0,))
    data = StudyConfig(name="big", sweeps=(sw,)).to_dict()
    data["sweeps"][0] |= {"seq_lens": list(range(1, 100_001)), "seeds": list(range(100))}
    out = tmp_path / "s"
    out.mkdir()
    (out / "study.json").write_text(json.dumps(data))
    start = time.monotonic()
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"up to 20000000 cases, more than the {MAX_CASES} a study runs" in res.stderr, res.stderr
    assert time.monotonic() - start < 60
