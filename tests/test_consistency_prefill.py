"""`flashcheck consistency`: batch invariance at prefill lengths (tile boundaries, ragged batches) catches a planted
prefill-only batch dependence that the decode-only batch check misses, and holds for a batch-invariant kernel; each
certificate names its phase in --help, the text output and --json."""

from __future__ import annotations

import json

import torch
from tests import serving_bugs
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.measure.consistency import PHASES, Shape, certify, prefill_lengths

SMALL = Shape(heads=2, kv_heads=1, head_dim=16, kv_len=64, prefill_len=65, dtype=torch.bfloat16)


def _fn(target):
    return lambda q, k, v, causal: target(q, k, v, causal=causal, scale=q.shape[-1] ** -0.5, mask=None)


def test_prefill_only_batch_dependence_is_caught_at_prefill_and_missed_at_decode() -> None:
    certs = {c.check: c for c in certify(_fn(serving_bugs.prefill_batch_dependent), "planted", SMALL,
                                         checks=("batch", "batch-prefill"), max_batch=4)}  # fmt: skip
    assert certs["batch"].holds  # the decode check cannot see it: the bug needs Lq > 1
    pre = certs["batch-prefill"]
    assert not pre.holds and pre.phase == "prefill" and pre.max_abs > 0
    assert set(pre.differing) <= set(prefill_lengths(SMALL.prefill_len)) and pre.first == pre.differing[0]


def test_a_batch_invariant_kernel_holds_every_certificate() -> None:
    certs = certify(_fn(serving_bugs.batch_invariant), "exact rows", SMALL, max_batch=4, runs=2, chunk=16)
    assert [c.check for c in certs] == list(PHASES)
    assert all(c.holds and c.max_abs == 0.0 for c in certs), [c.sentence() for c in certs]
    assert prefill_lengths(65) == [31, 32, 33, 63, 64, 65]  # tile edges up to the prefill length, and it


def test_each_certificate_names_its_phase_in_help_text_and_json() -> None:
    runner = CliRunner()
    helptext = " ".join(runner.invoke(app, ["consistency", "--help"]).output.split()).replace("- ", "-")  # wraps
    for check, phase in PHASES.items():
        assert f"{check} [{phase}]" in helptext
    args = [
        "consistency",
        "tests.serving_bugs:prefill_batch_dependent",
        "--checks",
        "batch,batch-prefill",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--head-dim",
        "16",
        "--kv-len",
        "64",
        "--prefill-len",
        "65",
        "--max-batch",
        "3",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert any(ln.split()[:2] == ["holds", "decode:"] and "batch:" in ln for ln in lines)
    assert any(ln.split()[:2] == ["FAILS", "prefill:"] and "batch-prefill: differs at prefill length" in ln
               for ln in lines)  # fmt: skip
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert [c["phase"] for c in data["certificates"]] == ["decode", "prefill"]
