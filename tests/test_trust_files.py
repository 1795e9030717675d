"""The folders the tool writes are no attack surface, and every record it reads back is checked (issue 34, items 1,
2, 4 and 8): nothing written, truncated, appended to or deleted through a link it did not make; forged or mistyped
record lines named and kept aside; one bounded JSON reader for its own files and a model's; `report` says when a
study holds the folder; a model config.json's mistyped field is named."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.lock import LOCK_NAME, folder_lock
from flashcheck.study.cases import evaluate_group, expand, group_by_inputs
from flashcheck.study.config import StudyConfig, Sweep
from flashcheck.study.runner import run_study
from flashcheck.study.store import ResultStore
from flashcheck.training.model import GPTConfig
from flashcheck.training.train import RunConfig, train

runner = CliRunner()
ONE = StudyConfig(
    name="one",
    sweeps=(
        Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,), blocks=((8, 8),), heads=1, seeds=(0, 1),
              baseline=False),
    ),
)  # fmt: skip
TINY = GPTConfig(vocab=32, seq_len=32, layers=1, heads=2, dim=32)
RUN = RunConfig(name="r", attention="standard:fp32", steps=2, save_every=1, batch=2, model=TINY)
SECRET = "the victim's private text\n"
DEEP = "[" * 500_000


@pytest.fixture(scope="module")
def one_records() -> list[str]:
    """ONE's two records as JSON lines, computed in this process (no pool)."""
    threads = torch.get_num_threads()
    lines: list[str] = []
    for group in group_by_inputs(expand(ONE)):
        evaluate_group(group, lambda rec: lines.append(rec.to_json()))
    torch.set_num_threads(threads)
    return lines


@pytest.fixture
def done(tmp_path, one_records) -> Path:
    """A finished study folder of ONE (its records written here, the report not yet)."""
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps(ONE.to_dict()))
    (out / "records.jsonl").write_text("".join(line + "\n" for line in one_records))
    return out


def _toml(folder: Path) -> Path:
    path = folder / "one.toml"
    path.write_text(
        'name = "one"\n[[sweeps]]\nquestion = "seq_len"\nmethods = ["flash:bf16"]\n'
        "seq_lens = [32]\nblocks = [[8, 8]]\nheads = 1\nseeds = [0, 1]\nbaseline = false\n"
    )
    return path


def _victim(tmp_path: Path, mode: int = 0o600) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(SECRET)
    victim.chmod(mode)
    return victim


def _one_line_exit_2(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


# ---- 1: links inside an output folder ---------------------------------------------------------------------


@pytest.mark.parametrize("name", [LOCK_NAME, "records.jsonl", "runs.jsonl", "study.json"])
def test_a_study_refuses_a_linked_lock_or_store_file_and_leaves_its_target_alone(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    victim = _victim(tmp_path)
    (out / name).symlink_to(victim)
    res = runner.invoke(app, ["study", "--config", str(_toml(tmp_path)), "--out", str(out), "--workers", "1"])
    _one_line_exit_2(res, name, "symbolic link")
    assert victim.read_text() == SECRET and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not (out / "records.jsonl.dropped").exists()


def test_a_run_lock_linked_elsewhere_is_refused_and_not_truncated(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        train(RUN, tmp_path / "r")
    assert victim.read_text() == SECRET


def test_a_linked_run_folder_is_refused_before_anything_is_written(tmp_path):
    """runs/base-s0 linked to another folder: main wrote a whole run into it and deleted its hidden .*.tmp* files."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".keep.abc.tmp.pt").write_bytes(b"not yours")
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "base-s0").symlink_to(elsewhere, target_is_directory=True)
    res = runner.invoke(app, ["train-study", "--preset", "tiny", "--out", str(out), "--workers", "1"])
    _one_line_exit_2(res, "base-s0", "symbolic link")
    assert sorted(p.name for p in elsewhere.iterdir()) == [".keep.abc.tmp.pt"]
    assert not list((out / "runs").glob("*/weights"))  # refused before any run started


def test_a_train_study_lock_linked_elsewhere_is_refused(tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)
    res = runner.invoke(app, ["train-study", "--preset", "tiny", "--out", str(out), "--workers", "1"])
    _one_line_exit_2(res, LOCK_NAME)
    assert victim.read_text() == SECRET


def test_lines_kept_aside_keep_the_private_mode_of_their_file(done, one_records):
    store = done / "records.jsonl"
    store.write_text(one_records[0] + "\n" + one_records[1][:40] + "\n")
    store.chmod(0o600)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ResultStore(done).repair()
    dropped = done / "records.jsonl.dropped"
    assert dropped.read_text() == one_records[1][:40] + "\n"
    assert stat.S_IMODE(dropped.stat().st_mode) == 0o600


def test_a_figure_is_never_written_through_a_link(tmp_path):
    pytest.importorskip("matplotlib")
    from flashcheck.reporting.figures import figure

    victim = _victim(tmp_path)
    (tmp_path / "fig.png").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"), figure(tmp_path / "fig.png") as (_, ax):
        ax.plot([1, 2], [1, 2])
    assert victim.read_text() == SECRET


# ---- 2: forged and mistyped records -----------------------------------------------------------------------


def _forged(one_records: list[str]) -> list[str]:
    """The trial's forged lines, built from a real record: each breaks one rule of the record schema."""
    d = json.loads(one_records[0])

    def edit(**paths) -> str:
        x = json.loads(json.dumps(d))
        for path, value in paths.items():
            *parents, leaf = path.split("__")
            node = x
            for p in parents:
                node = node[p]
            node[leaf] = value
        return json.dumps(x)

    moved = json.loads(json.dumps(d))
    moved["case"]["seed"] = 7  # a case this study does not have, with its own valid hash: not in the report
    from flashcheck.study.cases import Case

    moved["case_id"] = Case(**moved["case"]).case_id
    return [
        edit(errors="lots"),
        edit(seconds="fast"),
        edit(case__seq_len="long"),
        edit(errors__max_abs="NaN"),
        edit(seconds=float("nan")),  # json.dumps writes the NaN literal
        edit(case_id="0123456789abcdef", errors={k: 100 * v for k, v in d["errors"].items()}),
        edit(stats__q_std="wide"),
        json.dumps(moved),
    ]


def test_forged_record_lines_are_named_and_do_not_reach_the_report(done, one_records):
    forged = _forged(one_records)
    with (done / "records.jsonl").open("a") as f:
        f.write("".join(line + "\n" for line in forged))
    res = runner.invoke(app, ["report", str(done)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "dropped 7 unreadable line(s)" in res.stderr, res.stderr
    named = ["errors is not an object", "seconds is 'fast'", "case.seq_len is 'long'", "errors.max_abs is 'NaN'"]
    for why in [*named, "seconds is nan", "and 2 more"]:  # the first five lines named, then a count
        assert why in res.stderr, why
    assert "1 record(s) of cases this study does not have" in res.stderr and "seed 7" in res.stderr
    summary = json.loads((done / "summary.json").read_text())
    assert summary["cases"] == 2
    assert "L=long" not in (done / "report.md").read_text()
    # a study run keeps them aside (text intact) and recomputes nothing
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        stats = run_study(ONE, done, workers=1, quiet=True)
    assert stats["cases_computed"] == 0
    assert (done / "records.jsonl.dropped").read_text().splitlines() == forged[:7]


def test_the_same_case_twice_with_other_numbers_is_a_warning_naming_the_one_kept(done, one_records):
    d = json.loads(one_records[0])
    d["errors"] = {k: v if k == "cos_sim" else 100 * v for k, v in d["errors"].items()}  # a cosine stays <= 1
    with (done / "records.jsonl").open("a") as f:
        f.write(json.dumps(d) + "\n" + one_records[0] + "\n")  # the second copy: the same numbers, no word
    with pytest.warns(UserWarning) as caught:
        records = ResultStore(done).load()
    text = " ".join(str(w.message) for w in caught)
    assert "1 case(s) recorded twice as ok with different numbers: lines 1 and 3" in text, text
    assert "line 1 kept" in text and "flash:bf16 L=32 seed 0" in text
    assert records[d["case_id"]].errors == json.loads(one_records[0])["errors"]


# ---- 4: deep JSON in the tool's own files and a model's ---------------------------------------------------


def test_a_deeply_nested_study_json_is_one_line_exit_2(done):
    (done / "study.json").write_text(DEEP)
    res = runner.invoke(app, ["report", str(done)])
    _one_line_exit_2(res, "study.json", "nests brackets")
    assert not isinstance(res.exception, RecursionError)


def test_a_deeply_nested_study_toml_is_one_line_exit_2(tmp_path):
    (tmp_path / "deep.toml").write_text("a = " + DEEP)
    res = runner.invoke(app, ["study", "--config", str(tmp_path / "deep.toml"), "--out", str(tmp_path / "out")])
    _one_line_exit_2(res, "deep.toml", "nests brackets")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """RUN trained once for the module; tests take copies (a run folder holds no absolute path)."""
    folder = tmp_path_factory.mktemp("trained") / "r"
    train(RUN, folder)
    return folder


@pytest.mark.parametrize("name", ["config.json", "losses.json", "complete.json"])
def test_a_deeply_nested_file_of_a_run_is_no_recursion_error(tmp_path, name, trained):
    import shutil

    shutil.copytree(trained, tmp_path / "r")  # a finished run, as train(RUN, tmp_path / "r") leaves it
    (tmp_path / "r" / name).write_text(DEEP)
    if name == "config.json":
        with pytest.raises(ValueError, match="nests brackets"):
            train(RUN, tmp_path / "r")
    else:  # the run is not complete: it is resumed from state.pt to the same losses, and the file rewritten
        assert len(train(RUN, tmp_path / "r")["losses"]) == RUN.steps
        assert json.loads((tmp_path / "r" / name).read_text())


def _model(folder: Path, config: dict | str, **files: str) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("where", ["config.json", "modules.json", "sentence_bert_config.json"])
def test_a_deeply_nested_model_file_is_one_line(tmp_path, where):
    from flashcheck.validate.loading import resolve_model

    cfg = {"architectures": ["BertModel"], "max_position_embeddings": 512}
    extra = {where: DEEP} if where != "config.json" else {}
    if where == "sentence_bert_config.json":  # read in a sentence-transformers folder (one with modules.json)
        extra["modules.json"] = "[]"
    model = _model(tmp_path / "m", DEEP if where == "config.json" else cfg, **extra)
    with pytest.raises(ValueError, match=rf"{where}.*nests brackets"):
        resolve_model(model)


# ---- 8: report while a study writes; a mistyped model config ----------------------------------------------


def test_report_says_when_a_study_holds_the_folder(done):
    with folder_lock(done):
        res = runner.invoke(app, ["report", str(done)])
    assert res.exit_code == 0, res.output
    assert f"is in use by flashcheck study (PID {os.getpid()}), still running" in res.stderr, res.stderr
    res = runner.invoke(app, ["report", str(done)])
    assert "in use" not in res.stderr


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_position_embeddings", "lots", "a non-negative integer"),
        ("hidden_size", "big", "a non-negative integer"),
        ("num_hidden_layers", True, "a non-negative integer"),
        ("layer_norm_eps", "tiny", "a number"),
        ("architectures", "BertModel", "a list of class names"),
    ],
)
def test_a_mistyped_model_config_field_names_the_file_and_field(tmp_path, field, value, expected):
    from flashcheck.validate.loading import resolve_model

    model = _model(tmp_path / "m", {"architectures": ["BertModel"], "max_position_embeddings": 512, field: value})
    with pytest.raises(ValueError) as info:
        resolve_model(model)
    msg = str(info.value)
    assert str(model / "config.json") in msg and f"field {field!r}" in msg and expected in msg, msg


def test_a_deeply_nested_hunt_store_is_one_line(tmp_path):
    from flashcheck.hunt import parse_target
    from flashcheck.hunt.search import STORE, HuntState

    (tmp_path / STORE).write_text(DEEP)
    with pytest.raises(ValueError, match="nests brackets"):
        HuntState.load(tmp_path, parse_target("sdpa-math"))
