"""`flashcheck study` / `report` when things go wrong: killed workers, failed cases, damaged store
files, a second run on the same folder, progress off a terminal, and bad input (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.helpers import audited_figures
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.study import runner as study_runner
from flashcheck.study.cases import Case, CaseRecord, evaluate_group, expand, group_by_inputs
from flashcheck.study.config import StudyConfig, Sweep, load_config
from flashcheck.study.executors import emit, run_local
from flashcheck.study.report import build_report
from flashcheck.study.runner import run_study
from flashcheck.study.store import ResultStore, folder_lock

pytestmark = pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules

runner = CliRunner()
ONE = StudyConfig(
    name="one",
    sweeps=(
        Sweep(
            question="seq_len",
            methods=("flash:bf16",),
            seq_lens=(32,),
            blocks=((8, 8),),
            heads=1,
            seeds=(0, 1),
            baseline=False,
        ),
    ),
)
FAILING = """name = "fails"
[[sweeps]]
question = "fa3"
methods = ["flash:fa3-fp8", "flash:bf16"]
seq_lens = [16]
head_dims = [12]
heads = 1
baseline = false
"""


@pytest.fixture(autouse=True)
def _figures_audited_not_rendered():
    """No test here looks into a PNG: each figure a report saves is laid out (tests.helpers.audited_figures runs
    figure_problems: an error of matplotlib's layout still fails) and written empty instead of rasterised (a
    third of a report's time)."""
    with audited_figures(save=False) as seen:
        yield
    assert {name: problems for name, problems, _ in seen if problems} == {}  # a failed method is no legend entry


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def one_study(tmp_path_factory) -> Path:
    """`run_study(ONE)` once per module (each run spawns a worker process that imports torch): the folder a
    fresh study of ONE leaves, read-only; `_one` copies it for a test that starts from a finished study."""
    folder = tmp_path_factory.mktemp("one-study")
    stats = run_study(ONE, folder, workers=1, quiet=True)
    assert stats["cases_computed"] == 2 and stats["cases_failed"] == 0, stats
    return folder


def _one(one_study: Path, folder: Path) -> None:
    """Put a finished study of ONE in `folder`, as `run_study(ONE, folder)` would leave it."""
    shutil.copytree(one_study, folder, dirs_exist_ok=True)
    assert len(ResultStore(folder).load()) == 2


def _failed_copy(rec: CaseRecord, error: str = "BrokenProcessPool: a worker died") -> str:
    return CaseRecord(rec.case_id, rec.case, "failed", {}, {}, 0.0, error, rec.env).to_json()


def _no_ok_superseded(path: Path) -> None:
    """Every case that has an ok line has no failed line after it."""
    seen_ok = set()
    for line in _lines(path):
        assert not (line["status"] == "failed" and line["case_id"] in seen_ok), line
        if line["status"] == "ok":
            seen_ok.add(line["case_id"])


# ---- ok is final; failed is not done ----------------------------------------------------------------


def test_ok_wins_over_a_failure_in_either_order(tmp_path, one_study):
    _one(one_study, tmp_path)
    store = tmp_path / "records.jsonl"
    first, second = (CaseRecord.from_dict(d) for d in _lines(store))
    store.write_text(
        store.read_text() + _failed_copy(first) + "\n"  # ok, then failed
    )
    store.write_text(_failed_copy(second) + "\n" + store.read_text())  # failed, then ok
    loaded = ResultStore(tmp_path).load()
    assert {r.status for r in loaded.values()} == {"ok"} and len(loaded) == 2
    assert run_study(ONE, tmp_path, workers=1, quiet=True)["cases_computed"] == 0


def test_a_failed_case_is_retried_on_the_next_run(tmp_path, one_study):
    _one(one_study, tmp_path)
    store = tmp_path / "records.jsonl"
    lost = CaseRecord.from_dict(_lines(store)[0])
    store.write_text(_failed_copy(lost) + "\n" + "".join(line + "\n" for line in store.read_text().splitlines()[1:]))
    assert ResultStore(tmp_path).load()[lost.case_id].status == "failed"
    stats = run_study(ONE, tmp_path, workers=1, quiet=True)
    assert stats["cases_computed"] == 1 and stats["cases_failed"] == 0
    again = ResultStore(tmp_path).load()[lost.case_id]
    assert again.status == "ok" and again.errors == lost.errors  # the same value, recomputed


def test_failures_exit_1_and_are_listed_in_the_output_and_reports(tmp_path):
    (tmp_path / "c.toml").write_text(FAILING)
    out = tmp_path / "o"
    args = ["study", "--config", str(tmp_path / "c.toml"), "--out", str(out), "--workers", "1"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    label = "flash:fa3-fp8 L=16 D=12 tiles 128x128 normal seed 0"
    line = next(ln for ln in res.output.splitlines() if label in ln)
    assert "power-of-two head dim; got 12" in line and "1 case(s) failed" in res.output
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## Failed cases (1)" in md and re.search(rf"\| {re.escape(label)} \| ValueError: Hadamard", md)
    assert "<h2 id='problems'>Failed cases (1)</h2>" in page and label in page  # the conclusion links to it
    again = runner.invoke(app, [*args, "--quiet"])  # tried again, fails again; --quiet still names it
    assert again.exit_code == 1 and label in again.stderr and again.stdout == "", again.output
    assert [r["cases_computed"] for r in _lines(out / "runs.jsonl")] == [2, 1]


# ---- a killed worker ---------------------------------------------------------------------------------


def _die_once(cases: list[Case]) -> int:
    """Pool task: on seed 1, report its first case, then SIGKILL the worker, the first time only."""
    marker = Path(os.environ["FC_TEST_MARKER"])
    if cases[0].seed == 1 and not marker.exists():
        evaluate_group(cases[:1], emit)
        time.sleep(0.5)  # let the queue's feeder thread send the record
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate_group(cases, emit)


def _die_always(cases: list[Case]) -> int:
    if cases[0].seed == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate_group(cases, emit)


def _raise(cases: list[Case]) -> int:
    evaluate_group(cases[:1], emit)
    raise RuntimeError("group exploded after its first case")


def _three_groups() -> list[list[Case]]:
    sweep = Sweep(question="q", methods=("flash:bf16",), seq_lens=(16,), blocks=((8, 8),), heads=1, seeds=(0, 1, 2))
    return group_by_inputs(expand(StudyConfig(name="k", sweeps=(sweep,))))


def test_a_worker_killed_once_loses_nothing_and_redoes_only_what_it_had_not_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("FC_TEST_MARKER", str(tmp_path / "died"))
    got: list[CaseRecord] = []
    run_local(_three_groups(), 2, got.append, task=_die_once)
    assert (tmp_path / "died").exists()
    ids = [r.case_id for r in got]
    assert sorted(ids) == sorted(c.case_id for g in _three_groups() for c in g)  # each exactly once
    assert {r.status for r in got} == {"ok"}


@pytest.mark.slow  # five pools: two shared, then each group alone
def test_a_group_that_kills_its_worker_every_time_is_recorded_failed_and_the_rest_finish():
    got: list[CaseRecord] = []
    run_local(_three_groups(), 2, got.append, task=_die_always)
    by_seed = {}
    for r in got:
        by_seed.setdefault(r.case.seed, set()).add(r.status)
    assert by_seed == {0: {"ok"}, 1: {"failed"}, 2: {"ok"}}
    assert all("worker died" in r.error for r in got if r.status == "failed")
    assert len(got) == sum(len(g) for g in _three_groups())


def test_a_group_that_raises_keeps_its_reported_cases():
    got: list[CaseRecord] = []
    groups = _three_groups()
    run_local(groups[:1], 1, got.append, task=_raise)
    assert [r.status for r in got] == ["ok", "failed"]  # the first case's ok is not overwritten
    assert "group exploded" in got[1].error and got[0].case_id != got[1].case_id


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _pool_worker(pid: int) -> int | None:
    """A pool worker of the study `pid`: a fresh process, forked from the fork server (a freshly started
    interpreter, child of `pid`), never from the study itself."""
    for server in _children(pid):
        try:
            if b"multiprocessing.forkserver" not in Path(f"/proc/{server}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        for child in _children(server):
            return child
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the pool's workers")
def test_sigkill_of_one_worker_of_two(tmp_path, forked_cli):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "kill"\n[[sweeps]]\nquestion = "seq_len"\nmethods = ["flash:bf16"]\nseq_lens = [256]\n'
        "blocks = [[4, 4], [8, 8]]\nheads = 2\nseeds = [0, 1, 2, 3, 4, 5, 6, 7]\n"
    )  # 24 cases, ~0.1 s each on 2 idle cores: the kill lands with most of them still to run
    out = tmp_path / "out"
    cmd = ["study", "--config", str(cfg), "--out", str(out)]
    proc = forked_cli([*cmd, "--workers", "2", "--quiet"])  # `python -m flashcheck.cli ...`, forked (conftest)
    store, deadline, killed = out / "records.jsonl", time.time() + 300, False
    while time.time() < deadline and not killed and proc.poll() is None:
        if store.exists() and len(store.read_text().splitlines()) >= 2 and (victim := _pool_worker(proc.pid)):
            try:
                os.kill(victim, signal.SIGKILL)
                killed = True
            except ProcessLookupError:  # that worker ended between the look and the kill: find another
                pass
        time.sleep(0.05)
    assert killed, "no worker killed while the study ran"
    _, err = proc.communicate(timeout=300)
    total = len(expand(load_config(cfg)))
    assert proc.returncode == 0, err
    _no_ok_superseded(store)
    records = ResultStore(out).load()
    assert len(records) == total and {r.status for r in records.values()} == {"ok"}
    assert len(_lines(store)) == total  # nothing recomputed that had been reported
    rerun = runner.invoke(app, [*cmd, "--quiet"])  # in this process: the kill is over
    assert rerun.exit_code == 0 and len(_lines(out / "runs.jsonl")) == 1, rerun.output  # nothing left to do


# ---- the store files -----------------------------------------------------------------------------------


def test_damaged_lines_are_dropped_with_file_and_line_named(tmp_path, one_study):
    _one(one_study, tmp_path)
    (tmp_path / "runs.jsonl").write_text((tmp_path / "runs.jsonl").read_text() + '{"cases_tot')
    store = tmp_path / "records.jsonl"
    good = store.read_text().splitlines()
    store.write_text(good[0] + "\n" + good[1][:40] + "\n[1, 2]\n")
    before = store.read_bytes()
    res = runner.invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert re.search(rf"warning: {re.escape(str(tmp_path / 'runs.jsonl'))}: dropped 1 .*line 2 \(not JSON", res.stderr)
    assert re.search(r"records\.jsonl: dropped 2 .*line 2 \(.*line 3 \(", res.stderr), res.stderr
    assert store.read_bytes() == before  # report never rewrites the store
    assert len(json.loads((tmp_path / "summary.json").read_text())["runs"]) == 1
    stats = run_study(ONE, tmp_path, workers=1, quiet=True)  # study repairs and recomputes the lost case
    assert stats["cases_computed"] == 1 and len(ResultStore(tmp_path).load()) == 2
    # a line that is no record (issue 34: forged or mistyped lines too) is kept aside with the half-written ones
    assert "[1, 2]" in (tmp_path / "records.jsonl.dropped").read_text().splitlines()


def test_damaged_study_json(tmp_path, one_study):
    _one(one_study, tmp_path)
    (tmp_path / "study.json").write_text('{"name": "one", "swe')
    res = runner.invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "study.json" in res.output and "damaged" in res.output, res.output
    with pytest.warns(UserWarning, match="study.json.*damaged.*rewriting"):
        assert run_study(ONE, tmp_path, workers=1, quiet=True)["cases_computed"] == 0
    assert json.loads((tmp_path / "study.json").read_text()) == json.loads(json.dumps(ONE.to_dict()))


def test_report_keeps_records_with_fields_of_a_newer_version(tmp_path, one_study):
    _one(one_study, tmp_path)
    store = tmp_path / "records.jsonl"
    lines = _lines(store)
    lines[0]["provenance"] = {"by": "flashcheck 9"}
    lines[0]["case"]["device"] = "cpu"
    store.write_text("".join(json.dumps(d) + "\n" for d in lines))
    before = store.read_bytes()
    assert runner.invoke(app, ["report", str(tmp_path)]).exit_code == 0
    assert store.read_bytes() == before
    assert len(ResultStore(tmp_path).load()) == 2
    assert run_study(ONE, tmp_path, workers=1, quiet=True)["cases_computed"] == 0
    assert store.read_bytes() == before


def test_a_rerun_that_computes_nothing_adds_no_run(tmp_path, one_study):
    _one(one_study, tmp_path)
    res = runner.invoke(app, ["study", "--out", str(tmp_path), "--config", _write(tmp_path, ONE)])
    assert res.exit_code == 0 and "0 cases computed, 2 reused" in res.output, res.output
    assert len(_lines(tmp_path / "runs.jsonl")) == 1


def _write(folder: Path, cfg: StudyConfig) -> str:
    """The TOML of a one-sweep config."""
    sw = cfg.sweeps[0]
    path = folder / "cfg.toml"
    path.write_text(
        f'name = "{cfg.name}"\n[[sweeps]]\nquestion = "{sw.question}"\nmethods = {json.dumps(list(sw.methods))}\n'
        f"seq_lens = {list(sw.seq_lens)}\nblocks = {[list(b) for b in sw.blocks]}\nheads = {sw.heads}\n"
        f"seeds = {list(sw.seeds)}\nbaseline = {str(sw.baseline).lower()}\n"
    )
    assert load_config(path) == cfg
    return str(path)


def test_the_default_relative_out_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["study", "--config", _write(tmp_path, ONE), "--quiet"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "flashcheck-study-cfg"  # --config cfg.toml
    page = (out / "report.html").read_text()
    pngs = list((out / "figures").glob("*.png"))  # seq_len and the error model
    assert len(pngs) >= 2 and page.count("data:image/png;base64,") == len(pngs)  # each one embedded
    assert "](figures/seq_len.png)" in (out / "report.md").read_text()
    assert runner.invoke(app, ["report", "flashcheck-study-cfg"]).exit_code == 0


def test_a_second_study_on_the_same_folder_exits_2_naming_the_holder(tmp_path, one_study):
    with folder_lock(tmp_path):
        res = runner.invoke(app, ["study", "--config", _write(tmp_path, ONE), "--out", str(tmp_path), "--quiet"])
    assert res.exit_code == 2 and f"PID {os.getpid()}" in res.output, res.output
    assert not (tmp_path / "records.jsonl").exists()
    _one(one_study, tmp_path)  # the holder gone, a study takes the folder (resuming a finished one: no pool)
    again = runner.invoke(app, ["study", "--config", _write(tmp_path, ONE), "--out", str(tmp_path)])
    assert again.exit_code == 0 and "0 cases computed, 2 reused" in again.output, again.output


def test_progress_off_a_terminal_is_plain_lines_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setattr(study_runner, "PROGRESS_EVERY_S", 0.0)
    res = runner.invoke(app, ["study", "--config", _write(tmp_path, ONE), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    report = "report: drawing the figures, writing report.html and report.md\n"  # then the report is built
    assert re.fullmatch(rf"cases 0/2, 0 s\ncases 1/2, \d+ s\ncases 2/2, \d+ s\n{report}", res.stderr), res.stderr
    assert "cases computed" in res.stdout


# ---- memory ---------------------------------------------------------------------------------------------


def test_a_case_too_big_for_memory_is_skipped_with_the_numbers(tmp_path):
    huge = StudyConfig(
        name="huge",
        sweeps=(Sweep(question="q", methods=("flash:bf16",), seq_lens=(32, 40_000_000), blocks=((8, 8),), heads=1),),
    )
    stats = run_study(huge, tmp_path, workers=1, quiet=True)
    assert stats["cases_too_big"] == 2 and stats["cases_computed"] == 2
    recs = ResultStore(tmp_path).load().values()
    skipped = [r for r in recs if r.status == "skipped"]
    assert {r.case.seq_len for r in skipped} == {40_000_000} and len(skipped) == 2
    numbers = (
        r"needs about [\d.e+]+ [GTP]iB; [\d.]+ [GT]iB available now, a worker may plan on [\d.]+ [MGT]iB "
        r"\(90% of it\); the largest seq_len that fits is (\d+)"
    )
    m = re.search(numbers, skipped[0].error)
    assert m and 32 < int(m.group(1)) < 40_000_000, skipped[0].error
    assert run_study(huge, tmp_path, workers=1, quiet=True)["cases_computed"] == 0
    assert len(_lines(tmp_path / "runs.jsonl")) == 1  # the skip is not written again
    summary = build_report(tmp_path)
    assert summary["failed"] == 0 and {s["cases"] for s in summary["skipped"]} == {1}


MEASURE = """
import json, sys
from flashcheck.study.cases import Case, evaluate_group
from flashcheck.study.memory import estimate_case_bytes
c = Case(*json.loads(sys.argv[1]))
evaluate_group([c], lambda r: None)
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] * 1024
print(json.dumps([peak, estimate_case_bytes(c)]))
"""


@pytest.mark.parametrize(
    "case",
    [
        ["standard", "bf16", "", 0, 0, 1, 2, 1536, 64, False, "normal", 0],
        ["flash", "fa3-fp8", "fa2", 128, 128, 1, 2, 4096, 64, False, "outliers", 0],
    ],
)
def test_memory_estimate_is_an_upper_bound_within_3x_of_the_measured_peak(case):
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(case)], capture_output=True, check=True, text=True)
    peak, estimate = json.loads(out.stdout)
    assert peak <= estimate <= 3 * peak, (peak, estimate)


# ---- bad input --------------------------------------------------------------------------------------


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_bytes(text.encode("latin-1") if "\xe9" in text else text.encode())
    return str(path)


SWEEP = 'name = "x"\n[[sweeps]]\nquestion = "a"\nmethods = ["flash:bf16"]\nseq_lens = [16]\n'
BAD_STUDY = [
    (["--out", ""], "--out '' is empty"),
    (["--out", "   "], "--out '   ' is empty"),
    (["--config", ""], "--config '' is empty"),
    (["--config", "{tmp}"], "is a directory"),
    (["--workers", "9999999999999999999999"], "from 1 to 256"),
    (["--workers", "257"], "from 1 to 256"),
    (["--workers", "-3"], "from 1 to 256"),
    (["--ray-address", "127.0.0.1:1"], "needs --executor ray"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "'127.0.0.1:1': cannot connect"),
    (["--executor", "ray", "--ray-address", "nohost"], "give HOST:PORT"),
    (["--executor", "ray", "--ray-address", ""], "--ray-address '' is empty"),
    (["--config", "toml:" + SWEEP + "baseline = 'no'\n"], "baseline='no' must be true or false"),
    (["--config", "toml:" + SWEEP + "causal = 'yes'\n"], "causal='yes' must be true, false or a list of them"),
    (["--config", "toml:" + SWEEP.replace("[16]", "[true]")], "seq_lens holds True"),
    (["--config", "toml:" + SWEEP.replace("[16]", "[1.5]")], "seq_lens holds 1.5"),
    (["--config", "toml:" + SWEEP + "heads = true\n"], "heads=True must be a positive integer"),
    (["--config", "toml:" + SWEEP + "blocks = [[8, false]]\n"], "blocks holds (8, False)"),
    (["--config", "toml:" + SWEEP.replace('"flash:bf16"', "7")], "methods holds 7"),
    (["--config", "toml:" + SWEEP + "distributions = [1]\n"], "distributions holds 1"),
    (["--config", "toml:" + SWEEP + "metric = 3\n"], "metric=3 must be a string"),
    (["--config", "toml:" + SWEEP.replace('name = "x"', "name = 5")], "name=5 must be a non-empty string"),
    (["--config", "toml:" + SWEEP.replace('"a"', '"caf\xe9"')], "is not UTF-8 text"),
    (["--config", "toml:" + SWEEP + "[[sweeps]\n"], "is not valid TOML"),
    (
        ["--config", "toml:" + SWEEP.replace("flash:bf16", "flash:fa3-fp8") + "head_dims = [48]\n"],
        "every case would fail",
    ),
]


@pytest.mark.parametrize("args,needle", BAD_STUDY, ids=[" ".join(a)[:50] for a, _ in BAD_STUDY])
def test_bad_study_input_exits_2_with_a_message(tmp_path, args, needle):
    args = [_toml(tmp_path, a[5:]) if a.startswith("toml:") else a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--config" not in args:
        args += ["--config", _toml(tmp_path, SWEEP)]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o")]
    start = time.monotonic()
    res = runner.invoke(app, ["study", "--quiet", *args])
    assert res.exit_code == 2 and needle in res.output, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit | None)
    assert time.monotonic() - start < 20 and not (tmp_path / "o" / "records.jsonl").exists()


def test_an_empty_preset_exits_2(tmp_path):
    res = runner.invoke(app, ["study", "--preset", "", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--preset '' is empty" in res.output and not (tmp_path / "o").exists()


def test_config_errors_name_the_file(tmp_path):
    for text in (SWEEP.replace('"a"', '"caf\xe9"'), "this is = not toml [", SWEEP + "causal = 'yes'\n"):
        path = _toml(tmp_path, text)
        with pytest.raises(ValueError, match=re.escape(path)):
            load_config(path)


def test_every_case_fails_names_each_reason(tmp_path):
    bad = StudyConfig(
        name="doomed",
        sweeps=(Sweep(question="fp8", methods=("flash:fa3-fp8",), seq_lens=(64,), head_dims=(48,), heads=1),),
    )
    with pytest.raises(ValueError) as err:
        run_study(bad, tmp_path / "never-created", workers=1, quiet=True)
    text = str(err.value)
    assert "standard:fa3-fp8" in text and "needs tiles" in text and "power-of-two head dim; got 48" in text
    assert not (tmp_path / "never-created").exists()


@pytest.mark.parametrize("name", ["records.jsonl", "study.json", "runs.jsonl"])
def test_a_store_file_that_is_a_directory_exits_2(tmp_path, name, one_study):
    _one(one_study, tmp_path)
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    for args in (["report", str(tmp_path)], ["study", "--config", _write(tmp_path, ONE), "--out", str(tmp_path)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and f"{tmp_path / name}' is a directory" in res.output, res.output
        assert "Traceback" not in res.output


@pytest.mark.parametrize("folder,needle", [("", "folder '' is empty"), ("{tmp}/none", "does not exist")])
def test_report_of_nothing_exits_2(tmp_path, folder, needle):
    res = runner.invoke(app, ["report", folder.replace("{tmp}", str(tmp_path))])
    assert res.exit_code == 2 and needle in res.output, res.output


def test_a_ray_address_that_never_answers_fails_within_the_timeout(tmp_path, monkeypatch):
    from flashcheck.study import executors

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    monkeypatch.setattr(executors, "RAY_CONNECT_TIMEOUT_S", 0.5)
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"--ray-address '{address}': no answer within 0.5 s"):
        run_study(ONE, tmp_path, executor="ray", ray_address=address, quiet=True)
    assert time.monotonic() - start < 5
    silent.close()


@pytest.mark.parametrize("dangling", [False, True])
def test_a_linked_out_is_refused_before_any_work_and_nothing_is_written_through_it(tmp_path, monkeypatch, dangling):
    real = tmp_path / "real"
    if not dangling:
        real.mkdir()
    (tmp_path / "lnk").symlink_to(real)

    def no_work(*a, **k):
        raise AssertionError("the study ran")

    monkeypatch.setattr(study_runner, "run_study", no_work)
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(tmp_path / "lnk")])
    assert res.exit_code == 2 and "is a symbolic link" in res.output and "File exists" not in res.output
    assert not real.exists() or not any(real.iterdir())


@pytest.mark.parametrize("dangling", [False, True])
def test_report_says_a_linked_folder_is_a_link(tmp_path, dangling):
    real = tmp_path / "real"
    if not dangling:
        real.mkdir()
    (tmp_path / "lnk").symlink_to(real)
    res = runner.invoke(app, ["report", str(tmp_path / "lnk")])
    assert res.exit_code == 2 and "is a symbolic link" in res.output and "does not exist" not in res.output


def test_study_never_overwrites_another_commands_summary(tmp_path, monkeypatch):
    other = tmp_path / "E"
    other.mkdir()
    (other / "summary.json").write_text('{"policy": {}}')  # explain's

    def no_work(*a, **k):
        raise AssertionError("the study ran")

    monkeypatch.setattr(study_runner, "run_study", no_work)
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(other)])
    assert res.exit_code == 2 and "holds summary.json" in res.output, res.output
    assert sorted(p.name for p in other.iterdir()) == ["summary.json"]
