"""flashcheck hunt on a target that kills its process: the target runs in a worker, the death is a `crash`
finding (signal, stderr line) stored before anything else, shrunk to its trigger; the hunt goes on, ends with
its report and exit 1, resumes without recording the crash twice, and compare --case says the target crashed."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.hunt import HuntCase, parse_target
from flashcheck.hunt.isolate import IsolatedTarget, signal_name, why_line
from flashcheck.hunt.judge import evaluate
from flashcheck.hunt.search import hunt

pytest.importorskip("hypothesis")
CRASH = "hunt_bugs:crash_at_tile"  # SIGSEGV when Lk % 128 == 64, after a "Check failed" line on stderr
RUN = dict(budget_s=120.0, seed=0, backward=False, shrink_s=60.0)


def test_a_crash_is_stored_at_once_shrunk_to_its_trigger_and_the_hunt_goes_on(tmp_path):
    seen: list[dict] = []

    def step(state, note: str) -> None:  # the store as it is when the first crash is reported
        if state.crashes and not seen:
            seen.append(json.loads((tmp_path / "findings.json").read_text()))

    state = hunt(parse_target(CRASH), tmp_path, rounds=3, on_step=step, **RUN)
    assert seen and [(f["kind"], f.get("provisional")) for f in seen[0]["findings"]] == [("crash", True)]
    crashes = [f for f in state.findings if f.kind == "crash"]
    assert len(crashes) == 1 and state.rounds == 3 and state.examples > 60, [f.to_dict() for f in state.findings]
    f = crashes[0]
    assert f.tensor == "SIGSEGV" and "Check failed: Lk % 128 != 64 (Lk = 64)" in f.message, f.to_dict()
    assert f.case.lk == 64 and f.case.lq == 1 and f.case.sink is None and not f.provisional, f.case.describe()
    assert len(state.findings) == 1  # the worker's deaths cost nothing else: no refusal, no other finding
    stored = json.loads((tmp_path / "findings.json").read_text())
    assert stored["crashes"] == state.crashes >= 1 and "provisional" not in stored["findings"][0]
    again = hunt(parse_target(CRASH), tmp_path, rounds=4, **RUN)  # resume: the database replays the crash
    assert again.rounds == 4 and again.crashes > state.crashes and again.examples > state.examples
    assert [g.kind for g in again.findings] == ["crash"] and again.findings[0].case == f.case  # recorded once


def test_cli_hunt_reports_the_crash_and_compare_reruns_it_without_a_traceback(tmp_path):
    runner = CliRunner()
    args = ["hunt", CRASH, "--budget", "1m", "--rounds", "3", "--seed", "0", "--forward-only"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "h")])
    assert res.exit_code == 1, res.output
    assert "the process died of SIGSEGV" in res.output and "Lk=64" in res.output, res.output
    assert "stderr: F1206 planted.cc:1] Check failed" in res.output and "killed the target's process" in res.output
    assert "FAIL: see the findings" in res.output and "Traceback" not in res.output
    assert "SIGSEGV" in (tmp_path / "h" / "report.md").read_text()
    line = next(x for x in res.output.splitlines() if x.startswith("rerun: "))[len("rerun: ") :]
    again = runner.invoke(app, shlex.split(line)[1:])
    assert again.exit_code == 1 and "FAIL: the target crashed: the process died of SIGSEGV" in again.output
    assert "Check failed" in again.output and "Traceback" not in again.output, again.output


def test_an_isolated_target_that_raises_is_a_refusal_and_its_worker_lives_on(tmp_path):
    with IsolatedTarget(parse_target("hunt_bugs:always_raises"), tmp_path / "err") as w:
        out = evaluate(w.target, HuntCase(lq=3, lk=5), run=w.outputs)
        assert out.error == "ValueError: this kernel runs fp8 inputs only" and w.restarts == 0
    target = parse_target("hunt_bugs:correct")
    with IsolatedTarget(target, tmp_path / "err") as w:
        case = HuntCase(lq=5, lk=7, backward=True)
        assert evaluate(target, case, run=w.outputs).verdicts == evaluate(target, case).verdicts


def test_why_line_and_signal_name():
    text = "noise\nF1206 01:23:50.774018 28837 ynn_emitter.cc:201] Check failed: a == b\n    @ 0x7f xla::X()\n"
    assert why_line(text).startswith("F1206") and why_line("a\nlast\n\n") == "last" and why_line("") == ""
    assert why_line("Fatal Python error: Aborted\n\nCurrent thread:\n") == "Fatal Python error: Aborted"
    assert (signal_name(-6), signal_name(-11), signal_name(3), signal_name(None)) == (
        "SIGABRT",
        "SIGSEGV",
        "exit code 3",
        "unknown exit",
    )


def test_a_semantics_probe_that_kills_its_process_reads_crash_and_the_others_are_measured():
    from flashcheck.hunt.semantics import semantics_table

    rows = {p.name: p for p in semantics_table(parse_target("hunt_bugs:abort_on_masked_rows"))}
    dead = "crash: the process died of SIGABRT"
    assert rows["fully masked rows"].returned == dead and rows["fully masked rows"].agrees is False
    assert rows["Lk = 0"].returned == "zeros" and rows["causal, Lq > Lk"].agrees is True, rows


def test_a_link_planted_at_the_workers_stderr_file_is_refused_and_nothing_written_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "err").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        IsolatedTarget(parse_target("hunt_bugs:always_raises"), tmp_path / "err")
    assert victim.read_text() == "keep"


def test_a_case_with_no_answer_in_time_is_a_hang_and_the_next_case_runs(tmp_path):
    """--case-timeout: a backend or callable that never returns costs one case (a crash finding of signal "hang",
    its worker killed), not the hunt; the next case gets a fresh worker and its right answer."""
    import time

    from flashcheck.hunt.report import crash_text

    target = parse_target("hunt_bugs:hang_at_tile")
    with IsolatedTarget(target, tmp_path / "err", timeout_s=1.0) as w:
        t0 = time.monotonic()
        hung = evaluate(target, HuntCase(lq=1, lk=64), run=w.outputs)
        assert time.monotonic() - t0 < 30 and w.restarts == 1
        (v,) = hung.verdicts
        assert (v.kind, v.tensor) == ("crash", "hang") and "no answer in 1 s" in v.message, v
        assert evaluate(target, HuntCase(lq=3, lk=5), run=w.outputs).passed and w.restarts == 1
    text = crash_text({"tensor": "hang", "describe": "Lq=1 Lk=64", "message": v.message})
    assert text.startswith("hung on Lq=1 Lk=64: no answer in 1 s")


def test_compare_case_on_a_hanging_target_says_it_hung(monkeypatch):
    import flashcheck.hunt.isolate as isolate

    monkeypatch.setattr(isolate, "CASE_TIMEOUT_S", 1.0)
    args = ["compare", "--backend", "hunt_bugs:hang_at_tile", "--case", HuntCase(lq=1, lk=64).to_text()]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "FAIL: the target hung: no answer in 1 s" in res.output, res.output
    assert "Traceback" not in res.output
