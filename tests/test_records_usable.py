"""Records that pass the schema no longer break a study folder for good (issue 47, item 5): a record is checked for
the fields its readers need (the study's metrics, numbers a report can take logs of), one it cannot use is dropped
with a warning naming the file, line and field and measured again; non-finite and huge values reach the report's
verdicts and figures without a traceback; guide.jsonl's lines are checked like records."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.study.cases import evaluate_group, expand, group_by_inputs
from flashcheck.study.config import StudyConfig, Sweep
from flashcheck.study.store import ResultStore

runner = CliRunner()
ONE = StudyConfig(
    name="one",
    sweeps=(
        Sweep(question="seq_len", methods=("flash:bf16",), seq_lens=(32,), blocks=((8, 8),), heads=1, seeds=(0, 1)),
    ),
)  # fmt: skip


@pytest.fixture(scope="module")
def one_records() -> list[str]:
    """ONE's records (flash and its baseline, two seeds) as JSON lines, computed in this process."""
    threads = torch.get_num_threads()
    lines: list[str] = []
    for group in group_by_inputs(expand(ONE)):
        evaluate_group(group, lambda rec: lines.append(rec.to_json()))
    torch.set_num_threads(threads)
    return lines


def _folder(tmp_path: Path, lines: list[str]) -> Path:
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps(ONE.to_dict()))
    (out / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    return out


def _edit(line: str, **views) -> str:
    """`line` with each view ("errors", "errors_rounded", "stats") replaced: a dict, or a function of the old one."""
    d = json.loads(line)
    for view, new in views.items():
        d[view] = new(d[view]) if callable(new) else new
    return json.dumps(d)


def _every(value):
    return lambda old: {k: value for k in old}


def _errors_but_cosine(value):
    return lambda old: {k: (v if k.endswith("cos_sim") else value) for k, v in old.items()}


FORGED = {  # the trial's records: each passed main's schema and broke the report (and every resume)
    "unknown metric": ({"errors": {"foo": 1.0}, "errors_rounded": {"foo": 1.0}}, "errors.max_abs is missing"),
    "huge error": ({"errors": _every(1e308), "errors_rounded": _every(1e308)}, "larger than any value"),
    "integer past floats": ({"errors": _every(10**400)}, "integer of 401 digits"),
    "share out of range": ({"stats": lambda old: old | {"f_out": 7.5}}, "stats.f_out is 7.5, not a share"),
    "negative error": ({"errors": _errors_but_cosine(-1.0)}, "not an error (>= 0)"),
}


@pytest.mark.parametrize("name", list(FORGED))
def test_a_record_its_report_cannot_use_is_dropped_naming_file_line_and_field(tmp_path, one_records, name):
    views, why = FORGED[name]
    lines = [_edit(line, **views) for line in one_records]  # every record forged alike
    out = _folder(tmp_path, lines)
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert f"{out / 'records.jsonl'}: dropped {len(lines)} unreadable line(s): line 1 (" in res.stderr, res.stderr
    assert why in res.stderr, res.stderr


@pytest.mark.parametrize(
    "views",
    [
        {"stats": _every(None)},  # a statistic may be null: the error model leaves the case out
        {"errors": _every(math.inf), "errors_rounded": _every(math.inf)},  # an overflowed output
        {"errors": _every(math.nan), "errors_rounded": _every(math.nan)},
        {"errors": _errors_but_cosine(1e100), "errors_rounded": _errors_but_cosine(1e100)},  # the largest allowed
    ],
    ids=["null stats", "all inf", "all nan", "1e100"],
)
def test_non_finite_null_and_huge_values_that_pass_reach_the_report_without_a_traceback(tmp_path, one_records, views):
    out = _folder(tmp_path, [_edit(line, **views) for line in one_records])
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0 and "Traceback" not in res.output and "dropped" not in res.stderr, res.output
    assert json.loads((out / "summary.json").read_text())["cases"] == len(one_records)


def test_half_tiny_half_huge_errors_give_ratios_not_a_math_domain_error(tmp_path, one_records):
    """main took log(a / b): 5e-324 / 1e100 underflows to 0 ("math domain error"); exp of the mean log overflowed."""
    from flashcheck.reporting.verdicts import ratio_interval
    from flashcheck.study.points import geometric

    est = ratio_interval([5e-324, 5e-324, 1e100], [1e100, 1e100, 5e-324])
    assert est.n == 3 and est.value > 0 and math.isfinite(est.value)
    assert geometric((1e100, 1e100, 1e100)).value == pytest.approx(1e100)
    assert ratio_interval([1e100] * 3, [5e-324] * 3).value == math.inf  # past the largest float, not OverflowError
    tiny_huge = [_edit(x, errors=_errors_but_cosine(5e-324 if i % 2 else 1e100)) for i, x in enumerate(one_records)]
    out = _folder(tmp_path, tiny_huge)
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output


def test_a_resume_measures_a_dropped_record_again_and_the_folder_heals(tmp_path, one_records):
    """main kept an ok record with errors {"foo": 1.0} as final: KeyError on every resume, for good."""
    from flashcheck.study.runner import run_study

    out = _folder(tmp_path, [one_records[0], _edit(one_records[1], errors={"foo": 1.0}), *one_records[2:]])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_study(ONE, out, workers=1, quiet=True)
    assert any("errors.max_abs is missing" in str(w.message) for w in seen)
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(one_records) and all("max_abs" in json.loads(x)["errors"] for x in lines)
    assert json.loads(one_records[1])["case_id"] == json.loads(lines[-1])["case_id"]  # measured again
    assert len(ResultStore(out).load()) == len(one_records)
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0 and "dropped" not in res.stderr, res.output


# ---- guide.jsonl ------------------------------------------------------------------------------------------------

SCALE = {"id": "scale/flash:fp16/L=64", "params": {"kind": "scale", "method": "flash:fp16", "seq_len": 64},
         "status": "ok", "result": {"boundary_i": 57, "inputs_overflow_i": 113, "boundary_sigma": 139.58,
                                    "points": {"0": True, "57": False}, "monotone": True}, "seconds": 0.06}  # fmt: skip
COST = {"id": "cost/sdpa-math:bf16/fwd/L=64", "status": "ok", "seconds": 3.1,
        "params": {"kind": "cost", "method": "sdpa-math:bf16", "seq_len": 64, "backward": False},
        "result": {"times": [0.0003, 0.0002, 0.00017], "peak_bytes": 102468}}  # fmt: skip


def test_a_guide_line_of_strings_is_dropped_naming_file_line_and_field(tmp_path):
    """main: "could not convert string to float: 'fast'" from deep in the claims, naming no file."""
    from flashcheck.questions.guide.tasks import GUIDE_FILE, load_results

    forged_cost = {**COST, "result": {**COST["result"], "times": ["fast", "slow", "x"]}}
    forged_scale = {**SCALE, "id": "scale/flash:fp16/L=128", "params": {**SCALE["params"], "seq_len": "long"}}
    lines = [SCALE, forged_cost, forged_scale]
    (tmp_path / GUIDE_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.warns(UserWarning) as seen:
        results = load_results(tmp_path)
    assert list(results) == [SCALE["id"]]
    message = " ".join(str(w.message) for w in seen)
    assert f"{tmp_path / GUIDE_FILE}: dropped 2 unreadable line(s)" in message
    assert "line 2 (result.times[0] is 'fast', not a number)" in message
    assert "line 3 (params.seq_len is 'long', not an integer)" in message


def test_a_file_where_the_figures_folder_goes_is_one_line_exit_2(tmp_path, one_records):
    """New probe: figures/ replaced by a plain file gave FileExistsError's traceback (make_folder)."""
    out = _folder(tmp_path, one_records)
    (out / "figures").write_text("not a folder")
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "figures' (" in res.stderr and "is not a folder" in res.stderr, res.stderr
    assert (out / "figures").read_text() == "not a folder"
