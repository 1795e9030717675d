"""The hunt against hostile inputs of its own (issue 47, items 1-3): a forged findings store never writes outside
--out and is one line naming the file and the field; every call to the target has the case timeout (semantics probes
too); the target is imported only in the worker (a death, an exit or an error at import: one line, exit 2); a target
that fails every case, returns no tensor or the wrong shape is a finding, never a pass; nothing a target forks outlives
its worker; what it prints is bounded and never reaches --json."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.fileio import UnsafeFile, safe_child
from flashcheck.hunt import HuntCase, parse_target
from flashcheck.hunt.store import HuntState

pytest.importorskip("hypothesis")
QUICK = ["--budget", "1m", "--rounds", "1", "--seed", "0", "--forward-only"]


def _store(tmp_path, finding: dict | None = None, **top) -> None:
    good = {
        "kind": "nan", "tensor": "out", "case": HuntCase(lq=3, lk=5).to_text(), "where": "out NaN", "message": "m",
        "found_after_s": 1.0, "shrunk_after_s": 2.0, "examples_before": 3, "margin": 1.0,
    }  # fmt: skip
    d = {"target": "hunt_bugs:correct", "elapsed_s": 3.0, "examples": 9, "findings": [good | (finding or {})]} | top
    (tmp_path / "findings.json").write_text(json.dumps(d))


def test_safe_child_keeps_a_name_inside_its_folder(tmp_path):
    assert safe_child(tmp_path, "01-nan-out.json") == tmp_path / "01-nan-out.json"
    for bad in ("../evil", "a/b", "..", ".", "", "x\x00y", "x\ny", "a\\b", "x" * 300):
        with pytest.raises(UnsafeFile, match="not a plain file name"):
            safe_child(tmp_path, bad)


def test_a_forged_store_never_writes_outside_out_and_is_one_line(tmp_path):
    victim = tmp_path / "victim" / "evil.json"
    victim.parent.mkdir()
    victim.write_text("keep")
    victim.chmod(0o600)
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    _store(out, {"tensor": "../../../victim/evil"})
    res = CliRunner().invoke(app, ["hunt", "hunt_bugs:correct", "--out", str(out), *QUICK])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = res.output.strip()
    assert "\n" not in line and "findings.json" in line and "findings[0].tensor" in line, line
    assert victim.read_text() == "keep" and (victim.stat().st_mode & 0o777) == 0o600
    assert not (out / "findings").exists()


@pytest.mark.parametrize(
    "finding, top, says",
    [
        ({"kind": None}, {}, "findings[0].kind = None"),
        ({"kind": "../x"}, {}, "findings[0].kind"),
        ({"case": 3}, {}, "findings[0].case = 3"),
        ({"case": "lq=nope"}, {}, "findings[0].case is not a case"),
        ({"found_after_s": "soon"}, {}, "findings[0].found_after_s"),
        ({"examples_before": -1}, {}, "findings[0].examples_before"),
        ({"message": ["a"]}, {}, "findings[0].message"),
        ({"margin": "big"}, {}, "findings[0].margin"),
        ({"tensor": "out\x1b[31m"}, {}, "findings[0].tensor = 'out\\x1b[31m'"),
        ({}, {"examples": "9"}, "the store.examples"),
        ({}, {"findings": {"a": 1}}, "the store.findings"),
        ({}, {"refusal_examples": [1]}, "the store.refusal_examples"),
    ],
)
def test_forged_store_fields_name_the_file_and_the_field(finding, top, says, tmp_path):
    _store(tmp_path, finding, **top)
    with pytest.raises(ValueError) as exc:
        HuntState.load(tmp_path, parse_target("hunt_bugs:correct", load=False))
    text = str(exc.value)
    assert str(tmp_path / "findings.json") in text and says in text and "\n" not in text and "\x1b" not in text, text


def test_a_finding_without_a_field_is_one_line(tmp_path):
    _store(tmp_path)
    d = json.loads((tmp_path / "findings.json").read_text())
    del d["findings"][0]["kind"]
    (tmp_path / "findings.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"findings\[0\] has no field 'kind'"):
        HuntState.load(tmp_path, parse_target("hunt_bugs:correct", load=False))


def test_a_semantics_probe_that_hangs_is_a_hang_row_and_the_others_are_measured():
    from flashcheck.hunt.semantics import semantics_table

    t0 = time.monotonic()
    rows = {p.name: p for p in semantics_table(parse_target("hunt_bugs:hang_on_masked_rows"), timeout_s=1.0)}
    assert time.monotonic() - t0 < 60
    assert rows["fully masked rows"].returned == "hang: no answer in 1 s: the worker was killed", rows
    assert rows["fully masked rows"].agrees is False and rows["Lk = 0"].agrees is True, rows


def test_cli_hunt_of_a_target_hanging_in_the_probes_goes_on_with_progress(tmp_path, monkeypatch):
    """Two probes hang (1 s each), then the hunt finds the hang in its 6th case and shrinks it, each hanging step
    1 s, until the budget ends: 5 s of budget (not QUICK's minute, whose shrinking waited through 12 hangs, 7 of
    them the same case reached again by Hypothesis's shrinker). A case that hung is never run again. A 1 s case
    timeout still leaves a fresh worker's answer to a case 5x its time on 2 cores at load 7 (0.1-0.2 s)."""
    import flashcheck.hunt.search as search

    hung: list[str] = []

    def evaluate(target, case, *a):
        outcome = search_evaluate(target, case, *a)
        hung.extend(case.to_text() for v in outcome.failures if v.tensor == "hang")
        return outcome

    search_evaluate = search.evaluate
    monkeypatch.setattr(search, "evaluate", evaluate)
    args = ["hunt", "hunt_bugs:hang_on_masked_rows", "--out", str(tmp_path / "h"), "--case-timeout", "1s"]
    res = CliRunner().invoke(app, [*args, *QUICK, "--budget", "5s"])
    assert hung and len(set(hung)) == len(hung), hung
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "semantics probes of hunt_bugs:hang_on_masked_rows" in res.output and "hang: no answer in 1 s" in res.output
    assert "hunt hunt_bugs:hang_on_masked_rows, budget seconds" in res.output, res.output  # it went on
    assert "crash: hung on" in res.output and "dead rows" in res.output, res.output  # and found the hang


@pytest.mark.parametrize(
    "how, says",
    [
        ("segv", "loading it killed its process (SIGSEGV); its output said: F1206 hostile.cc:1] Check failed: import"),
        ("exit3", "loading it killed its process (exit code 3)"),
        ("raise", "cannot import attention from hunt_hostile (libhostile.so: cannot open shared object file)"),
        ("hang", "loading it gave no answer"),
    ],
)
def test_a_target_that_dies_exits_or_fails_at_import_is_one_line_exit_2(how, says, tmp_path, monkeypatch):
    import sys

    import flashcheck.hunt.isolate as isolate

    limit = 1.0 if how == "hang" else 3.0  # a hang waits it out twice (hunt, compare); the others die sooner
    monkeypatch.setattr(isolate, "CASE_TIMEOUT_S", limit)  # compare --case's limit
    monkeypatch.setenv("FLASHCHECK_TEST_HOSTILE", how)
    args = ["hunt", "hunt_hostile:attention", "--out", str(tmp_path / "h"), "--case-timeout", f"{limit:g}s", *QUICK]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = res.output.strip()
    assert line.startswith("error: target 'hunt_hostile:attention': ") and says in line and "\n" not in line, line
    assert "disk" not in line and "hunt_hostile" not in sys.modules  # imported only in the worker
    case = HuntCase(lq=3, lk=5).to_text()
    again = CliRunner().invoke(app, ["compare", "--backend", "hunt_hostile:attention", "--case", case])
    assert again.exit_code == 2 and says in again.output and "Traceback" not in again.output, again.output


@pytest.mark.parametrize("isolated", [True, False])
def test_a_target_that_fails_every_case_is_a_finding_not_a_pass(isolated, tmp_path):
    from flashcheck.hunt.search import hunt

    state = hunt(parse_target("hunt_bugs:always_raises"), tmp_path, budget_s=60, seed=0, rounds=1,
                 backward=False, isolate=isolated)  # fmt: skip
    (f,) = state.findings
    n = state.examples
    assert n > 10 and state.refusals == n and f.kind == "failed", f.to_dict()
    first = "first error ValueError: this kernel runs fp8 inputs only"
    assert f.message == f"the target failed on {n} of {n} cases: {first}", f.message
    again = hunt(parse_target("hunt_bugs:always_raises"), tmp_path, budget_s=60, seed=0, rounds=2,
                 backward=False, isolate=isolated)  # fmt: skip
    (g,) = again.findings
    assert g.kind == "failed" and f"failed on {again.examples} of {again.examples} cases" in g.message


def test_cli_a_target_that_fails_every_case_ends_fail_exit_1(tmp_path):
    res = CliRunner().invoke(app, ["hunt", "hunt_bugs:always_raises", "--out", str(tmp_path / "h"), *QUICK])
    assert res.exit_code == 1 and "the target failed on" in res.output and "PASS" not in res.output, res.output


@pytest.mark.parametrize(
    "bug, says",
    [("returns_none", "the target returned a NoneType, not a tensor"), ("wrong_shape", "the target returned shape")],
)
def test_no_tensor_or_a_wrong_shape_is_an_output_finding_in_hunt_and_compare(bug, says, tmp_path):
    res = CliRunner().invoke(app, ["hunt", f"hunt_bugs:{bug}", "--out", str(tmp_path / "h"), *QUICK])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert [f["kind"] for f in summary["findings"]] == ["output"] and says in summary["findings"][0]["message"]
    case = HuntCase(lq=3, lk=5, heads=2).to_text()
    again = CliRunner().invoke(app, ["compare", "--backend", f"hunt_bugs:{bug}", "--case", case])
    assert again.exit_code == 1 and says in again.output and "Traceback" not in again.output, again.output


def test_nothing_a_target_forks_outlives_its_worker(tmp_path, monkeypatch):
    from flashcheck.hunt.isolate import IsolatedTarget
    from flashcheck.hunt.judge import evaluate

    pids = tmp_path / "pids"
    monkeypatch.setenv("FLASHCHECK_TEST_PIDS", str(pids))
    target = parse_target("hunt_bugs:forks_a_child", load=False)
    with IsolatedTarget(target, tmp_path / "err") as w:
        for lk in (3, 5, 7):
            assert evaluate(target, HuntCase(lq=3, lk=lk), run=w.outputs).passed
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 3
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not any(_alive(p) for p in children), children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, waiting for init to reap it
    except FileNotFoundError:
        return False


def test_what_a_target_prints_is_bounded_and_never_in_json(tmp_path, monkeypatch):
    import flashcheck.hunt.isolate as isolate

    monkeypatch.setattr(isolate, "OUTPUT_CAP", 1 << 20)
    res = CliRunner().invoke(app, ["hunt", "hunt_bugs:chatty", "--out", str(tmp_path / "h"), "--json", *QUICK])
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)  # nothing the target printed is in it
    assert summary["passed"] and summary["examples"] > 10
    log = (tmp_path / "h" / "worker-stderr.txt").read_bytes()
    assert (1 << 20) <= len(log) < (1 << 20) + 200 and log.rstrip().endswith(b"is left out here]"), len(log)
    assert os.stat(tmp_path / "h" / "worker-stderr.txt").st_size == len(log)
