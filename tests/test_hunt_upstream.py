"""Findings a maintainer accepts (issue 45): real backends hunted through their public API, each finding classified
(category, api, a known report), numeric findings shrunk to their onset (a planted bug starting at a known logit is
reported within 2x of it), the API's default scale drawn (a planted padded-head-dim default found), and standalone
reproducers that import only the target's library and numpy (exit 1 while the bug is there, 0 when it is not)."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.hunt import HuntCase, parse_target
from flashcheck.hunt.classify import category, known_report, max_logit
from flashcheck.hunt.judge import evaluate
from flashcheck.hunt.search import annotated, hunt
from flashcheck.hunt.store import Finding

pytest.importorskip("hypothesis")
RUN = dict(budget_s=120.0, seed=0, backward=False, shrink_s=60.0, isolate=False)


def test_a_bug_starting_at_a_known_logit_is_shrunk_to_within_2x_of_it(tmp_path):
    from hunt_bugs import ONSET_LOGIT

    state = hunt(parse_target("hunt_bugs:nan_above_logit"), tmp_path, rounds=2, **RUN)
    nan = [f for f in state.findings if f.kind == "nan"]
    assert nan, [f.to_dict() for f in state.findings]
    f = nan[0]
    assert ONSET_LOGIT < f.max_logit <= 2 * ONSET_LOGIT, f.to_dict()
    assert f.max_logit == pytest.approx(max_logit(f.case)) and f.category == "kernel-bug" and f.api == "public"
    assert not evaluate(parse_target("hunt_bugs:nan_above_logit"), f.case).passed  # the onset case still fails


def test_max_logit_is_the_largest_visible_scaled_logit():
    case = HuntCase(lq=3, lk=5, head_dim=4, scale=7.0, causal=True, seed=3)
    from flashcheck.hunt.case import make_inputs

    q, k, _, _ = make_inputs(case)
    s = (q @ k.transpose(-1, -2)) * 7.0 / 2.0
    keep = torch.ones(3, 5, dtype=torch.bool).tril(2)
    assert max_logit(case) == pytest.approx(float(s[..., keep].abs().max()))


def test_the_default_scale_is_drawn_and_a_padded_head_dim_default_is_found(tmp_path):
    state = hunt(parse_target("hunt_bugs:padded_default_scale"), tmp_path, rounds=3, **RUN)
    found = [f for f in state.findings if f.kind in ("budget", "nan")]
    assert found, [f.to_dict() for f in state.findings]
    case = found[0].case
    d = case.head_dim
    assert case.scale is None and d & (d - 1), case.describe()  # scale=None at a head dim that is no power of two
    assert evaluate(parse_target("hunt_bugs:correct"), case).passed


@pytest.mark.parametrize(
    "name, kind, tensor, case, want",
    [
        ("onnxruntime:fp16", "nan", "out", HuntCase(dtype="fp16", lq=1, lk=1, magnitude=256.0), "format-overflow"),
        ("sdpa-math:fp16", "nan", "out", HuntCase(dtype="fp16", lq=1, lk=1, magnitude=256.0), "kernel-bug"),
        (
            "onnxruntime:fp16",
            "budget",
            "out",
            HuntCase(dtype="fp16", lq=4, lk=4, head_dim=1, scale=8409.0),
            "format-overflow",
        ),
        ("onnxruntime:fp16", "budget", "out", HuntCase(dtype="fp16", lq=4, lk=4, head_dim=1), "kernel-bug"),
        ("sdpa-flash", "budget", "dv", HuntCase(lq=4, lk=4, backward=True), "kernel-bug"),
        ("sdpa-flash", "overflow", "out", HuntCase(), "format-overflow"),
        ("sdpa-flash", "semantics", "out", HuntCase(dead=1), "convention"),
        ("sdpa-flash", "crash", "SIGFPE", HuntCase(lk=0), "crash"),
        ("sdpa-flash", "crash", "hang", HuntCase(), "hang"),
        ("sdpa-math-lowp", "nan", "out", HuntCase(dtype="bf16"), "private-only"),
        ("hunt_bugs:correct", "output", "out", HuntCase(), "target-error"),
        ("fa3-fp8", "budget", "out", HuntCase(dtype="bf16"), "simulated"),  # a preset: nobody's code
        ("fa3-fp8", "crash", "SIGSEGV", HuntCase(dtype="bf16"), "crash"),
    ],
)
def test_each_finding_is_classified(name, kind, tensor, case, want):
    pytest.importorskip("onnxruntime") if name.startswith("onnx") else None
    got, why = category(parse_target(name, load=False), kind, tensor, case)
    assert got == want, (got, why)
    if got == "format-overflow" and kind == "nan":
        assert "ONNX Attention operator (opset 23)" in why and "65504" in why, why


def test_known_reports_match_by_target_kind_and_case():
    hit = known_report("sdpa-flash", "crash", "SIGFPE", HuntCase(lk=0))
    assert hit.startswith("pytorch/pytorch#141219: Floating point exception")
    assert known_report("sdpa-flash", "crash", "SIGFPE", HuntCase(lk=4)) == ""
    assert known_report("jax-xla", "crash", "SIGABRT", HuntCase(lk=0)) == ""


def test_sdpa_targets_call_the_public_function_under_sdpa_kernel(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kw):
        from torch.backends.cuda import flash_sdp_enabled, math_sdp_enabled

        calls.append((flash_sdp_enabled(), math_sdp_enabled(), kw.get("scale")))
        return real(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    target = parse_target("sdpa-flash")
    assert target.api == "public" and "scaled_dot_product_attention under sdpa_kernel" in target.via
    assert evaluate(target, HuntCase(lq=3, lk=5, scale=None, head_dim=24)).passed
    assert calls == [(True, False, None)]  # FLASH only, the default scale passed as None


def _finding(target, case: HuntCase) -> tuple[Finding, tuple[float, float]]:
    out = evaluate(target, case)
    v = next(v for v in out.verdicts if v.tensor == "dv")
    f = Finding("budget", "dv", case, v.where(), v.message, 0.0, 0.0, 0, v.margin)
    return annotated(target, f), v.bounds


def test_upstream_reproducer_of_the_cpu_flash_backward_exits_1_and_0_where_it_holds_not(tmp_path):
    """torch 2.13's CPU flash backward (fp32): dV over the budget at max |logit| ~1e4, its reproducer run without
    flashcheck (python -I: exit 1); the same script for a case of logits ~1, where the kernel is right: exit 0."""
    from flashcheck.hunt import upstream

    target = parse_target("sdpa-flash:fp32")
    bad, bad_bounds = _finding(target, HuntCase(lq=64, lk=64, head_dim=64, scale=3000.0, backward=True, seed=1))
    assert bad.category == "kernel-bug" and bad.max_logit > 5e3 and bad.margin > 1, bad.to_dict()
    good, good_bounds = _finding(target, HuntCase(lq=64, lk=64, head_dim=64, backward=True, seed=1))
    bounds = {id(bad): bad_bounds, id(good): good_bounds}
    done = upstream.write(tmp_path / "up", target, [bad, good], lambda f: bounds[id(f)])
    assert [d["exit"] for d in done] == [1, 0], [d["output"] for d in done]
    text = done[0]["path"].read_text()
    assert "import flashcheck" not in text and "from flashcheck" not in text
    assert "versions: torch " in done[0]["output"] and "same-format reference" in done[0]["output"]
    assert "PRESENT" in done[0]["output"] and "FIXED" in done[1]["output"]
    report = (tmp_path / "up" / "report.md").read_text()
    assert "dv over the error budget at max |logit|" in report and "exit 1" in report


def test_upstream_reproducer_of_a_crash_runs_it_in_a_child(tmp_path):
    """JAX 0.10's bf16 head dim 1 under jit dies of SIGABRT in XLA's YNN emitter: its reproducer exits 1."""
    pytest.importorskip("jax")
    from flashcheck.hunt import upstream

    target = parse_target("jax-xla")
    case = HuntCase(dtype="bf16", lq=64, lk=64, head_dim=1)
    f = annotated(target, Finding("crash", "SIGABRT", case, "the process died of SIGABRT", "", 0, 0, 0, 1.0))
    (done,) = upstream.write(tmp_path / "up", target, [f], lambda f: (math.nan, math.nan))
    assert f.category == "crash" and "jax.nn.dot_product_attention" in done["output"]
    if done["exit"] == 0:
        pytest.fail(f"JAX's bf16 D=1 abort no longer reproduces (fixed upstream?): {done['output']}")
    assert done["exit"] == 1 and "killed its process" in done["output"], done["output"]


@pytest.mark.parametrize("what", ["file", "link", "others", "preset", "callable"])
def test_bad_upstream_is_one_line_exit_2(what, tmp_path):
    target, up = "sdpa-math", tmp_path / "up"
    if what == "file":
        up.write_text("x")
    elif what == "link":
        (tmp_path / "elsewhere").mkdir()
        up.symlink_to(tmp_path / "elsewhere")
    elif what == "others":
        up.mkdir()
        (up / "notes.txt").write_text("mine")
    else:
        target = "fa2-gpu" if what == "preset" else "hunt_bugs:correct"
    args = ["hunt", target, "--out", str(tmp_path / "h"), "--upstream", str(up), "--budget", "1m", "--rounds", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = res.output.strip()
    assert line.startswith("error: --upstream") and "\n" not in line, line
    says = {"file": "is a file", "link": "symbolic link", "others": "holds other files (notes.txt)",
            "preset": "flashcheck's own simulator", "callable": "your own function"}[what]  # fmt: skip
    assert says in line, line
    assert not (tmp_path / "h").exists() or not any((tmp_path / "h").iterdir())
