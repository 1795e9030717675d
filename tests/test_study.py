"""`flashcheck study`: tiny preset end to end, resume after SIGKILL, corrupt lines, executors, bad configs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import audited_figures
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.study.cases import expand, group_by_inputs
from flashcheck.study.config import StudyConfig, Sweep, load_config, preset
from flashcheck.study.registry import presets
from flashcheck.study.report import build_report, sweep_points
from flashcheck.study.runner import run_study
from flashcheck.study.store import ResultStore

pytestmark = pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules

runner = CliRunner()
FINDING_IDS = {
    "flash_vs_baseline_bf16",
    "grows_with_seq_len",
    "shrinks_with_block_area",
    "swapped_blocks",
    "square_tiles",
    "fa3_fp16",
    "fa3_fp8",
}

SMALL = StudyConfig(
    name="small",
    sweeps=(
        Sweep(
            question="seq_len",
            methods=("flash:bf16",),
            seq_lens=(32, 64),
            blocks=((8, 8),),
            heads=1,
            seeds=(0, 1),
        ),
        Sweep(
            question="fa3",
            methods=("standard:fp16", "flash:fp16-mixed"),
            seq_lens=(32,),
            head_dims=(16,),
            distributions=("outliers",),
            heads=1,
            baseline=False,
            metric="rmse",
        ),
    ),
)


def errors_by_case(folder: Path) -> dict[str, dict]:
    return {k: r.errors for k, r in ResultStore(folder).load().items()}


@pytest.mark.xdist_group("tiny_report")  # one worker builds conftest.tiny_report_run once
def test_tiny_preset_end_to_end(tiny_study_run, tiny_report_run, tmp_path):
    # `study --preset tiny --workers 2` through the CLI, once per session (conftest.tiny_study_run), with every
    # figure's metadata audited (tests.helpers.audited_figures: labels, legend = drawn series, colours)
    seen = tiny_study_run.figures
    assert tiny_study_run.exit_code == 0, tiny_study_run.output
    assert "guide tasks" in tiny_study_run.output and "The production guide's claims" in tiny_study_run.output
    out = tmp_path / "study"
    shutil.copytree(tiny_study_run.folder, out)  # the shared folder stays as the run left it
    summary = json.loads((out / "summary.json").read_text())
    guide_figs = [Path(p).name for p in summary["guide"]["figures"].values()]  # the guide part's
    # (questions.guide.report), the error model's (questions.variants.errormodel) and the headline (paper.answer)
    assert len(seen) == len(preset("tiny").sweeps) + 2 + len(guide_figs)
    assert {name: problems for name, problems, _ in seen if problems} == {}
    assert all(y for _, _, ylabels in seen for y in ylabels)
    assert {f["id"] for f in summary["findings"]} >= FINDING_IDS
    keys = {"id", "claim", "measured", "status", "holds", "rule", "interval", "n"}
    assert all(set(f) >= keys for f in summary["findings"])
    assert summary["conclusion"] and all(c["text"] and c["section"] for c in summary["conclusion"])
    assert summary["failed"] == 0 and summary["cases"] == len(expand(preset("tiny")))
    for name in ("report.md", "report.html", "records.jsonl"):
        assert (out / name).stat().st_size > 0
    figs = sorted(p.name for p in (out / "figures").glob("*.png"))
    questions = [f"{s.question}.png" for s in preset("tiny").sweeps]
    assert figs == sorted([*questions, "error_model.png", "headline.png", *guide_figs])
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(figs)
    assert html.index("Answer") < html.index("<img") < html.index("Verdicts") < html.index("Conclusion")
    md = (out / "report.md").read_text()
    assert "9.1e-03" in md  # the FA3 paper's values beside ours
    fa3 = md.split('<a id="fa3"></a>')[1].split("\n## ")[1]  # paired in verdicts: no empty ratio columns
    assert "|  |" not in fa3 and "ratio to baseline" not in fa3 and "| 9.1e-03 |" in fa3
    stats = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert stats["reference_computations"] < stats["cases_computed"]
    # report rebuilds from records without recomputing (conftest.tiny_report_run: a copy without report.md)
    rebuilt = tiny_report_run.folder
    assert tiny_report_run.exit_code == 0 and (rebuilt / "report.md").exists(), tiny_report_run.output
    assert len((rebuilt / "runs.jsonl").read_text().splitlines()) == 1


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> tuple[Path, dict]:
    """SMALL run once (one worker) for the tests that start from a finished run: (its folder, read-only for
    tests: copy it first; run_study's stats)."""
    out = tmp_path_factory.mktemp("small") / "w1"
    return out, run_study(SMALL, out, workers=1, quiet=True)


def _copy_of(small_run: tuple[Path, dict], dest: Path) -> Path:
    shutil.copytree(small_run[0], dest)
    return dest


@pytest.mark.xdist_group("study_small")  # one worker computes small_run once
def test_rerun_computes_nothing(small_run, tmp_path):
    first = small_run[1]
    again = run_study(SMALL, _copy_of(small_run, tmp_path / "s"), workers=1, quiet=True)
    assert first["cases_computed"] == len(expand(SMALL)) and again["cases_computed"] == 0


@pytest.mark.xdist_group("study_small")  # one worker computes small_run once
def test_deterministic_across_worker_counts(small_run, tmp_path):
    run_study(SMALL, tmp_path / "w2", workers=2, quiet=True)
    assert errors_by_case(small_run[0]) == errors_by_case(tmp_path / "w2")


@pytest.mark.xdist_group("study_small")  # one worker computes small_run once
def test_corrupt_last_line_is_dropped_and_recomputed(small_run, tmp_path):
    folder = _copy_of(small_run, tmp_path / "s")
    store = folder / "records.jsonl"
    lines = store.read_text().splitlines()
    store.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # half-written
    with pytest.warns(UserWarning, match="dropped 1"):
        assert len(ResultStore(folder).load()) == len(lines) - 1
    stats = run_study(SMALL, folder, workers=1, quiet=True)
    assert stats["cases_computed"] == 1
    assert len(ResultStore(folder).load()) == len(lines)


def test_sigkill_mid_sweep_loses_and_redoes_nothing(tmp_path, forked_cli):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "kill"\n[[sweeps]]\nquestion = "seq_len"\nmethods = ["flash:bf16", "flash:fp16"]\n'
        "seq_lens = [128, 256]\nblocks = [[4, 4], [8, 8]]\nheads = 2\nseeds = [0, 1, 2]\n"
    )
    out = tmp_path / "out"
    cmd = ["study", "--config", str(cfg), "--out", str(out), "--workers", "1", "--quiet"]
    proc = forked_cli(cmd, new_session=True)  # `python -m flashcheck.cli ...` forked from a preloaded interpreter
    store = out / "records.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not store.exists() or len(store.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its pool worker, mid-sweep
    proc.wait()
    before = ResultStore(out).load()
    total = len(expand(load_config(cfg)))
    assert 3 <= len(before) < total
    with audited_figures(save=False):  # its report's figures: laid out and audited, not rasterised
        rerun = runner.invoke(app, cmd)  # in this process: the kill is over (no second interpreter to start)
    assert rerun.exit_code == 0, rerun.output
    after = ResultStore(out).load()
    assert len(after) == total
    assert all(after[k].to_json() == rec.to_json() for k, rec in before.items())  # kept, not redone
    lines = store.read_text().splitlines()
    assert len(lines) == len({json.loads(line)["case_id"] for line in lines}) == total
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert runs[-1]["cases_computed"] == total - len(before)


def test_failed_case_is_recorded_and_sweep_goes_on(tmp_path):
    cfg = StudyConfig(
        name="fail",
        sweeps=(
            Sweep(
                question="fa3",
                methods=("flash:fa3-fp8", "flash:bf16"),
                seq_lens=(16,),
                head_dims=(12,),
                heads=1,
                baseline=False,
            ),
        ),
    )
    run_study(cfg, tmp_path, workers=1, quiet=True)
    recs = ResultStore(tmp_path).load().values()
    status = {r.case.policy: r.status for r in recs}
    assert status == {"fa3-fp8": "failed", "bf16": "ok"}
    assert "power-of-two" in next(r.error for r in recs if r.status == "failed")
    with audited_figures(save=False):  # laid out, not rasterised: no PNG is read
        assert build_report(tmp_path)["failed"] == 1


def test_reference_reuse_groups_cases_by_inputs():
    cases = expand(preset("quick"))
    groups = group_by_inputs(cases)
    assert len(groups) < len(cases) / 5
    assert all(len({c.input_key for c in g}) == 1 for g in groups)


def test_presets_are_valid_and_quick_is_a_subset_of_paper_questions():
    for name in presets():  # cases to run, or (serving's presets) a settings table whose own tasks are the work
        assert expand(preset(name)) or (not preset(name).sweeps and preset(name).settings)
    questions = {s.question for s in preset("quick").sweeps}
    dims = {"causal", "gqa", "padding", "decoding", "head_dim", "backward", "captured"}  # questions.variants.findings
    guide = {"guide_errors"}  # the production guide's errors (its own tasks: questions.guide)
    modern = {"modern_fa4", "modern_lowp"}  # quick's small part of the modern study (questions.presets._quick_modern)
    assert modern <= {s.question for s in preset("modern").sweeps}
    assert questions - dims - guide - modern == {"formats", "seq_len", "block_area", "swapped", "square", "backends",
                                                 "fa3"}  # fmt: skip


@pytest.mark.parametrize(
    "toml,needle",
    [
        (
            'name = "x"\n[[sweeps]]\nquestion = "a"\nmethods = ["flash:bf16"]\nbogus = 1\n',
            "unknown field 'bogus'",
        ),
        ('name = "x"\n[[sweeps]]\nquestion = "a"\nmethods = ["flash:bf17"]\n', "bf17"),
        ('name = "x"\n[[sweeps]]\nquestion = "a"\nmethods = ["flash:bf16"]\nseq_lens = [0]\n', "seq_lens"),
        ('name = "x"\n[[sweeps]]\nquestion = "a"\nmethods = ["gpu:bf16"]\n', "kernel"),
        ('name = "x"\ncolour = "red"\n', "unknown field 'colour'"),
        ("this is = not toml [", "not valid TOML"),
    ],
)
def test_bad_configs_exit_2(tmp_path, toml, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    res = runner.invoke(app, ["study", "--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet"])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_bad_cli_values_exit_2(tmp_path):
    for args, needle in (
        (["--preset", "huge"], "huge"),
        (["--workers", "0"], "workers"),
        (["--config", str(tmp_path / "missing.toml")], "does not exist"),
        (["--executor", "slurm"], "slurm"),
    ):
        res = runner.invoke(app, ["study", "--out", str(tmp_path / "o"), "--quiet", *args])
        assert res.exit_code == 2 and needle in res.output, res.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_exits_2_as_user(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(ro / "x"), "--quiet"])
    assert res.exit_code == 2 and "not writable" in res.output


def test_unwritable_out_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(blocker / "sub"), "--quiet"])
    assert res.exit_code == 2 and "not writable" in res.output


@pytest.mark.xdist_group("study_small")  # one worker computes small_run once
def test_other_study_in_out_exits_2(small_run, tmp_path):
    folder = _copy_of(small_run, tmp_path / "s")
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(folder), "--quiet"])
    assert res.exit_code == 2 and "another study" in res.output


def test_report_of_empty_folder_exits_2(tmp_path):
    res = runner.invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "no study" in res.output


@pytest.mark.slow
@pytest.mark.xdist_group("study_small")  # the pool's records are small_run's (they do not depend on the workers)
def test_ray_gives_the_same_records_as_the_pool(small_run, tmp_path):
    pytest.importorskip("ray")
    # Ray's socket paths must stay under 107 characters: a short temp folder, removed afterwards
    short = Path(tempfile.mkdtemp(prefix="fcray", dir="/tmp"))
    os.environ["FLASHCHECK_RAY_TMP"] = str(short)
    try:
        # one Ray CPU: one Ray worker process imports torch (each costs seconds); the records do not depend on it
        stats = run_study(SMALL, tmp_path / "ray", workers=1, executor="ray", quiet=True)
    finally:
        os.environ.pop("FLASHCHECK_RAY_TMP")
        shutil.rmtree(short, ignore_errors=True)
    assert stats["executor"] == "ray" and stats["cases_computed"] == len(expand(SMALL))
    assert errors_by_case(small_run[0]) == errors_by_case(tmp_path / "ray")


def test_real_backends_in_a_sweep(tmp_path):
    cfg = StudyConfig(
        name="be",
        sweeps=(
            Sweep(
                question="backends",
                methods=("sdpa-flash:bf16", "flash-attn:bf16"),
                seq_lens=(64,),
                heads=1,
                metric="rel_l2",
            ),
        ),
    )
    run_study(cfg, tmp_path, workers=1, quiet=True)
    recs = {r.case.kernel: r for r in ResultStore(tmp_path).load().values()}
    # the baseline added by the one rule: eager PyTorch in the same dtype
    assert recs["sdpa-flash"].status == "ok" and recs["eager"].status == "ok" and recs["eager"].case.policy == "bf16"
    ratio = next(
        p.ratio for p in sweep_points(cfg.sweeps[0], ResultStore(tmp_path).load()) if p.method == "sdpa-flash:bf16"
    )
    assert ratio == pytest.approx(recs["sdpa-flash"].errors["rel_l2"] / recs["eager"].errors["rel_l2"], rel=1e-12)
    if not torch.cuda.is_available():
        assert recs["flash-attn"].status == "skipped" and "GPU" in recs["flash-attn"].error
        with audited_figures(save=False):  # laid out, not rasterised: no PNG is read
            assert build_report(tmp_path)["skipped"][0]["method"] == "flash-attn:bf16"
    with pytest.raises(ValueError, match="backend:FORMAT"):
        Sweep(question="x", methods=("sdpa-flsh:bf16",))
    with pytest.raises(ValueError, match="number format"):
        Sweep(question="x", methods=("sdpa-flash:bf16-mixed",))


def test_report_of_a_half_written_study_covers_the_records_so_far(tiny_study_run, tmp_path):
    """A study stopped early (its first 20 records, no guide task yet): every figure and section tolerates the
    missing data (a panel says 'not measured yet'), no matplotlib error about log-scaling (fixa2-1)."""
    src = tiny_study_run.folder
    folder = tmp_path / "half"
    folder.mkdir()
    for name in ("study.json", "runs.jsonl"):
        shutil.copy(src / name, folder / name)
    lines = (src / "records.jsonl").read_text().splitlines(keepends=True)
    (folder / "records.jsonl").write_text("".join(lines[:20]))
    res = runner.invoke(app, ["report", str(folder)])
    assert res.exit_code == 0, res.output
    assert "not measured yet" in (folder / "report.md").read_text()


def test_ctrl_c_while_the_report_is_written_says_the_cases_are_stored_and_how_to_finish_it(tmp_path, monkeypatch):
    """After every case ran, a Ctrl-C in the report stage is one 'interrupted:' line and exit 130, not silence."""
    import flashcheck.study.report as study_report

    def stopped(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_report, "build_report", stopped)
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('name = "rep"\n[[sweeps]]\nquestion = "q"\nmethods = ["flash:bf16"]\nseq_lens = [32]\nheads = 1\n')
    out = tmp_path / "out"
    res = runner.invoke(app, ["study", "--config", str(cfg), "--out", str(out), "--workers", "1", "--quiet"])
    total = len(expand(load_config(cfg)))
    assert res.exit_code == 130 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted:")]
    assert lines == [
        f"interrupted: {total} of {total} cases stored in {out}; the report was not finished: run "
        f"`flashcheck report {out}` (or the same command again) to finish it"
    ], res.stderr


def test_ctrl_c_before_a_sets_own_tasks_finished_says_they_and_the_report_are_not(tmp_path, monkeypatch):
    """A Ctrl-C in the guide's cases or timing tasks: the line says the guide tasks and the report are unfinished
    (it said only 'N of N cases stored')."""
    import flashcheck.study.runner as study_runner

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_runner, "_run_in", stopped)
    out = tmp_path / "guide"
    res = runner.invoke(app, ["study", "--preset", "guide-tiny", "--out", str(out), "--quiet"])
    total = len(expand(preset("guide-tiny")))
    assert res.exit_code == 130, res.output
    assert res.stderr.strip().splitlines()[-1] == (
        f"interrupted: 0 of {total} cases stored in {out}, the guide tasks not finished; run the same command "
        "again to resume (the report was not written)"
    ), res.stderr


def test_ctrl_c_says_what_is_stored_and_releases_the_lock(tmp_path, forked_cli):
    """Ctrl-C (SIGINT to the process group) mid-sweep: exit 130, one line naming the cases stored and how to
    resume, no traceback, no lock file left behind (fixa2-2)."""
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "intr"\n[[sweeps]]\nquestion = "seq_len"\nmethods = ["flash:bf16", "flash:fp16"]\n'
        "seq_lens = [128, 256]\nblocks = [[4, 4], [8, 8]]\nheads = 2\nseeds = [0, 1, 2]\n"
    )
    out = tmp_path / "out"
    cmd = ["study", "--config", str(cfg), "--out", str(out), "--workers", "1", "--quiet"]
    proc = forked_cli(cmd, new_session=True, sigint_default=True)  # a background job starts with SIGINT ignored
    store = out / "records.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not store.exists() or len(store.read_text().splitlines()) < 2):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    total = len(expand(load_config(cfg)))
    stored = len(ResultStore(out).load())
    assert proc.returncode == 130, err
    assert f"interrupted: {stored} of {total} cases stored in {out}; run the same command again" in err, err
    assert "Traceback" not in err
    assert not (out / ".flashcheck.lock").exists()
