"""`flashcheck compare`: the JSON contract, the readable table, and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app

runner = CliRunner()
KEYS = {"max_abs", "mean_abs", "rmse", "rel_l2"}


def test_compare_json_contract():
    res = runner.invoke(app, ["compare", "--seq-len", "64", "--heads", "2", "--block-k", "16", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) >= {"config", "candidate", "baseline", "ratio"}
    assert set(out["candidate"]) == set(out["baseline"]) == set(out["ratio"]) == KEYS
    assert out["ratio"]["rmse"] == pytest.approx(out["candidate"]["rmse"] / out["baseline"]["rmse"])
    assert out["config"]["seq_len"] == 64 and out["config"]["candidate_policy"]["p"] == "bf16"


def test_compare_is_reproducible_and_fp64_is_exact():
    args = [
        "compare",
        "--seq-len",
        "48",
        "--heads",
        "2",
        "--numerics",
        "fp64",
        "--block-k",
        "7",
        "--causal",
        "--algorithm",
        "fa1",
        "--json",
    ]
    a, b = (json.loads(runner.invoke(app, args).output) for _ in range(2))
    assert a == b and a["candidate"]["max_abs"] < 1e-12


def test_compare_fp8_flags_and_baseline_policy():
    res = runner.invoke(
        app,
        [
            "compare",
            "--seq-len",
            "64",
            "--heads",
            "2",
            "--numerics",
            "fp8-e4m3-mixed",
            "--baseline-numerics",
            "baseline-fp8",
            "--fp8-scaling",
            "block",
            "--hadamard",
            "--distribution",
            "outliers",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.output)["config"]
    assert cfg["candidate_policy"]["hadamard"] and cfg["candidate_policy"]["fp8_scaling"] == "block"
    assert cfg["baseline_policy"]["name"] == "baseline-fp8"


def test_compare_table():
    res = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1", "--kernel", "standard"])
    assert res.exit_code == 0 and "rel_l2" in res.output and "bf16-mixed" in res.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--numerics", "bf17"], "bf17"),
        (["--block-k", "0"], "block-k"),
        (["--distribution", "cauchy"], "cauchy"),
        (["--kernel", "magic"], "magic"),
        (["--numerics", "bf16,q=fp32"], "q=fp32"),
        (["--seq-len", "-4"], "seq-len"),
        (["--numerics", "fa3-fp8", "--kernel", "standard"], "block"),
        (["--head-dim", "48", "--hadamard"], "power"),
    ],
)
def test_compare_bad_input_exits_2(args, needle):
    res = runner.invoke(app, ["compare", "--seq-len", "16", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "flashcheck.cli", "compare", "--seq-len", "16", "--heads", "1", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["candidate"]["max_abs"] > 0


def test_python_dash_m_flashcheck_is_the_cli():
    """`python -m flashcheck` runs the same app as the `flashcheck` script (help, and exit 2 on bad usage)."""
    out = subprocess.run([sys.executable, "-m", "flashcheck", "--help"], capture_output=True, text=True, check=True)
    assert "compare" in out.stdout and "hunt" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "flashcheck", "nosuch"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error:"), bad.stderr


def test_compare_help_lists_every_kernel_preset():
    """--preset's help is built from the registry: every preset the unknown-preset error lists is in it."""
    import re

    from flashcheck.kernels.sim.presets import KERNEL_PRESETS

    res = runner.invoke(app, ["compare", "--help"])
    text = re.sub(r"-\s+", "-", " ".join(res.output.split()))  # help wraps lines, also after a hyphen
    assert res.exit_code == 0 and all(f" {name}," in text or f" {name} " in text for name in KERNEL_PRESETS), text
