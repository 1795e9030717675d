"""train-study and the serving study refuse an --out holding another command's output before any work, and
take their own folder again (the rule explain, hunt, validate, ... follow: cli.app._not_others)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app

runner = CliRunner()
HUNT = {"target": "sdpa-math", "kind": "budget", "rule": "x", "budget_s": 1}
TRAIN = {"study": "tied-max", "seeds": 1, "tied": [], "control": [], "thresholds": {}, "findings": []}


@pytest.mark.parametrize(
    ("args", "files", "says"),
    [
        (["train-study", "--preset", "tiny"], {"summary.json": HUNT}, "holds summary.json"),
        (["train-study", "--preset", "tiny"], {"records.jsonl": ""}, "holds records.jsonl"),
        (["train-study", "--preset", "tied-max"], {"summary.json": HUNT}, "holds summary.json"),
        (["study", "--preset", "serving-tiny", "--quiet"], {"summary.json": TRAIN}, "holds summary.json"),
        (["study", "--preset", "serving-tiny", "--quiet"], {"study.json": {}}, "holds study.json"),
    ],
)
def test_another_commands_folder_is_refused_untouched(tmp_path, args, files, says):
    for name, data in files.items():
        (tmp_path / name).write_text(data if isinstance(data, str) else json.dumps(data))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    res = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written


def test_train_study_takes_its_own_folder_again(tmp_path):
    args = ["train-study", "--preset", "tied-max", "--steps", "2", "--seeds", "1", "--quiet", "--out", str(tmp_path)]
    for _ in range(2):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "summary.json").read_text())["study"] == "tied-max"


UNWRITABLE = "/proc/flashcheck-nope"  # /proc takes no new folder, even from root (os.access says yes there)
OUTPUTS = {
    "hunt": ["hunt", "fa3-fp8", "--budget", "5s", "--seed", "0", "--out", UNWRITABLE],
    "explain": ["explain", "--seq-len", "64", "--heads", "1", "--out", UNWRITABLE],
    "validate": ["validate", "--samples", "8", "--out", UNWRITABLE],
    "validate-pin": ["validate", "--samples", "8", "--pin", "/proc/env.pin"],
    "consistency": ["consistency", "sdpa-math", "--out", UNWRITABLE],
    "mutants": ["mutants", "--out", UNWRITABLE],
    "study": ["study", "--preset", "tiny", "--out", UNWRITABLE],
    "study-serving": ["study", "--preset", "serving-tiny", "--out", UNWRITABLE],
    "train-study": ["train-study", "--preset", "tiny", "--out", UNWRITABLE],
    "report": ["report", "/proc"],
}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("args", list(OUTPUTS.values()), ids=list(OUTPUTS))
def test_unwritable_output_is_one_line_before_any_work(args):
    """Every output path (--out, --pin, report's FOLDER) is tried before the work (which would take seconds to
    minutes here): one line, exit 2."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "not writable" in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
