"""Nothing dropped in silence, no traceback (issue 22): damaged store lines are named and kept aside, a full
disk is one line and exit 3 with the store whole, pool workers die with a killed parent, one train-study per
folder, hostile JSON nesting in checkpoints, per-preset default folders, and the smaller things a new user met."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import signal
import struct
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import audited_figures
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core import fileio
from flashcheck.core.extras import install_hint
from flashcheck.core.lock import folder_lock
from flashcheck.study import runner as study_runner
from flashcheck.study import store as store_mod
from flashcheck.study.cases import evaluate_group, expand, group_by_inputs
from flashcheck.study.config import StudyConfig, Sweep
from flashcheck.study.runner import run_study
from flashcheck.study.store import ResultStore, append_line

pytestmark = pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules

runner = CliRunner()
ONE = StudyConfig(
    name="one",
    sweeps=(
        Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,), blocks=((8, 8),), heads=1, seeds=(0, 1),
              baseline=False),
    ),
)  # fmt: skip


@pytest.fixture(autouse=True)
def _figures_laid_out_not_rasterised():
    """No test here reads a PNG's pixels: each figure a command saves (explain's attribution, a study's report)
    is laid out (tests.helpers.audited_figures runs figure_problems, which draws it without rendering: an error
    of matplotlib's layout still fails) and written empty instead of rasterised."""
    with audited_figures(save=False):
        yield


@pytest.fixture(scope="module")
def one_records() -> list[str]:
    """ONE's two records as JSON lines, computed in this process (no pool)."""
    threads = torch.get_num_threads()
    lines: list[str] = []
    for group in group_by_inputs(expand(ONE)):
        evaluate_group(group, lambda rec: lines.append(rec.to_json()))
    torch.set_num_threads(threads)
    return lines


def _toml(folder: Path) -> Path:
    sw = ONE.sweeps[0]
    path = folder / "one.toml"
    path.write_text(
        f'name = "one"\n[[sweeps]]\nquestion = "seq_len"\nmethods = {json.dumps(list(sw.methods))}\n'
        f"seq_lens = [32]\nblocks = [[8, 8]]\nheads = 1\nseeds = [0, 1]\nbaseline = false\n"
    )
    return path


def _json_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


# ---- 4: a damaged line is named and its text kept ------------------------------------------------------


def test_a_removed_line_is_named_and_its_text_kept_aside(tmp_path, one_records):
    """A study run removes a line that is not JSON: a warning names the file and line, and the text lands in
    records.jsonl.dropped (nothing lost); nothing is recomputed when the rest holds every case."""
    store = tmp_path / "records.jsonl"
    torn = one_records[1][:57]
    store.write_text(f"{one_records[0]}\n{torn}\n{one_records[1]}\n")
    with pytest.warns(UserWarning) as caught:
        stats = run_study(ONE, tmp_path, workers=1, quiet=True)
    text = " ".join(str(w.message) for w in caught)
    assert re.search(rf"{re.escape(str(store))}: dropped 1 unreadable line\(s\): line 2 \(not JSON", text), text
    assert "records.jsonl.dropped" in text
    assert stats["cases_computed"] == 0 and len(_json_lines(store)) == 2
    assert (tmp_path / "records.jsonl.dropped").read_text() == torn + "\n"


# ---- 5: a full disk ------------------------------------------------------------------------------------


def _full_after(monkeypatch, nbytes: int) -> None:
    """Appends write `nbytes` of their data (a torn line), then the disk is full."""

    def write_some(f, data: bytes) -> None:
        f.write(data[:nbytes])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_mod, "_write_all", write_some)


def test_an_append_on_a_full_disk_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2')  # a line torn by an earlier kill: closed by the next append
    before = path.read_bytes()
    _full_after(monkeypatch, 5)
    with pytest.raises(fileio.DiskFull) as exc:
        append_line(path, json.dumps({"c": 3}))
    assert exc.value.errno == errno.ENOSPC and exc.value.path == path and exc.value.needed == len(b'\n{"c": 3}\n')
    assert path.read_bytes() == before


def test_write_atomic_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")

    def no_room(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", no_room)
    with pytest.raises(fileio.DiskFull) as exc:
        fileio.write_atomic(path, "x" * 1000)
    monkeypatch.undo()
    assert exc.value.needed == 1000 and exc.value.path == path
    again = pickle.loads(pickle.dumps(exc.value))  # as a pool worker's error reaches its parent
    assert (type(again), again.path, again.needed, again.errno) == (fileio.DiskFull, path, 1000, errno.ENOSPC)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_writer_that_fails_on_a_full_disk_without_an_oserror_is_a_disk_full(tmp_path, monkeypatch):
    """torch.save reports ENOSPC as a RuntimeError ("unexpected pos ..."): with (almost) no space left, the
    failure is a DiskFull all the same; with space, the writer's own error."""
    path = tmp_path / "state.pt"
    for room, expected in ((0, fileio.DiskFull), (1 << 30, RuntimeError)):
        monkeypatch.setattr(fileio, "_no_room", lambda folder, room=room: room < fileio.LOW_ROOM)
        with pytest.raises(expected), fileio.atomic_target(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 67776 vs 67664")
        assert list(tmp_path.iterdir()) == []


def test_study_on_a_full_disk_is_one_line_exit_3_and_the_store_stays_whole(tmp_path, monkeypatch, one_records):
    """The store holds one case; the other is too big for a machine with 1 kB (no pool starts), and the
    disk fills up in the middle of its skip record."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text(one_records[0] + "\n")
    before = (out / "records.jsonl").read_bytes()
    monkeypatch.setattr(study_runner, "available_bytes", lambda: 1024)
    _full_after(monkeypatch, 20)
    res = runner.invoke(app, ["study", "--config", str(_toml(tmp_path)), "--out", str(out), "--quiet"])
    assert res.exit_code == 3 and isinstance(res.exception, SystemExit), res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: no space left in {str(out)!r} (") and "run the same command again" in line, line
    need = len(before) + study_runner.REPORT_BYTES  # one case left, a record line about as long as the first
    got = re.search(r"free at least ([\d.]+) MB there", line)
    assert got and abs(float(got[1]) - need / 1e6) <= 0.05, line  # three digits
    assert (out / "records.jsonl").read_bytes() == before


# ---- 6: pool workers die with their parent -------------------------------------------------------------


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _descendants(pid: int) -> set[int]:
    """Children and their children: workers forked by the fork server the parent started are grandchildren."""
    kids = _children(pid)
    return kids.union(*(_descendants(k) for k in kids))


def _kill_and_watch(proc, ready, workers: int = 2) -> list[int]:
    """Wait until `ready()` and `workers` descendants exist, SIGKILL the parent, return the descendants still
    alive 5 s later (killed then, so that a failing test leaves no orphan)."""
    deadline, kids = time.time() + 120, set()
    while time.time() < deadline and proc.poll() is None:
        kids = _descendants(proc.pid)
        if len(kids) >= workers and ready():
            break
        time.sleep(0.05)
    assert proc.poll() is None and len(kids) >= workers, proc.communicate()[1][-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.time() + 5
    while time.time() < end and any(_alive(k) for k in kids):
        time.sleep(0.05)
    alive = [k for k in kids if _alive(k)]
    for k in alive:
        os.kill(k, signal.SIGKILL)
    return alive


LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the workers")


@pytest.mark.slow
@LINUX_PROC
def test_study_workers_exit_when_the_study_is_killed(tmp_path, forked_cli):
    # per group a fast case first (its record shows that the workers run), then slower ones: killed
    # meanwhile, the old workers finished their group and then waited on the pool's queue for ever
    cfg = tmp_path / "slow.toml"
    cfg.write_text(
        'name = "slow"\n[[sweeps]]\nquestion = "seq_len"\nmethods = ["flash:bf16", "flash:fp16", "flash:bf16-mixed"]\n'
        "seq_lens = [512]\nblocks = [[64, 64], [1, 1], [2, 2]]\nheads = 1\nseeds = [0, 1]\nbaseline = false\n"
    )
    out = tmp_path / "out"
    proc = forked_cli(["study", "--config", cfg, "--out", out, "--workers", "2", "--quiet"])  # a forked `flashcheck`
    store = out / "records.jsonl"
    assert _kill_and_watch(proc, lambda: store.exists() and store.stat().st_size > 0) == []


@pytest.mark.slow
@LINUX_PROC
def test_train_study_workers_exit_when_it_is_killed(tmp_path, forked_cli):
    out = tmp_path / "out"
    cmd = ["train-study", "--preset", "tiny", "--steps", "1000000"]
    proc = forked_cli([*cmd, "--out", out, "--workers", "2"])  # `python -m flashcheck.cli ...`, forked (conftest)
    assert _kill_and_watch(proc, lambda: len(list(out.glob("runs/*/config.json"))) >= 2) == []


# ---- 7: one train-study per folder ---------------------------------------------------------------------


def test_a_second_train_study_on_a_folder_in_use_is_refused_at_once(tmp_path):
    with folder_lock(tmp_path, "train-study"):
        res = runner.invoke(app, ["train-study", "--preset", "tiny", "--out", str(tmp_path), "--workers", "1"])
        assert res.exit_code == 2, res.output
        assert f"is in use by another flashcheck train-study (PID {os.getpid()})" in res.stderr, res.output
        assert not list(tmp_path.glob("runs/*")) and not (tmp_path / "summary.json").exists()
        res = runner.invoke(app, ["study", "--config", str(_toml(tmp_path)), "--out", str(tmp_path)])
        assert res.exit_code == 2 and "another flashcheck train-study" in res.stderr, res.output


def test_tied_max_holds_the_folder_lock_too(tmp_path):
    from flashcheck.core.lock import FolderLocked
    from flashcheck.training.tied_max import tied_max_report

    with folder_lock(tmp_path, "study"), pytest.raises(FolderLocked, match="another flashcheck study"):
        tied_max_report(tmp_path, seeds=1, steps=1)


# ---- 8: hostile JSON nesting ---------------------------------------------------------------------------


def _depth(obj) -> int:
    if isinstance(obj, dict | list):
        return 1 + max((_depth(v) for v in (obj.values() if isinstance(obj, dict) else obj)), default=0)
    return 0


def test_nesting_check_is_exact_with_brackets_and_escapes_inside_strings():
    import random

    from flashcheck.training.safetensors_format import MAX_NESTING, nesting_problem

    rng = random.Random(0)

    def leaf():
        return rng.choice(['a\\"[', "]]}\\", 1, '"{"', "[[[[", "}}}"])

    def tree(d: int):
        """A value exactly `d` levels deep: one chain that deep, shallow siblings around it."""
        if d == 0:
            return leaf()
        items = [tree(d - 1), *(leaf() for _ in range(rng.randint(0, 2)))]
        rng.shuffle(items)
        return items if rng.random() < 0.5 else {f'k{i}[\\"': v for i, v in enumerate(items)}

    seen = set()
    for _ in range(300):
        obj = tree(rng.randint(0, 24))
        seen.add(_depth(obj) > MAX_NESTING)
        assert (nesting_problem(json.dumps(obj).encode()) is None) == (_depth(obj) <= MAX_NESTING), obj
    assert seen == {True, False}


def _deep_safetensors(path: Path, depth: int) -> Path:
    header = b"[" * depth
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@pytest.mark.parametrize("depth", [500_000, 5_000])
def test_drift_on_a_deeply_nested_header_exits_2_with_one_line(tmp_path, depth):
    pytest.importorskip("safetensors")
    a = _deep_safetensors(tmp_path / "a.safetensors", depth)
    res = runner.invoke(app, ["drift", str(a), str(a)])
    assert res.exit_code == 2 and not isinstance(res.exception, RecursionError), res.output
    (line,) = res.stderr.strip().splitlines()
    assert str(a) in line and "more than 16 levels deep" in line, line


def test_a_deeply_nested_index_is_refused(tmp_path):
    from flashcheck.training.checkpoints import CheckpointError
    from flashcheck.training.shards import open_index

    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": ' + "[" * 100_000)
    with pytest.raises(CheckpointError, match="more than 16 levels deep"):
        open_index(index)


def test_a_deeply_nested_record_line_is_dropped_not_a_traceback(tmp_path, one_records):
    (tmp_path / "records.jsonl").write_text(one_records[0] + "\n" + "[" * 100_000 + "\n")
    with pytest.warns(UserWarning, match="line 2"):
        assert len(ResultStore(tmp_path).load()) == 1


# ---- 14: each preset its own default folder ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "folder"),
    [
        (["study"], "flashcheck-study"),
        (["study", "--preset", "tiny"], "flashcheck-study-tiny"),
        (["study", "--preset", "guide-tiny"], "flashcheck-study-guide-tiny"),
        (["study", "--config", "mine.toml"], "flashcheck-study-mine"),
        (["train-study"], "flashcheck-train-study"),
        (["train-study", "--preset", "tiny"], "flashcheck-train-study-tiny"),
        (["train-study", "--preset", "tied-max"], "flashcheck-train-study-tied-max"),
    ],
)
def test_each_preset_has_its_own_default_folder(tmp_path, monkeypatch, args, folder):
    """The folder each command hands to its runner (the runs themselves are replaced: only the name matters)."""
    from flashcheck.questions.guide import report as guide_report
    from flashcheck.study import config, report
    from flashcheck.training import experiments, tied_max

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.toml").write_text(_toml(tmp_path).read_text())
    got = []
    summary = {"failed": 0, "findings": [], "failures": []}

    def fake_run(cfg, out, *a, **kw):
        got.append(str(out))
        return {}

    monkeypatch.setattr(study_runner, "run_study", fake_run)
    monkeypatch.setattr(report, "build_report", lambda out: summary)
    monkeypatch.setattr(guide_report, "build_guide_report", lambda out: summary)
    monkeypatch.setattr(config, "preset", lambda name: ONE)
    monkeypatch.setattr(experiments, "run_train_study", fake_run)
    monkeypatch.setattr(tied_max, "tied_max_report", lambda out, *a, **kw: fake_run(None, out))
    res = runner.invoke(app, [*args, "--quiet"])
    assert res.exit_code == 0, res.output
    assert got == [folder]


def test_explain_with_a_preset_has_its_own_default_folder(tmp_path, monkeypatch):
    """explain --preset A then --preset B keeps A's summary (each preset its own folder; issue 22 item 14)."""
    monkeypatch.chdir(tmp_path)
    for name in ("sage1", "fa4-fp8"):
        res = runner.invoke(app, ["explain", "--preset", name, "--seq-len", "64", "--heads", "1", "--json"])
        assert res.exit_code == 0, res.output
        assert (tmp_path / f"flashcheck-explain-{name}" / "summary.json").exists()
    assert not (tmp_path / "flashcheck-explain").exists()


def test_the_readme_names_every_default_folder():
    """Every command's default --out folder (explain's, mutants', validate's; study's and train-study's
    per preset) is named in the docs (README.md and docs/**/*.md)."""
    import inspect

    root = Path(__file__).resolve().parents[1]
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    defaults = set()
    for command in app.registered_commands:
        out = inspect.signature(command.callback).parameters.get("out")
        if out is not None and isinstance(out.default.default, str):
            defaults.add(out.default.default)
    assert {"flashcheck-explain", "flashcheck-mutants", "flashcheck-validate"} <= defaults
    per_preset = {"flashcheck-study", "flashcheck-study-PRESET", "flashcheck-train-study-PRESET"}
    per_preset |= {"flashcheck-explain-PRESET"}
    for folder in defaults | per_preset:
        assert f"`{folder}`" in readme, folder


# ---- 15: smaller things --------------------------------------------------------------------------------


def _predict(*args: str) -> str:
    res = runner.invoke(app, ["predict", "--seq-len", "512", *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_predict_says_block_k_ignored_only_when_given():
    assert "ignored" not in _predict("--kernel", "sdpa-flash")
    assert "--block-k 64 ignored" in _predict("--kernel", "sdpa-flash", "--block-k", "64")
    assert "ignored" not in _predict("--block-k", "64") and "Bc=64" in _predict("--block-k", "64")
    assert json.loads(_predict("--kernel", "sdpa-flash", "--json"))["block_k_asked"] is None


def test_predict_cites_no_held_out_count_of_its_own():
    """The held-out count is the report's (it depends on the backends a machine runs): predict points there."""
    model = next(x for x in _predict().splitlines() if x.startswith("model: "))
    assert not re.search(r"\d+ held-out", model) and "error_model" in model, model


def test_compare_backend_table_keeps_names_whole(monkeypatch):
    """At 80 columns the backend names stay whole (sdpa-math vs sdpa-math-lowp), and no op name is cut."""
    from rich.console import Console

    from flashcheck.cli import show

    def result(label: str, op: str) -> dict:
        err = {"rel_l2": 1e-3, "max_abs": 2e-3}
        config = {"label": label, "numerics": "bf16", "seq_len": 32, "device": "cpu"}
        ops = [f"aten::{op}", "aten::scaled_dot_product_attention"]
        return {"config": config, "status": "ok", "candidate": err, "baseline_impl": "eager:bf16",
                "ratio": {"max_abs": 1.0}, "budget": {"passed": True}, "kernel_ops": ops}  # fmt: skip

    math_op, flash_op = "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu"
    rows = [result("sdpa-math", math_op), result("sdpa-math-lowp", math_op), result("sdpa-flash", flash_op)]
    for width in (80, 200):
        console = Console(width=width, record=True, highlight=False)
        monkeypatch.setattr(show, "_console", lambda stderr=False, c=console: c)
        show.print_backends(rows)
        text = console.export_text()
        # boxed, unboxed or one block per row (cli.show.print_whole): every name and op whole, none cut
        assert "sdpa-math-lowp" in text and re.search(r"(^|│ )sdpa-math(\s+│|\s*$)", text, re.M), text
        assert "…" not in text and flash_op in text and math_op in text, text


def test_log_stats_gives_latencies_a_unit(caplog):
    import logging

    from flashcheck.guard import Guard, log_stats

    guard = Guard("sim-flash", "sim-standard")
    q = torch.randn(1, 1, 8, 8)
    guard(q, q, q)
    with caplog.at_level(logging.INFO, logger="flashcheck.guard"):
        log_stats(guard.stats())
    assert re.search(r"latency p50 \d+\.\d{3} ms p99 \d+\.\d{3} ms", caplog.text), caplog.text


@pytest.mark.parametrize(("name", "extra", "modules"), [
    ("lightning_callback", "lightning", ("lightning", "lightning.pytorch", "pytorch_lightning")),
    ("hf_callback", "hf", ("transformers",)),
])  # fmt: skip
def test_recorders_without_their_framework_name_the_extra(tmp_path, monkeypatch, name, extra, modules):
    from flashcheck.training import record

    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)  # `import m` raises ImportError
    with pytest.raises(ImportError, match=re.escape(install_hint(extra))):  # the command this install needs
        getattr(record, name)(tmp_path)


def test_help_shows_no_type_after_plain_flags():
    res = runner.invoke(app, ["study", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    flags = [x for x in res.stdout.splitlines() if re.search(r"--(quiet|help)\b", x)]
    assert len(flags) == 2 and not any("<bool>" in x for x in flags), flags
    assert "<int>" in next(x for x in res.stdout.splitlines() if "--workers" in x)
    root = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    assert "--version" in root and "<bool>" not in root


def test_the_guard_docstring_names_an_implementation_it_accepts():
    import flashcheck.guard
    from flashcheck.guard.integrations import _check_name

    names = re.findall(r'attn_implementation="([^"]+)"', flashcheck.guard.__doc__)
    assert names
    for name in names:
        _check_name(name)  # ValueError for a name transformers would load as FlashAttention


def test_explain_never_overwrites_a_study_folder_nor_writes_through_a_link(tmp_path):
    """explain --out STUDY (or another command's summary.json, or a link) is refused before any work; its own
    folder is rewritten (issue fixb2 item 2)."""
    study = tmp_path / "T"
    study.mkdir()
    (study / "records.jsonl").write_text("")
    (study / "summary.json").write_text('{"findings": []}')
    other = tmp_path / "H"
    other.mkdir()
    (other / "summary.json").write_text('{"target": "x"}')
    (tmp_path / "lnk").symlink_to(tmp_path / "E")
    args = ["explain", "--numerics", "bf16", "--seq-len", "16", "--heads", "1", "--json", "--out"]
    for out, words in ((study, "holds records.jsonl"), (other, "holds summary.json"), (tmp_path / "lnk", "link")):
        res = runner.invoke(app, [*args, str(out)])
        assert res.exit_code == 2 and words in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert (study / "summary.json").read_text() == '{"findings": []}' and not (tmp_path / "E").exists()
    for _ in range(2):  # explain's own folder: rewritten
        assert runner.invoke(app, [*args, str(tmp_path / "own")]).exit_code == 0
