"""Serving numerics: FA3 / FlashInfer heuristics, the serving simulator, consistency certificates and their CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backends.serving import sim_target
from flashcheck.cli.app import app
from flashcheck.kernels.serving.attention import exact_attention, serving_attention
from flashcheck.kernels.serving.heuristics import (
    fa3_launch_tile,
    fa3_num_splits,
    fa3_num_splits_heuristic,
    flashinfer_chunk_pages,
    key_spans,
)
from flashcheck.measure.consistency import Shape, batch_invariance, certify, determinism, prefill_decode


def test_fa3_tiles_follow_tile_size_h():
    # FP8 at head dim 128: decode (one MMA warpgroup) kBlockN 96, prefill 192 (vllm#54035's cause)
    assert fa3_launch_tile(1, 32, 8, 128, fp8=True, causal=True) == (64, 96)
    assert fa3_launch_tile(4096, 32, 8, 128, fp8=True, causal=True) == (128, 192)
    # bf16 paged: decode keeps causal at head dim 128 -> kBlockN 128 as the causal prefill (bf16 bit-identical)
    assert fa3_launch_tile(1, 32, 8, 128, fp8=False, causal=True) == (64, 128)
    assert fa3_launch_tile(4096, 32, 8, 128, fp8=False, causal=True) == (128, 128)
    assert fa3_launch_tile(1, 32, 8, 128, fp8=False, causal=True, paged=False) == (64, 176)
    assert fa3_launch_tile(1, 8, 8, 64, fp8=True, causal=True) == (64, 128)
    # 32 query heads per KV head: PackGQA rows 1 * 32 <= 64 still one warpgroup; 3 rows * 32 > 64 not
    assert fa3_launch_tile(3, 32, 1, 128, fp8=True, causal=True) == (128, 192)


def _splits_by_hand(total: int, sms: int, blocks: int) -> int:
    """The 85%-of-best-wave-efficiency rule written out independently (flash-attention heuristics.h's comment)."""
    effs = {s: (total * s / sms) / math.ceil(total * s / sms) for s in range(1, min(128, sms, blocks) + 1)}
    return min(s for s, e in effs.items() if e >= 0.85 * max(effs.values()))


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 9])
def test_fa3_num_splits(batch):
    # decode, 8 KV heads, 1024 keys at kBlockN 128 -> 8 n-blocks; 8 * batch m-blocks on 132 SMs
    got = fa3_num_splits(batch, 1, 1024, 8, 8, 128, fp8=False, causal=True)
    assert got == _splits_by_hand(8 * batch, 132, 8)
    assert fa3_num_splits(14, 1, 1024, 8, 8, 128, fp8=False, causal=True) == 1  # 112 m-blocks >= 0.8 * 132
    assert fa3_num_splits_heuristic(8, 132, 4, 1, 1, False) == 1  # <= 4 n-blocks never split


def test_flashinfer_chunking_depends_on_the_batch_unless_fixed():
    alone = flashinfer_chunk_pages([8192], 8)
    crowded = flashinfer_chunk_pages([8192] * 8, 8)
    assert alone is not None and crowded is not None and alone < crowded  # neighbours change the chunk
    assert flashinfer_chunk_pages([8192] * 40, 8) is None  # a full grid: no split
    assert flashinfer_chunk_pages([8192], 8, fixed_split_pages=64) == 64
    # the chosen chunk is the smallest that keeps the batch's chunks within the grid
    pages = 8192 // 16
    assert math.ceil(pages / alone) * 8 <= 264 < math.ceil(pages / (alone - 1)) * 8


def test_key_spans_visit_last_tile_first():
    assert key_spans(200, 96, 1) == [[(192, 200), (96, 192), (0, 96)]]
    assert key_spans(500, 100, 2) == [[(200, 300), (100, 200), (0, 100)], [(400, 500), (300, 400)]]


def _qkv(lq, lk, d=64, h=2, seed=0, mean=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, h, lq, d, generator=g), torch.randn(1, h, lk, d, generator=g),
            torch.randn(1, h, lk, d, generator=g) + mean)  # fmt: skip


@pytest.mark.parametrize("kv", ["bf16", "fp8", "fp8/calc", "fp8-head", "fp4", "nvfp4", "fp8k-nvfp4v"])
def test_serving_attention_close_to_exact_attention_of_the_same_cache(kv):
    q, k, v = _qkv(8, 300)
    exact = exact_attention(q, k, v, kv, causal=True)
    out, lse = serving_attention(q, k, v, kv=kv, block_n=96, splits=2, round_output=False)
    rel = float((out - exact).norm() / exact.norm())
    # P in e4m3 (3 mantissa bits) over ~300 keys: well under one e4m3 step (2^-4); bf16 P under 2^-8
    assert rel < (2**-5 if kv.startswith("fp8") else 2**-8)
    assert torch.isfinite(lse).all()


def test_splits_and_tiles_change_bits_not_values():
    q, k, v = _qkv(1, 1000, d=128)
    a, _ = serving_attention(q, k, v, kv="bf16", block_n=128, splits=1, round_output=False)
    b, _ = serving_attention(q, k, v, kv="bf16", block_n=128, splits=7, round_output=False)
    assert not torch.equal(a, b) and float((a - b).abs().max()) < 1e-3


def test_vllm_54035_prefill_vs_decode_first_divergence_97_for_fp8_none_for_bf16():
    sh = Shape(heads=1, kv_heads=1, head_dim=128, prefill_len=110)
    fp8 = prefill_decode(sim_target("sim-fa3", "fp8"), "sim-fa3", sh)
    assert not fp8.holds and fp8.first == 97 and min(fp8.differing) == 97
    bf16 = prefill_decode(sim_target("sim-fa3", "bf16"), "sim-fa3", sh)
    assert bf16.holds and bf16.first is None and bf16.max_abs == 0.0


def test_fa1897_batch_variance_with_variable_splits_none_with_fixed():
    sh = Shape(heads=8, kv_heads=8, head_dim=128, kv_len=2048)
    # 16 n-blocks: get_num_splits gives 14 splits at batch 1 (2 blocks each: 8 chunks), 7 at batch 2 (3 blocks
    # each: 6 chunks), so the request's chunks change with its neighbours
    assert [fa3_num_splits(b, 1, 2048, 8, 8, 128, fp8=False, causal=True) for b in (1, 2)] == [14, 7]
    var = batch_invariance(sim_target("sim-fa3", "bf16"), "sim-fa3", sh, max_batch=2)
    assert not var.holds and var.first == 2 and var.max_abs > 0
    fixed = batch_invariance(sim_target("sim-fa3-fixed", "bf16"), "sim-fa3-fixed", sh, max_batch=2)
    assert fixed.holds


def test_certificates_find_a_planted_batch_dependence_and_nondeterminism():
    sh = Shape(heads=2, kv_heads=2, head_dim=16, kv_len=32, prefill_len=8, dtype=torch.float32)

    def batch_dependent(q, k, v, causal):  # one batch entry at a time: SDPA on two threads is not batch-invariant
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = torch.cat([sdpa(q[i : i + 1], k[i : i + 1], v[i : i + 1]) for i in range(q.shape[0])])
        return out * (1 + 1e-3 * (q.shape[0] >= 5))

    cert = batch_invariance(batch_dependent, "planted", sh, max_batch=6)
    assert cert.first == 5 and cert.differing == [5, 6] and cert.max_abs > 0
    noisy = determinism(lambda q, k, v, c: q + torch.rand(()), "noisy", sh, runs=3)
    assert not noisy.holds and noisy.first == 2
    with pytest.raises(ValueError, match="unknown check 'nope'"):
        certify(batch_dependent, "planted", sh, checks=("nope",))


def test_consistency_cli_table_and_user_callable(tmp_path, monkeypatch):
    mod = tmp_path / "my_attn.py"
    mod.write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale, mask):\n"
        "    assert mask is None and abs(scale - q.shape[-1] ** -0.5) < 1e-12\n"
        "    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)\n"
        "def old(q, k, v, causal=False):\n"
        "    return q\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    args = ["--max-batch", "3", "--kv-len", "64", "--prefill-len", "24", "--chunk", "8", "--runs", "2"]
    res = runner.invoke(app, ["consistency", "sdpa-math", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "consistency of sdpa-math: H=4 Hkv=4 D=64 bf16" in res.output
    assert "holds  decode:            batch: bit-identical over 2 comparisons [decode, KV length 64]" in res.output
    saved = json.loads((tmp_path / "o" / "summary.json").read_text())
    checks = ["determinism", "batch", "batch-prefill", "prefill-decode", "chunked"]
    assert [c["check"] for c in saved["certificates"]] == checks
    res = runner.invoke(app, ["consistency", "my_attn:attn", "--checks", "batch", *args])
    assert res.exit_code == 0 and "holds  decode:            batch:" in res.output
    res = runner.invoke(app, ["consistency", "sim-fa3", "--kv", "fp8", "--checks", "prefill-decode",
                              "--head-dim", "128", "--heads", "1", "--prefill-len", "100"])  # fmt: skip
    assert res.exit_code == 1
    assert "FAILS  prefill vs decode: prefill-decode: differs from KV length 97 on" in res.output
    res = runner.invoke(app, ["consistency", "sim-fa3-fixed", "--kv", "fp8", "--checks", "prefill-decode",
                              "--head-dim", "128", "--heads", "1", "--prefill-len", "100"])  # fmt: skip
    assert res.exit_code == 1 and "FAILS  prefill vs decode: prefill-decode: differs from KV length 97" in res.output
    assert "'fixed' fixes the split count only, not the tile width: decode visits the keys in tiles of kBlockN 96, " \
           "the prefill in tiles of 192" in res.output  # fmt: skip
    for bad, msg in ((["my_attn:nope"], "cannot load 'my_attn:nope'"), (["sim-fa9"], "unknown target 'sim-fa9'"),
                     (["nosuch"], "a simulator (sim-fa3, sim-fa3-fixed, sim-flashinfer, sim-flashinfer-fixed) or a "
                                  "'module:function'"),
                     (["my_attn:old"], "'my_attn:old' does not take scale, mask; expected function(q, k, v, *, "),
                     (["sdpa-math", "--dtype", "fp7"], "--dtype 'fp7' is not allowed"),
                     (["sim-fa3", "--kv", "fp3"], "unknown KV-cache scheme 'fp3'")):  # fmt: skip
        res = runner.invoke(app, ["consistency", *bad])
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output


def test_haystack_needle_margin_and_bf16_long_context_error_small():
    from flashcheck.measure.longcontext import haystack, measure_cell

    q, k, v, pos = haystack(2048, 32, 2, values="shared-mean", needle="late")
    s = (q @ k.transpose(-1, -2)).squeeze(-2) * 32**-0.5  # [1, H, L]
    rest = torch.cat([s[..., :pos], s[..., pos + 1 :]], dim=-1).amax(-1)
    assert pos == int(2048 * 0.9) and torch.allclose(s[..., pos] - rest, torch.full_like(rest, 6.0), atol=1e-4)
    assert float(v.mean()) == pytest.approx(1.0, abs=0.01)
    rows = measure_cell("bf16", 2048, heads=2)
    assert len(rows) == 6 and all(r.rel_err < 2**-8 for r in rows)  # bf16 P over 2k keys: under one bf16 step
    with pytest.raises(ValueError, match="unknown variant 'fp9'"):
        measure_cell("fp9", 1024)


def test_one_level_fp8_accumulation_loses_the_shared_mean_haystack_two_level_does_not():
    pytest.importorskip("flashcheck.kernels.tensorcore.mma")
    from flashcheck.measure.longcontext import measure_cell

    cells = {(var, n): measure_cell(var, n, heads=1) for var, n in
             (("fp8-1level", 512), ("fp8-1level", 2048), ("fp8-2level", 2048), ("b200", 2048))}  # fmt: skip

    def err(variant, n, values="shared-mean"):
        return next(r.rel_err for r in cells[variant, n] if r.values == values and r.needle == "late")

    one_short, one_long, two_long = err("fp8-1level", 512), err("fp8-1level", 2048), err("fp8-2level", 2048)
    assert one_long > 1.5 * one_short  # grows with the context
    assert one_long > 10 * two_long and two_long < 4e-3  # two-level accumulation removes it
    assert err("fp8-1level", 2048, "zero-mean") < one_long / 10  # zero-mean values hide it
    assert err("b200", 2048) < 4e-3  # c added in fp32 (B200): no collapse


def test_study_serving_tiny_answer_first_and_resumes(tmp_path):
    from flashcheck.questions.serving.tasks import mma_missing

    out = tmp_path / "st"
    runner = CliRunner()
    res = runner.invoke(app, ["study", "--preset", "serving-tiny", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "18 units run, 0 kept from before" in res.output
    lines = res.output.splitlines()
    answer = lines[lines.index("Answer") + 1 :]
    assert answer[0].startswith("- Is an FP8 / FP4 KV cache safe at long context?")
    assert "bf16: the kernel's accumulation is safe" in answer[0]
    assert "sim-fa3 varies from batch size 2 (splits at batch 1..2: 14, 7), sim-fa3-fixed invariant" in answer[1]
    assert "fp8 differs from KV length 97 on, bf16 bit-identical" in answer[2]
    report = (out / "report.md").read_text()
    assert report.index("## Answer") < report.index("## Published figures") < report.index("## Long context")
    assert "91% / 13% / 89%" in report and "What a kernel-level error can and cannot say" in report
    cells = {c.strip() for ln in report.splitlines() if ln.startswith("|") for c in ln.strip("|").split(" | ")}
    assert not {"True", "False", "None"} & cells and "holds" in cells  # the certificates' table reads as words
    if mma_missing():
        assert "fp8-1level" not in answer[0] and "Not measured" in report
    else:
        assert "fp8-1level: the kernel's accumulation is degraded" in answer[0] or \
            "fp8-1level: the kernel's accumulation is collapses" in answer[0]  # fmt: skip
        assert "fp8-2level: the kernel's accumulation is safe" in answer[0]
    res = runner.invoke(app, ["study", "--preset", "serving-tiny", "--out", str(out), "--quiet"])
    assert res.exit_code == 0 and "0 units run, 18 kept from before" in res.output
    assert json.loads((out / "summary.json").read_text())["answer"][0].startswith("Is an FP8")
    res = runner.invoke(app, ["report", str(out)])  # rebuilt from the stored units, computing nothing
    assert res.exit_code == 0 and "Answer" in res.output.splitlines() and "- Batch invariance" in res.output
    from flashcheck.study.registry import solo_set

    assert solo_set("serving").name == solo_set("serving-tiny").name == "serving"  # registered with the engine


def test_captured_values_haystack():
    pytest.importorskip("transformers")
    from flashcheck.measure.longcontext import haystack, measure_cell

    q, k, v, pos = haystack(512, 32, 2, values="captured", needle="early")
    s = (q @ k.transpose(-1, -2)).squeeze(-2) * 32**-0.5
    rest = torch.cat([s[..., :pos], s[..., pos + 1 :]], dim=-1).amax(-1)
    assert torch.allclose(s[..., pos] - rest, torch.full_like(rest, 6.0), atol=1e-3)
    # real values share a mean component: the mean row is a sizeable part of a row
    assert float(v.mean(dim=-2).norm(dim=-1).min()) > 0.1 * float(v.norm(dim=-1).mean())
    rows = measure_cell("bf16", 512, heads=2, values=("captured",))
    assert [r.values for r in rows] == ["captured"] * 3 and all(r.rel_err < 2**-8 for r in rows)


def test_serving_and_consistency_refuse_linked_outputs_before_running(tmp_path):
    runner = CliRunner()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("serving", "report.md", "summary.json", "serving.json", "report.html"):
        out = tmp_path / f"ss-{name}"
        out.mkdir()
        (out / name).symlink_to(elsewhere / name)
        res = runner.invoke(app, ["study", "--preset", "serving-tiny", "--out", str(out), "--quiet"])
        assert res.exit_code == 2 and "symbolic link" in res.output and "Traceback" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and list(elsewhere.iterdir()) == []
        assert sorted(p.name for p in out.iterdir()) == [name]  # nothing ran
    cs = tmp_path / "cs"
    cs.mkdir()
    (cs / "summary.json").symlink_to(elsewhere / "summary.json")
    res = runner.invoke(app, ["consistency", "sdpa-math", "--checks", "nope", "--out", str(cs)])
    assert res.exit_code == 2 and "symbolic link" in res.output and "unknown check" not in res.output
    assert list(elsewhere.iterdir()) == []


def test_serving_answer_prints_short_lengths_exactly_and_gives_verdicts_at_matched_conditions_only():
    from flashcheck.questions.serving.report import _published, answer

    def cell(err: float, cache: float) -> dict:
        rows = [{"values": v, "needle": nd, "rel_err": err, "cache_err": cache} for v in ("shared-mean", "zero-mean")
                for nd in ("early", "late", "absent")]  # fmt: skip
        return {"status": "ok", "rows": rows}

    units = {"longctx-bf16-512": cell(1.1e-4, 0.0), "longctx-fp4-512": cell(2e-3, 0.18)}
    text = answer(units)[0]
    assert "worst shared-mean error 0.00011 at 512 keys" in text and "at 0k" not in text
    assert "fp4: the kernel's accumulation is safe" in text
    assert "the cache format itself is not safe: it moves the exact output by up to 0.18" in text
    rows = _published(units)
    assert "at 512 keys, shared-mean" in rows[0][2]
    assert rows[0][3] == rows[1][3] == "unlike conditions: no verdict"
    n = 128 * 1024
    matched = {f"longctx-{v}-{n}": cell(e, 0.0) for v, e in (("bf16", 1e-4), ("fp8-1level", 0.2),
                                                              ("fp8-2level", 1e-3), ("b200", 1e-3))}  # fmt: skip
    assert [r[3] for r in _published(matched)[:2]] == ["agrees", "agrees"]


def test_serving_units_are_checked_against_their_schema():
    from flashcheck.questions.serving.schema import check_unit

    row = {"variant": "bf16", "kv_len": 1024, "values": "zero-mean", "needle": "late", "rel_err": float("nan"),
           "rel_err_max": 0.0, "cos_needle": 1.0, "cos_needle_exact": 1.0, "heads": 2, "seconds": 0.1}  # fmt: skip
    cert = {"check": "batch", "target": "sdpa-math", "holds": True, "unit": "batch size", "first": None,
            "max_abs": 0.0, "compared": 3}  # fmt: skip
    good = {"longctx-bf16-1024": {"status": "ok", "rows": [row]}, "cert-sdpa-math": {"certificates": [cert]},
            "fa1897-sim-fa3": {**cert, "launch": ["splits", [1, 2]]}, "captured-b200-512": {"status": "skipped",
            "reason": "no MMA model"}}  # fmt: skip
    for name, data in good.items():
        assert check_unit(name, data, name) is data
    short = {k: v for k, v in row.items() if k != "rel_err"}
    bad = [
        ("longctx-bf16-1024", {"status": "ok", "rows": [short]}, "'rel_err'"),
        ("longctx-bf16-1024", {"status": "done"}, "'status'"),
        ("cert-sdpa-math", {"certificates": [{**cert, "first": "3"}]}, "'first'"),
        ("fa1897-sim-fa3", {**cert, "launch": ["splits", ["x"]]}, "'launch'"),
        ("vllm54035-fp8", [cert], "JSON object"),
        ("longctx-nosuch-1024", {"status": "ok"}, "not a unit"),
    ]
    for name, data, says in bad:
        with pytest.raises(ValueError, match=says):
            check_unit(name, data, name)


def test_consistency_never_overwrites_a_study_summary(tmp_path):
    study = tmp_path / "T"
    study.mkdir()
    (study / "summary.json").write_text('{"findings": []}')
    res = CliRunner().invoke(app, ["consistency", "sdpa-math", "--checks", "batch", "--out", str(study)])
    assert res.exit_code == 2 and "holds summary.json" in res.output, res.output
    assert (study / "summary.json").read_text() == '{"findings": []}'
