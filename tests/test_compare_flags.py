"""`flashcheck compare`'s decoding and backward flags (--splits, --backward in simulator mode, --delta-source,
--ds-correction): the printed numbers are the engine's on the same InputSpec, the flags reach the kernels
(checked against FP64 closed cases), and bad values exit 2 with one line."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.inputs import InputSpec
from flashcheck.kernels.sim.decode import split_spans
from flashcheck.measure.compare import CompareConfig, run_compare

runner = CliRunner()
BLOCKS = ["--block-q", "16", "--block-k", "16"]


def _human(args: list[str]):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, f"{args}: exit {res.exit_code}\n{res.output}\n{res.exception!r}"
    assert "Traceback" not in res.output and "\x1b[" not in res.output, res.output
    return res


def _row(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line)[1:-1]]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no table row {first!r}:\n{output}")


def _one_line(output: str, *parts: str) -> str:
    lines = [ln for ln in output.splitlines() if all(p in ln for p in parts)]
    assert len(lines) == 1, f"{parts} not together on one line:\n{output}"
    return lines[0]


# ---- --splits: split-KV decoding beside flash -------------------------------------------------------

DECODE = ["--causal", "--heads", "2", "--kv-heads", "1", "--seq-len", "4", "--seq-len-k", "96", *BLOCKS]
DECODE_SPEC = InputSpec(heads=2, kv_heads=1, seq_len=4, seq_len_k=96)


def _engine(kernel: str, splits: int | None = None, **kw):
    cfg = CompareConfig(kernel=kernel, splits=splits, causal=True, block_q=16, block_k=16, inputs=DECODE_SPEC, **kw)
    return run_compare(cfg)


def test_splits_rows_are_the_engines_numbers():
    res = _human(["compare", *DECODE, "--splits", "1,4,6"])
    _one_line(res.output, "split-KV decoding S=1,4,6 and flash [bf16-mixed] vs standard [bf16-mixed]", "Lk=96")
    flash = _engine("flash")
    assert _row(res.output, "flash")[3] == f"{flash.candidate['rel_l2']:.3e}"
    assert _row(res.output, "standard")[3] == f"{flash.baseline['rel_l2']:.3e}"
    for s in (1, 4, 6):
        rec = _engine("splitkv", s)
        cells = _row(res.output, f"splitkv S={s}")
        # 96 keys in blocks of 16: 6 blocks, so S=4 gives 3 chunks of 2 blocks and S=6 gives 6 (S=7: exit 2)
        assert cells[1] == str(len(split_spans(96, s, 16))) == {1: "1", 4: "3", 6: "6"}[s]
        assert cells[2:5] == [
            f"{rec.candidate['max_abs']:.3e}",
            f"{rec.candidate['rel_l2']:.3e}",
            f"{rec.ratio['rel_l2']:.3f}",
        ]
        assert cells[5] == f"{rec.candidate['rel_l2'] / flash.candidate['rel_l2']:.3f}"
        assert cells[6] == f"{rec.candidate_rounded['rel_l2']:.3e}"
    # one chunk is the flash kernel bit for bit (kernels.sim.decode), and the table says so
    assert _row(res.output, "splitkv S=1")[2:] == _row(res.output, "flash")[2:]
    assert res.stderr.splitlines()[-1].startswith("compare 4/4, ") and res.stderr.endswith("splitkv S=6\n")


def test_splits_json_lists_each_comparison():
    res = runner.invoke(app, ["compare", *DECODE, "--splits", "2,4", "--numerics", "bf16", "--json"])
    assert res.exit_code == 0, res.output
    comps = json.loads(res.stdout)["comparisons"]
    assert [(c["config"]["kernel"], c["config"]["splits"]) for c in comps] == [
        ("flash", None),
        ("splitkv", 2),
        ("splitkv", 4),
    ]
    assert comps[2]["config"]["chunks"] == 3 and comps[2]["config"]["seq_len_k"] == 96
    assert comps[1]["candidate"] == _engine("splitkv", 2, numerics="bf16").candidate


def test_splits_in_fp64_equal_the_reference():
    res = runner.invoke(app, ["compare", *DECODE, "--splits", "3,5", "--numerics", "fp64", "--json"])
    assert res.exit_code == 0, res.output
    assert all(c["candidate"]["max_abs"] < 1e-12 for c in json.loads(res.stdout)["comparisons"])


# ---- --backward in simulator mode, --delta-source, --ds-correction ----------------------------------

BACKWARD = ["--backward", "--causal", "--heads", "2", "--seq-len", "48", *BLOCKS]
BACKWARD_SPEC = InputSpec(heads=2, seq_len=48)


def _grads(numerics: str = "bf16-mixed", **knobs) -> dict:
    cfg = CompareConfig(numerics=numerics, inputs=BACKWARD_SPEC, causal=True, block_q=16, block_k=16, backward=True)
    return run_compare(dataclasses.replace(cfg, **knobs)).grad


@pytest.mark.parametrize(
    "flags,knobs",
    [
        ([], {}),
        (["--delta-source", "unrounded"], {"delta_source": "unrounded"}),
        (["--delta-source", "fresh", "--ds-correction"], {"delta_source": "fresh", "ds_correction": True}),
    ],
)
def test_backward_rows_are_the_engines_numbers(flags, knobs):
    res = _human(["compare", *BACKWARD, *flags])
    on = "on" if knobs.get("ds_correction") else "off"
    heading = ", ".join(["bf16-mixed", *(f"delta_source={v}" if k == "delta_source" else k for k, v in knobs.items())])
    _one_line(res.output, f"flash [{heading}] vs standard [bf16-mixed]")  # the knobs in the first heading too
    _one_line(
        res.output, "gradients vs FP64", f"delta_source={knobs.get('delta_source', 'forward')}, ds_correction={on}"
    )
    grads = _grads(**knobs)
    if knobs:  # the knob changes the flash backward's gradients: a flag that did not reach it would show here
        assert grads["dq"]["candidate"] != _grads()["dq"]["candidate"]
    for name in ("dq", "dk", "dv"):
        g = grads[name]
        expected = [
            f"{g['candidate']['rel_l2']:.3e}",
            f"{g['baseline']['rel_l2']:.3e}",
            f"{g['ratio']['rel_l2']:.3f}",
            f"{g['candidate']['max_abs']:.3e}",
            f"{g['baseline']['max_abs']:.3e}",
            f"{g['ratio']['max_abs']:.3f}",
        ]
        assert _row(res.output, name)[1:] == expected, res.output
    assert _row(res.output, "rel_l2")[1]  # the forward table is still there


def test_delta_source_flag_reaches_the_kernel():
    """Only the output rounded (bf16): delta from the unrounded O gives dQ exact to FP64, the forward's rounded
    O does not (arXiv 2609.39813's point, a closed case)."""
    dq = {}
    for source in ("unrounded", "forward"):
        args = ["compare", *BACKWARD, "--numerics", "fp64,output=bf16", "--delta-source", source, "--json"]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        dq[source] = json.loads(res.stdout)["grad"]["dq"]["candidate"]["max_abs"]
    assert dq["unrounded"] < 1e-12 < 1e-6 < dq["forward"]


def test_backward_in_fp64_equals_the_reference_with_padding_and_gqa():
    args = ["compare", *BACKWARD, "--numerics", "fp64", "--kv-heads", "1", "--batch", "2", "--padding", "left:0.25"]
    res = runner.invoke(app, [*args, "--ds-correction", "--json"])
    assert res.exit_code == 0, res.output
    grad = json.loads(res.stdout)["grad"]
    assert all(g[who]["max_abs"] < 1e-12 for g in grad.values() for who in ("candidate", "baseline"))


# ---- bad values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--splits", "0"], "--splits '0' is not allowed; give positive integers"),
        (["--splits", "2,,4"], "--splits '2,,4' is not allowed"),
        (["--splits", "4", "--backward"], "forward only; drop --backward"),
        (["--splits", "4", "--kernel", "standard"], "drop --kernel standard"),
        (["--kernel", "splitkv", "--backward"], "forward only; drop --backward"),
        (
            ["--delta-source", "foo", "--backward"],
            "--delta-source 'foo' is not allowed; expected one of forward, unrounded, fresh",
        ),
        (["--ds-correction"], "--ds-correction is one of the settings of the backward pass; add --backward"),
        (["--delta-source", "fresh"], "--delta-source is one of the settings of the backward pass; add --backward"),
        (["--ds-correction", "--backward", "--kernel", "standard"], "flash kernel's backward; drop --kernel standard"),
        (["--backend", "sdpa-math", "--splits", "4"], "--splits is one of the settings of the simulators"),
        (["--determinism"], "--determinism needs --backend"),
        (  # decoding queries sit at the end of the keys, which right padding removes: nothing to measure
            ["--seq-len", "4", "--seq-len-k", "96", "--batch", "2", "--padding", "right:0.25", "--splits", "1"],
            "padding 'right:0.25' leaves no query row a visible key (seq_len=4, seq_len_k=96)",
        ),
    ],
)
def test_bad_values_exit_2_with_one_line(flags, message):
    res = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1", *flags])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


# ---- progress of the backend cases ------------------------------------------------------------------


def test_backend_progress_names_the_case_running_then_the_case_done(monkeypatch):
    """A long case is not silent: before it runs the bar's note (a plain line when due) names it."""
    from contextlib import contextmanager

    import flashcheck.cli.compare as cli_compare
    from flashcheck.measure.compare import BackendCase

    calls: list[tuple[int, str]] = []

    @contextmanager
    def recording(total, label, as_json=False):
        yield lambda n=1, note="": calls.append((n, note))

    monkeypatch.setattr(cli_compare, "_progress", recording)
    cases = [BackendCase(backend="eager", inputs=InputSpec(heads=1, seq_len=n)) for n in (16, 32)]
    results = cli_compare._run_all(cases, "cpu", as_json=False)
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert calls == [
        (0, "running eager bf16 L=16"),
        (1, "eager bf16 L=16"),
        (0, "running eager bf16 L=32"),
        (1, "eager bf16 L=32"),
    ]


# ---- padding: candidate and baseline over the same visible rows --------------------------------------------


@pytest.mark.parametrize("padding,batch", [("right:0.99", 1), ("left:0.5", 2)])
def test_padded_errors_and_ratios_are_over_the_visible_rows_of_both(padding, batch):
    """Both errors, and so their ratio, count only the query rows with a visible key (once the baseline counted
    every row: mean_abs ratio L, rmse ratio sqrt(L) at right:0.99); checked against the kernels, the FP64
    reference and the metrics computed here on those rows."""
    from flashcheck.core.inputs import make_mask, make_qkv
    from flashcheck.kernels import flash_attention, reference_attention, standard_attention

    shape = dict(batch=batch, heads=1, seq_len=64, head_dim=16, padding=padding)
    args = ["compare", "--padding", padding, "--seq-len", "64", "--heads", "1", "--batch", str(batch)]
    res = runner.invoke(app, [*args, "--head-dim", "16", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    spec = InputSpec(**shape)
    q, k, v = make_qkv(spec)
    mask = make_mask(spec)
    rows = mask.any(-1)  # [B, 1, Lq]: query rows with a visible key
    assert 0 < int(rows.sum()) < rows.numel()
    ref = reference_attention(q, k, v, mask=mask)[rows]
    outs = {
        "candidate": flash_attention(q, k, v, policy="bf16-mixed", mask=mask)[rows],
        "baseline": standard_attention(q, k, v, policy="bf16-mixed", mask=mask)[rows],
    }
    want = {}
    for who, out in outs.items():
        d = (out - ref).double()
        want[who] = {
            "max_abs": float(d.abs().max()),
            "mean_abs": float(d.abs().mean()),
            "rmse": float(d.pow(2).mean().sqrt()),
            "rel_l2": float(d.norm() / ref.norm()),
        }
        assert got[who] == pytest.approx(want[who], rel=1e-9), who
    ratio = {m: want["candidate"][m] / want["baseline"][m] for m in want["candidate"]}
    assert got["ratio"] == pytest.approx(ratio, rel=1e-9)


def test_no_hadamard_turns_a_policys_hadamard_off_and_the_heading_says_so():
    """fa3-fp8 has Hadamard on: --no-hadamard must turn it off (it was ignored), --hadamard turn it on for a
    policy without it; the heading names what differs from the named policy."""

    fp8 = ["compare", "--numerics", "fa3-fp8", "--baseline-numerics", "baseline-fp8", "--seq-len", "64"]
    own = run_compare(CompareConfig(numerics="fa3-fp8", baseline_numerics="baseline-fp8", inputs=InputSpec(seq_len=64)))
    off_cfg = CompareConfig(
        numerics="fa3-fp8", baseline_numerics="baseline-fp8", inputs=InputSpec(seq_len=64), hadamard=False
    )
    off = run_compare(off_cfg)
    assert off_cfg.candidate_policy().hadamard is False and off.candidate != own.candidate
    res = _human([*fp8, "--no-hadamard"])
    _one_line(res.output, "flash [fa3-fp8, no hadamard] vs standard [baseline-fp8]")
    assert _row(res.output, "rel_l2")[1] == f"{off.candidate['rel_l2']:.3e}"
    _one_line(_human(fp8).output, "flash [fa3-fp8] vs standard [baseline-fp8]")
    _one_line(_human(["compare", "--seq-len", "64", "--hadamard"]).output, "flash [bf16-mixed, hadamard] vs")


def test_fp8_scaling_on_a_policy_without_fp8_inputs_is_refused():
    res = runner.invoke(app, ["compare", "--seq-len", "64", "--fp8-scaling", "block"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--fp8-scaling block: the candidate policy 'bf16-mixed' has no FP8 inputs to scale" in res.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here: sdpa-cudnn may run")
def test_compare_where_every_case_is_skipped_prints_the_reasons_alone_and_exits_2():
    """A GPU-only backend on the CPU: no empty table, one line with the reason, exit 2 (cannot run here);
    beside a backend that ran, the skipped one is a line under the table and the exit code is 0."""
    res = runner.invoke(app, ["compare", "--backend", "sdpa-cudnn", "--seq-len", "32", "--heads", "1"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sdpa-cudnn bf16 L=32 on ") and "skipped" in lines[0], (
        res.output
    )
    both = runner.invoke(app, ["compare", "--backend", "sdpa-math,sdpa-cudnn", "--seq-len", "32", "--heads", "1"])
    assert both.exit_code == 0 and "sdpa-math" in both.output, both.output
    assert both.output.strip().splitlines()[-1].startswith("sdpa-cudnn bf16 L=32"), both.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here: sdpa-efficient may run")
def test_a_backend_that_cannot_run_here_is_an_error_line_like_every_exit_2():
    """Every case skipped: the reason is the one `error: ...` line on stderr (it was a bare line), nothing on stdout;
    with --json the result stays JSON on stdout."""
    res = runner.invoke(app, ["compare", "--backend", "sdpa-efficient", "--seq-len", "64"])
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr.startswith("error: sdpa-efficient bf16 L=64 on cpu: skipped, runs on a CUDA GPU only"), res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    as_json = runner.invoke(app, ["compare", "--backend", "sdpa-efficient", "--seq-len", "64", "--json"])
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["status"] == "skipped", as_json.output


def test_a_preset_that_fails_says_why_and_prints_every_metric():
    """compare --preset: the metrics plain compare prints (mean-abs, RMSE, vs FP64 of the rounded inputs) and,
    when the budget fails, one line naming the failed check, its bound and the baseline it came from."""
    res = runner.invoke(app, ["compare", "--preset", "sage2", "--seq-len", "64", "--heads", "1", "--head-dim", "16"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    for metric in ("max_abs", "mean_abs", "rmse", "rel_l2"):
        assert re.search(rf"│ {metric}\s+│ \d\.\d{{3}}e-\d\d", res.output), res.output
    assert "vs FP64 of rounded inputs" in res.output
    why = [ln for ln in res.output.splitlines() if "FAIL (peers rule)" in ln]
    assert len(why) == 1 and "eager:fp16's error" in why[0] and "preset sage2" in why[0], res.output
    assert "--baseline-numerics" in why[0], res.output


def test_a_block_scaled_fp8_policy_is_divided_by_baseline_fp8():
    """The one baseline rule for FP8: `--numerics fa3-fp8` (per-block scales, which the standard kernel cannot)
    is divided by standard:baseline-fp8 (it was refused, asking for --baseline-numerics); a given baseline stays."""
    from flashcheck.measure.compare import CompareConfig

    assert CompareConfig(numerics="fa3-fp8").baseline_policy().name == "baseline-fp8"
    assert CompareConfig(numerics="fa3-fp8", baseline_numerics="fp32").baseline_policy().name == "fp32"
    assert CompareConfig(numerics="bf16-mixed").baseline_policy().name == "bf16-mixed"
