"""Backends of several frameworks in one `compare --backend` table: torch SDPA, JAX and ONNX Runtime, each at its
format (NAME:FMT), judged by the one baseline rule."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.extras import install_hint

pytest.importorskip("jax", reason="JAX is an optional extra (flashcheck[jax])")
pytest.importorskip("onnxruntime", reason="onnxruntime is an optional extra (flashcheck[onnx])")

LINE = ["compare", "--backend", "sdpa-math,sdpa-flash,jax-xla,onnxruntime:fp16", "--numerics", "bf16"]
SMALL = ["--seq-len", "64", "--heads", "1", "--head-dim", "32"]


def test_one_table_across_frameworks_and_its_json():
    res = CliRunner().invoke(app, [*LINE, *SMALL])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["sdpa-math", "sdpa-flash", "jax-xla", "onnxruntime[Attention]"]
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


def test_a_study_sweep_names_the_new_backends(tmp_path):
    from flashcheck.study.config import StudyConfig, Sweep
    from flashcheck.study.runner import run_study
    from flashcheck.study.store import ResultStore

    sweep = Sweep(question="frameworks", methods=("jax-xla:bf16", "onnxruntime:fp16"), seq_lens=(64,), heads=1)
    run_study(StudyConfig(name="fw", sweeps=(sweep,)), tmp_path, workers=1, quiet=True)
    recs = {(r.case.kernel, r.case.policy): r for r in ResultStore(tmp_path).load().values()}
    assert {k: r.status for k, r in recs.items()} == {
        ("jax-xla", "bf16"): "ok",
        ("onnxruntime", "fp16"): "ok",
        ("eager", "bf16"): "ok",
        ("eager", "fp16"): "ok",
    }
    assert 1e-4 < recs[("onnxruntime", "fp16")].errors["rel_l2"] < recs[("jax-xla", "bf16")].errors["rel_l2"] < 1e-2


def test_backends_and_doctor_list_versions_and_why_one_cannot_run(monkeypatch):
    import importlib.metadata as md

    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(app, ["backends", "--json"]).output)["backends"]}
    assert rows["jax-xla"]["available"] and md.version("jax") in rows["jax-xla"]["version"]
    assert rows["onnxruntime"]["available"] and md.version("onnxruntime") in rows["onnxruntime"]["version"]
    assert rows["sdpa-math"]["version"] is None
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    res = CliRunner().invoke(app, ["backends"])
    line = next(x for x in res.output.splitlines() if x.startswith("│ onnxruntime"))
    assert "│ no " in line and "onnxruntime is not installed" in line and "[onnx]'" in res.output
    doc = json.loads(CliRunner().invoke(app, ["doctor", "--json", "--seq-len", "64"]).output)
    ort = next(b for b in doc["backends"] if b["name"] == "onnxruntime")
    assert not ort["available"] and install_hint("onnx") in ort["reason"] and ort["version"] is None
    jx = next(b for b in doc["backends"] if b["name"] == "jax-xla")
    assert jx["available"] and md.version("jax") in jx["version"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here: jax-cudnn may run")
def test_jax_cudnn_without_a_gpu_names_jaxs_own_devices():
    """Why jax-cudnn cannot run names what jax.devices() sees, not the torch build (JAX has its own devices)."""
    import jax

    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(app, ["backends", "--json"]).output)["backends"]}
    why = rows["jax-cudnn"]["reason"]
    assert not rows["jax-cudnn"]["available"] and "jax.devices()" in why and "torch" not in why, why
    assert f"{jax.devices()[0].platform}:0" in why, why
    doc = json.loads(CliRunner().invoke(app, ["doctor", "--json", "--seq-len", "64"]).output)
    assert next(b for b in doc["backends"] if b["name"] == "jax-cudnn")["reason"] == why
