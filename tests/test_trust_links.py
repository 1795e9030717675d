"""The last links a trial found followed (issue 47, item 4): every read of a file the tool wrote before (a train
run's state.pt, validate's cached runs, the figures a report embeds) and every write (validate's cache/ folder,
figures) goes through the one no-follow rule of core.fileio; a refusal anywhere is one line, exit 2."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.fileio import LinkRefused
from flashcheck.training.model import GPTConfig
from flashcheck.training.train import MARKER, RunConfig, train

runner = CliRunner()
SECRET = b"the victim's private bytes\n"
TINY = GPTConfig(vocab=32, seq_len=32, layers=1, heads=2, dim=32)
RUN = RunConfig(name="r", attention="standard:fp32", steps=2, save_every=1, batch=2, model=TINY)


def _victim(tmp_path: Path, name: str = "victim.bin", data: bytes = SECRET) -> Path:
    victim = tmp_path / name
    victim.write_bytes(data)
    victim.chmod(0o600)
    return victim


def _untouched(victim: Path, data: bytes = SECRET) -> None:
    assert victim.read_bytes() == data and stat.S_IMODE(victim.stat().st_mode) == 0o600


def _one_line_exit_2(res, *needles: str) -> None:
    """Exit 2 with one error line (after any progress lines on stderr) naming `needles`; no traceback."""
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in res.output and len(errors) == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1] == errors[0], res.stderr
    for n in needles:
        assert n in errors[0], res.stderr


# ---- a train run's resume point -----------------------------------------------------------------------------


def test_a_train_state_linked_elsewhere_is_refused_not_trusted(tmp_path):
    """runs/x/state.pt linked to another run's finished state: main loaded it, trained nothing and marked the run
    complete."""
    train(RUN, tmp_path / "other")
    target = tmp_path / "other" / "state.pt"
    before = target.read_bytes()
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(json.loads(json.dumps(RUN.to_dict()))))
    (run / "state.pt").symlink_to(target)
    with pytest.raises(LinkRefused, match=r"state.pt.*symbolic link"):
        train(RUN, run)
    assert not (run / MARKER).exists() and target.read_bytes() == before


# ---- validate's cache -----------------------------------------------------------------------------------------


def _a_run():
    from flashcheck.validate.run import RunOutput

    return RunOutput("eager", "fp32", torch.arange(2), torch.ones(2, 3, dtype=torch.float64),
                     torch.ones(2, dtype=torch.float64), [torch.ones(1, 3)], torch.arange(1))  # fmt: skip


def test_validate_cache_folder_linked_elsewhere_is_refused_and_nothing_written_there(tmp_path):
    from flashcheck.validate.cache import cache_file, save_run

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "cache").symlink_to(elsewhere, target_is_directory=True)
    path = cache_file(out, "eager", "fp32", {"k": 1})
    with pytest.raises(LinkRefused, match=r"cache.*symbolic link"):
        save_run(path, _a_run())
    assert list(elsewhere.iterdir()) == []


def test_validate_cached_run_read_through_a_link_is_refused(tmp_path):
    """A cached run linked to a file elsewhere (or the cache/ folder linked elsewhere) is never loaded."""
    from flashcheck.validate.cache import cache_file, load_run, save_run

    src = tmp_path / "src"
    path = cache_file(src, "eager", "fp32", {"k": 1})
    save_run(path, _a_run())
    out = tmp_path / "out"
    linked = cache_file(out, "eager", "fp32", {"k": 1})
    linked.parent.mkdir(parents=True)
    linked.symlink_to(path)
    with pytest.raises(LinkRefused, match="symbolic link"):
        load_run(linked)
    folder_linked = tmp_path / "out2"
    folder_linked.mkdir()
    (folder_linked / "cache").symlink_to(path.parent, target_is_directory=True)
    with pytest.raises(LinkRefused, match=r"cache.*symbolic link"):
        load_run(cache_file(folder_linked, "eager", "fp32", {"k": 1}))
    assert load_run(path) is not None  # the plain file itself still loads


# ---- figures ---------------------------------------------------------------------------------------------------


def test_a_study_figure_over_a_link_is_refused_not_replaced(tmp_path):
    """draw_figures drew into FIGURE.tmp.png and renamed it over FIGURE.png, replacing a link planted there."""
    pytest.importorskip("matplotlib")
    from flashcheck.study.cases import CaseRecord, evaluate_group, expand, group_by_inputs
    from flashcheck.study.config import StudyConfig, Sweep
    from flashcheck.study.figures import draw_figures

    cfg = StudyConfig(name="one", sweeps=(Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,),
                                                blocks=((8, 8),), heads=1, seeds=(0,), baseline=False),))  # fmt: skip
    records: dict[str, CaseRecord] = {}
    for group in group_by_inputs(expand(cfg)):
        evaluate_group(group, lambda rec: records.__setitem__(rec.case_id, rec))
    victim = _victim(tmp_path)
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "seq_len.png").symlink_to(victim)
    with pytest.raises(LinkRefused, match=r"seq_len.png.*symbolic link"):
        draw_figures(cfg, records, figures)
    assert (figures / "seq_len.png").is_symlink()
    _untouched(victim)
    assert [p.name for p in figures.iterdir()] == ["seq_len.png"]  # no temporary file left behind


def test_a_report_never_embeds_a_figure_read_through_a_link(tmp_path):
    """report.html embeds each figure's bytes: a figure swapped for a link would copy its target into the page."""
    from flashcheck.reporting.page import Figure, Page, render_html

    victim = _victim(tmp_path, "victim.png")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").symlink_to(victim)
    page = Page("t")
    page.blocks.append(Figure(tmp_path / "figures" / "a.png", "a figure"))
    with pytest.raises(LinkRefused, match=r"a.png.*symbolic link"):
        render_html(page, tmp_path)


# ---- refusals are one line on every command ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "linked"),
    [
        (["explain", "--seq-len", "32", "--heads", "1", "--block-q", "16", "--block-k", "16"], "figures/explain.png"),
        (["mutants", "--size", "tiny"], "report.md"),
        (["train-study", "--preset", "tiny", "--workers", "1", "--quiet"], "runs/base-s0/weights/step_000000.pt"),
    ],
    ids=["explain", "mutants", "train-study"],
)
def test_a_link_refusal_is_one_line_exit_2_on_every_command(tmp_path, args, linked):
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    (out / linked).parent.mkdir(parents=True)
    (out / linked).symlink_to(victim)
    res = runner.invoke(app, [*args, "--out", str(out)])
    _one_line_exit_2(res, Path(linked).name, "symbolic link")
    _untouched(victim)


# ---- new probes of this round ---------------------------------------------------------------------------------


def test_a_forged_losses_json_of_strings_is_resumed_not_a_traceback(tmp_path):
    """A finished run whose losses.json was replaced by strings: main took it as complete and train-study's report
    died summing them (TypeError); the run is now resumed from state.pt, which rewrites it."""
    first = train(RUN, tmp_path / "r")
    (tmp_path / "r" / "losses.json").write_text(json.dumps(["x"] * RUN.steps))
    again = train(RUN, tmp_path / "r")
    assert again["losses"] == first["losses"]
    assert json.loads((tmp_path / "r" / "losses.json").read_text()) == first["losses"]


@pytest.mark.parametrize(
    "args",
    [["explain", "--seq-len", "32", "--heads", "1"], ["mutants", "--size", "tiny"]],
    ids=["explain", "mutants"],
)
def test_a_deeply_nested_summary_in_out_is_another_commands_not_a_recursion_error(tmp_path, args):
    """New probe: the check of --out (cli.app._not_others) parsed summary.json with json.loads: 500,000 brackets gave
    RecursionError's traceback on every command that writes a summary; it now goes through the bounded reader."""
    (tmp_path / "summary.json").write_text("[" * 500_000)
    res = runner.invoke(app, [*args, "--out", str(tmp_path)])
    _one_line_exit_2(res, "holds summary.json, another command's output")
