"""Golden files recorded before the measurement-layer restructuring (commit 2ac4384): `compare`, `compare
--backend`, `explain` and the tiny study give the same numbers to the last bit, except the backends
question's ratios, which now follow the one baseline rule (eager PyTorch in the same dtype)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app

GOLDEN = Path(__file__).parent / "golden"
runner = CliRunner()


def _json(args: list[str]) -> dict | list:
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def _same(new, old, path="") -> None:
    """Every number in `old` equals the number at the same place in `new` (to 1e-9 relative; NaN equals NaN)."""
    if isinstance(old, dict):
        for key, val in old.items():
            assert key in new, f"{path}/{key} missing"
            _same(new[key], val, f"{path}/{key}")
    elif isinstance(old, list):
        assert len(new) == len(old), path
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            _same(a, b, f"{path}[{i}]")
    elif isinstance(old, float):
        # 1e-9 relative: float64 reductions (torch.mean) split by thread scheduling differ in the last bits from
        # run to run on the same code (seen: baseline mean_abs 0.012792099093552093 vs ...094054134)
        same = (math.isnan(old) and math.isnan(new)) or math.isclose(new, old, rel_tol=1e-9, abs_tol=0.0)
        assert same, f"{path}: {new!r} != golden {old!r}"
    else:
        assert new == old, f"{path}: {new!r} != golden {old!r}"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("compare_bf16_fa1", "--numerics bf16 --algorithm fa1 --block-q 16 --block-k 16 --seq-len 256 --heads 2"),
        ("compare_fp16mixed_causal", "--numerics fp16-mixed --seq-len 256 --heads 2 --causal"),
        (
            "compare_fp8",
            "--numerics fa3-fp8 --baseline-numerics baseline-fp8 --distribution outliers --seq-len 256 --heads 2",
        ),
    ],
)
def test_compare_golden(name: str, args: str) -> None:
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    _same(_json(["compare", *args.split()]), golden)


def test_compare_backends_golden() -> None:
    golden = json.loads((GOLDEN / "compare_backends.json").read_text())
    args = "compare --backend sdpa-math,sdpa-math-lowp,sdpa-flash,sim-flash --preset torch-cpu-flash "
    args += "--numerics bf16,fp16 --seq-len 128 --heads 2 --backward --device cpu"
    new = _json(args.split())
    rows = new["backends"] if isinstance(new, dict) else new
    assert len(rows) == len(golden)
    for row, old in zip(rows, golden, strict=True):
        assert (row["config"]["backend"], row["config"]["numerics"], row["status"]) == (
            old["backend"],
            old["numerics"],
            old["status"],
        )
        if old["status"] == "ok":
            keys = ("candidate", "baseline", "vs_rounded_inputs", "grad")
            _same({k: row[k] for k in keys}, {k: old[k] for k in keys})


def test_explain_golden(tmp_path) -> None:
    golden = json.loads((GOLDEN / "explain.json").read_text())
    args = ["explain", "--preset", "torch-cpu-flash", "--numerics", "bf16", "--seq-len", "256", "--heads", "2", "--out"]
    new = _json([*args, str(tmp_path)])
    _same(
        {k: new[k] for k in ("full", "alone", "raised", "dominant_stage", "policy")},
        {k: golden[k] for k in ("full", "alone", "raised", "dominant_stage", "policy")},
    )


def _key(c: dict) -> str:
    return (
        f"{c['kernel']}:{c['policy']} {c['algorithm']} {c['block_q']}x{c['block_k']} L={c['seq_len']} "
        f"D={c['head_dim']} H={c['heads']} {c['distribution']} causal={c['causal']} seed={c['seed']}"
    )


@pytest.mark.slow
def test_study_tiny_golden(tmp_path) -> None:
    """Every simulator case of the tiny study has the same errors; findings the same, but the backends
    question's (its baseline changed to eager PyTorch in the dtype)."""
    res = runner.invoke(app, ["study", "--preset", "tiny", "--out", str(tmp_path / "s"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    golden = json.loads((GOLDEN / "study_tiny_records.json").read_text())
    new = {}
    for line in (tmp_path / "s" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        new[_key(r["case"])] = r
    for key, old in golden.items():
        if old["status"] != "ok" or key.split(":")[0] not in ("flash", "standard"):
            continue
        assert key in new, key
        _same(
            {"errors": new[key]["errors"], "errors_rounded": new[key]["errors_rounded"]},
            {
                "errors": old["errors"],
                "errors_rounded": old["errors_rounded"],
            },
        )
    findings = {f["id"]: f for f in json.loads((tmp_path / "s" / "summary.json").read_text())["findings"]}
    for f in json.loads((GOLDEN / "study_tiny_findings.json").read_text()):
        if f["id"].startswith("backend"):
            continue
        assert f["id"] in findings
        assert findings[f["id"]]["measured"] == f["measured"]
