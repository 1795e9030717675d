"""Backends of several frameworks in one `compare --backend` table: torch SDPA, JAX and ONNX Runtime, each at its
format (NAME:FMT), judged by the one baseline rule."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app

pytest.importorskip("jax", reason="JAX is an optional extra (flashcheck[jax])")
pytest.importorskip("onnxruntime", reason="onnxruntime is an optional extra (flashcheck[onnx])")

LINE = ["compare", "--backend", "sdpa-math,sdpa-flash,jax-xla,onnxruntime:fp16", "--numerics", "bf16"]
SMALL = ["--seq-len", "64", "--heads", "1", "--head-dim", "32"]


def test_one_table_across_frameworks_and_its_json():
    res = CliRunner().invoke(app, [*LINE, *SMALL])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["sdpa-math", "sdpa-flash", "jax-xla", "onnxruntime"]
    assert [r.split("│")[3].strip() for r in rows] == ["bf16", "bf16", "bf16", "fp16"]
    data = json.loads(CliRunner().invoke(app, [*LINE, *SMALL, "--json"]).output)["backends"]
    assert [(r["config"]["backend"], r["status"], r["baseline_impl"]) for r in data] == [
        ("sdpa-math", "ok", "eager:bf16"),
        ("sdpa-flash", "ok", "eager:bf16"),
        ("jax-xla", "ok", "eager:bf16"),
        ("onnxruntime", "ok", "eager:fp16"),
    ]


def test_a_format_after_the_name_is_checked():
    res = CliRunner().invoke(app, ["compare", "--backend", "onnxruntime:fp99", *SMALL])
    assert res.exit_code == 2 and "fp99" in res.output and "Traceback" not in res.output
