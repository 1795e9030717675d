"""`flashcheck compare` at sizes near this machine's memory: the refusal's numbers agree with its rule (a run
plans on HEADROOM of the memory available now), and a long comparison says what it computes before it starts.
The available memory is monkeypatched: nothing large is allocated."""

from __future__ import annotations

import re

from typer.testing import CliRunner

import flashcheck.cli.compare as cli_compare
from flashcheck.cli import app
from flashcheck.core.inputs import InputSpec
from flashcheck.kernels.sim import memory
from flashcheck.kernels.sim.memory import distinct_bytes, estimate_bytes
from flashcheck.measure.compare import CompareConfig

runner = CliRunner()
GIB = 2**30
UNITS = {"MiB": 2**20, "GiB": GIB, "TiB": 2**40}


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def test_the_refusal_states_the_share_it_allows_and_its_numbers_agree(monkeypatch):
    avail = int(22.8 * GIB)
    monkeypatch.setattr(memory, "available_bytes", lambda: avail)
    res = runner.invoke(app, ["compare", "--seq-len", "265200"])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.output
    pattern = (
        r"needs about ([\d.]+ [MGT]iB) \(.*\); ([\d.]+ [MGT]iB) is available now and a run may plan on 90% of it "
        r"\(([\d.]+ [MGT]iB)\); the largest seq_len that fits is (\d+) \(in the memory available now"
    )
    m = re.search(pattern, res.stderr)
    assert m, res.stderr
    need, shown_avail, budget, largest = _bytes(m[1]), _bytes(m[2]), _bytes(m[3]), int(m[4])
    assert need > budget and budget < shown_avail  # the numbers printed agree with the refusal
    assert abs(budget - memory.HEADROOM * avail) < 0.05 * GIB
    assert largest < 265200
    fits = [CompareConfig(inputs=InputSpec(seq_len=n)).footprint() for n in (largest, largest + 1)]
    assert estimate_bytes(fits[0]) <= memory.HEADROOM * avail < estimate_bytes(fits[1])


def test_a_need_just_over_the_budget_never_prints_as_equal_to_it():
    budget = int(20.5 * GIB)
    need_s, budget_s = distinct_bytes(budget + 2**20, budget)
    assert need_s != budget_s and _bytes(need_s) > _bytes(budget_s), (need_s, budget_s)
    assert distinct_bytes(budget, budget) == ("20.5 GiB", "20.5 GiB")  # equal fits: no extra digits


def test_a_long_comparison_says_what_it_computes_before_it_starts(monkeypatch):
    monkeypatch.setattr(cli_compare, "LONG_SCORES", 32 * 32)
    res = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1"])
    assert res.exit_code == 0, res.output
    first = res.stderr.splitlines()[0]
    assert first.startswith("compare: computing batch=1 heads=1 seq_len=32 head_dim=64 (the FP64 reference"), first
    as_json = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1", "--json"])
    assert as_json.exit_code == 0 and "compare: computing" not in as_json.stderr, as_json.stderr  # stays JSON
    backend = runner.invoke(app, ["compare", "--backend", "eager", "--seq-len", "32", "--heads", "1"])
    assert backend.stderr.startswith("compare: computing batch=1 heads=1 seq_len=32"), backend.output


def test_a_short_comparison_prints_no_such_line_and_a_refusal_stays_one_line(monkeypatch):
    res = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1"])
    assert res.exit_code == 0 and "compare: computing" not in res.stderr, res.stderr
    monkeypatch.setattr(cli_compare, "LONG_SCORES", 1)
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)
    refused = runner.invoke(app, ["compare", "--seq-len", "4096", "--heads", "1"])
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("error: ") and "available now" in refused.stderr


def test_a_study_cases_skip_reason_agrees_with_the_workers_share():
    from flashcheck.study.cases import Case
    from flashcheck.study.memory import too_big

    c = Case("flash", "bf16-mixed", "fa2", 128, 128, 1, 8, 265200, 64, False, "normal", 0)
    why = too_big(c, int(22.8 * GIB), workers=2)
    m = re.search(
        r"needs about ([\d.]+ [MGT]iB); ([\d.]+ [MGT]iB) available now, a worker may plan on ([\d.]+ [MGT]iB)", why
    )
    assert m and "(90% of it, split among 2 workers)" in why, why
    assert _bytes(m[1]) > _bytes(m[3]) and abs(_bytes(m[3]) - 0.45 * 22.8 * GIB) < 0.05 * GIB, why
