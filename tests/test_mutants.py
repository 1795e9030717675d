"""The mutant catalogue (flashcheck.testing.mutants), the scores (flashcheck.testing.scores) and
`flashcheck mutants`."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.budget import check_budget
from flashcheck.testing import scores
from flashcheck.testing.harness import Case, prepare, run_kernel
from flashcheck.testing.mutants import CORRECT, MUTANTS, correct_kernel, get_mutant

runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one torch thread is as fast, and on a shared machine extra threads only spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads", "length"), [(2, 2, 128), (4, 2, 97), (3, 1, 70)])
def test_clean_kernel_is_correct_in_fp32(heads, kv_heads, length, causal):
    """The mutants' clean kernel, forward and backward, within the peers' budget against the FP64 reference
    with plain fp32 PyTorch as the baseline (grouped-query heads, ragged last tile, causal)."""
    case = Case(heads=heads, kv_heads=kv_heads, seq_len=length, head_dim=40, dtype=torch.float32, causal=causal,
                backward=True)  # fmt: skip
    prep = prepare(case)
    got = run_kernel(correct_kernel, prep.inputs, prep.grad_out, causal)
    for name, ref in prep.reference.items():
        assert check_budget(got[name], ref, prep.baseline[name], rule="peers", gradient=name != "out"), name


def test_each_mutant_is_the_clean_kernel_plus_its_bug():
    """Every mutant changes the tensors on a case where its bug is live; a backward bug leaves the forward
    output bit-identical; dtype-only bugs are no-ops in fp32."""
    assert CORRECT.describe() == "none"
    for m in MUTANTS.values():
        assert m.bug.describe().count("=") == 1, m.name  # exactly one field differs from the correct kernel
        case = Case(heads=4, kv_heads=2, seq_len=97, head_dim=32, dtype=m.dtypes[0], causal=True, backward=True)
        prep = prepare(case)
        clean = run_kernel(correct_kernel, prep.inputs, prep.grad_out, True)
        got = run_kernel(m.fn, prep.inputs, prep.grad_out, True)
        changed = {n for n in got if not torch.equal(got[n], clean[n])}
        if m.name == "pad-unmasked":  # causal masks the padding anyway: the bug shows without the mask
            assert not changed
            continue
        assert changed, m.name
        assert ("out" in changed) != m.backward, m.name
        if torch.float32 not in m.dtypes:
            fp32 = prepare(Case(seq_len=97, head_dim=32, dtype=torch.float32, backward=True))
            same = run_kernel(m.fn, fp32.inputs, fp32.grad_out, False)
            base = run_kernel(correct_kernel, fp32.inputs, fp32.grad_out, False)
            assert all(torch.equal(same[n], base[n]) for n in same), m.name
    with pytest.raises(ValueError, match=re.escape("unknown mutant 'scale'; expected one of scale-0.5%")):
        get_mutant("scale")


def test_scale_bug_in_bf16_caught_by_flashcheck_missed_by_peers():
    """The issue's example on a small grid: the 1% scale bug (and 0.5%, and dK 1% off) pass the peers' rule
    in bf16 and fail flashcheck's."""
    grid = scores.Grid(shapes=((1, 4, 2, 128, 64),), distributions=("normal",), seeds=(0,), correct_cases=0,
                       dtypes=(torch.bfloat16,))  # fmt: skip
    picked = [MUTANTS[n] for n in ("scale-0.5%", "scale-1%", "dk-scale-1%")]
    rows = scores.score_mutants(grid=grid, mutants=picked)
    assert [(r.mutant, r.dtype, r.active) for r in rows] == [(m.name, "bf16", 2) for m in picked]
    for r in rows:
        assert not r.caught("peers") and r.failed["flashcheck"] == 2, r
        assert r.checks["flashcheck"].get("bias") == 2


@pytest.mark.slow
def test_no_false_failures_at_ci_size():
    """The false-failure test at reduced size: every correct kernel (the clean kernel, SDPA math and flash,
    the simulator as PyTorch's CPU kernel and as FA2) on 15 cases over lengths 97/257/1025, head dims
    40/64/80/128, three dtypes and five input distributions, forward and backward, passes flashcheck's
    rule. (The peers' 3x max test fails PyTorch's CPU flash backward in fp32 on sharp and tied inputs.)"""
    cases = scores.correct_cases(15, seed0=500, lengths=(97, 257, 1025))
    assert {c.seq_len for c in cases} == {97, 257, 1025} and {c.head_dim for c in cases} == {40, 64, 80, 128}
    ff = scores.false_failures(cases=cases)
    assert ff.runs == 15 * len(scores.CORRECT_KERNELS)
    assert ff.failed["flashcheck"] == 0, ff.examples["flashcheck"]


def test_derive_factors_is_quantile_times_margin():
    stats = [{"max": x / 10, "rel_l2": x / 100, "bias": 0.5, "row": 2 * x / 100} for x in range(1, 101)]
    ratios = [
        {"dtype": "bfloat16", "kind": k, "distribution": "normal", **s} for s in stats for k in ("output", "gradient")
    ]
    f = scores.derive_factors(ratios, quantile=0.9, margin=1.25)[("bfloat16", "output", "normal")]
    assert f.rel_l2 == pytest.approx(1.2)  # q0.9 of 0.01..1.00 is 0.901 -> x1.25 = 1.126 -> 2 digits up 1.2
    assert f.bias == 1.0  # 0.625 -> at least 1
    assert f.row == pytest.approx(2.3)  # 1.802 x 1.25 = 2.2525 -> 2.3
    assert f.max == pytest.approx(12)  # 9.01 x 1.25 = 11.26 -> 12
    small = scores.derive_factors([dict(r, max=0.1) for r in ratios])
    assert small[("bfloat16", "output", "normal")].max == 2.0  # never below the peers' k
    assert small[("bfloat16", "gradient", "normal")].max == 3.0


def _tiny(monkeypatch):
    """A grid of one case, three mutants and two correct kernels: the command's interface, quickly."""
    grid = scores.Grid(shapes=((1, 4, 2, 97, 32),), distributions=("normal",), seeds=(0,), correct_cases=2,
                       dtypes=(torch.bfloat16,), lengths=(97,))  # fmt: skip
    monkeypatch.setitem(scores.GRIDS, "tiny", grid)
    monkeypatch.setattr(scores, "MUTANTS", {n: MUTANTS[n] for n in ("scale-1%", "drop-last-key", "gqa-modulo")})
    kernels = {n: scores.CORRECT_KERNELS[n] for n in ("tiled", "sdpa-math")}
    monkeypatch.setattr(scores, "CORRECT_KERNELS", kernels)


def test_cli_json_and_files(monkeypatch, tmp_path):
    _tiny(monkeypatch)
    res = runner.invoke(app, ["mutants", "--size", "tiny", "--rule", "peers,flashcheck", "--out", str(tmp_path),
                              "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    caught = {m["mutant"]: m["caught"] for m in data["mutants"]}
    assert [m["bug"] for m in data["mutants"]] == ["scale_error=0.01", "drop_keys=1", "gqa_modulo=True"]
    assert caught == {
        "scale-1%": {"peers": False, "flashcheck": True},
        "drop-last-key": {"peers": True, "flashcheck": True},
        "gqa-modulo": {"peers": True, "flashcheck": True},
    }
    assert data["catch_rate"] == {"peers": pytest.approx(2 / 3), "flashcheck": 1.0}
    failed = sum(m["cases_failed"]["flashcheck"] for m in data["mutants"])
    active = sum(m["active_cases"] for m in data["mutants"])
    assert data["cases_caught"]["flashcheck"] == {"failed": failed, "active": active}
    assert data["false_failures"]["runs"] == 4 and data["false_failures"]["failed"] == {"peers": 0, "flashcheck": 0}
    assert json.loads((tmp_path / "summary.json").read_text())["caught"] == {"peers": 2, "flashcheck": 3}
    assert "| scale-1% | bf16 | 2 | missed: 0/2 failed | caught: 2/2 failed" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").stat().st_size > 0


def test_cli_human_output_and_one_rule(monkeypatch, tmp_path):
    _tiny(monkeypatch)
    res = runner.invoke(app, ["mutants", "--size", "tiny", "--rule", "peers", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "scale-1%" in res.output and "missed: 0/2 failed" in res.output and "total caught" in res.output
    assert "2/3 = 66.7%" in res.output and "flashcheck" not in res.output.split("total caught")[0]
    assert "mutant cases caught (a case: one mutant on one grid point where its bug shows): peers " in res.output
    assert "false failures over 4 correct-kernel runs: peers 0/4 (0.0%)" in res.output  # 2 cases x 2 kernels
    assert "peers: catches 2/3 mutants (66.7%), 0 false failures in 4 runs: sound" in res.output


def test_cli_exit_1_on_a_false_failure(monkeypatch, tmp_path):
    _tiny(monkeypatch)
    monkeypatch.setattr(scores, "CORRECT_KERNELS", {"broken": MUTANTS["scale-3%"].fn})
    res = runner.invoke(app, ["mutants", "--size", "tiny", "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert "FAILS CORRECT KERNELS" in res.output and "false failure: broken: bf16 shape" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rule", "strict"], "--rule 'strict' is not allowed; give one or more of peers, flashcheck"),
        (["--rule", "peers,"], "--rule 'peers,' is not allowed"),
        (["--rule", ""], "--rule '' is not allowed"),
        (["--size", "huge"], "--size 'huge' is not allowed; expected one of tiny, quick, full"),
        (["--out", ""], "--out '' is empty"),
        (["--threads", "0"], "--threads 0 is not allowed"),
    ],
)
def test_cli_bad_usage(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["mutants", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "flashcheck-mutants").exists()  # nothing ran
