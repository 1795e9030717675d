"""`validate --impls eager,sim:NAME`: simulated kernels as a model's attention (tiny BERT and a Llama-style GQA
decoder built from configs; no download): registration, the per-layer isolated / propagated / predicted errors,
greedy agreement and KL for decoders, the Answer lines and the figure, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from tests.test_validate import _save, _tokenizer

from flashcheck.cli import app
from flashcheck.validate import sim_impl

runner = CliRunner()
FAST = ("--samples", "4", "--max-length", "16", "--quiet")


def _bert(folder: Path, hidden: int = 32, heads: int = 4) -> Path:
    from transformers import BertConfig, BertModel

    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                     intermediate_size=64, max_position_embeddings=96, pad_token_id=0)  # fmt: skip
    return _save(BertModel(cfg).eval(), tok, folder)


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return _bert(tmp_path_factory.mktemp("sim_bert"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """Llama-style decoder with grouped-query attention (4 query heads, 2 K/V heads, head dim 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=96, pad_token_id=0,
                      eos_token_id=4, bos_token_id=2, initializer_range=0.2)  # fmt: skip
    return _save(LlamaForCausalLM(cfg).eval(), tok, tmp_path_factory.mktemp("sim_llama"))


def _invoke(*args: str):
    res = runner.invoke(app, ["validate", *args])
    assert "Traceback" not in res.output, res.output
    return res


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_a_kernel_in_fp32_policy_reproduces_eager(which: str, bert: Path, llama: Path) -> None:
    """sim:fp32 (every stage fp32) through the registered attention gives eager fp32's hidden states up to fp32
    rounding: the padding mask (BERT), the causal mask and grouped-query heads (Llama) reach the kernel right.
    Oracle: transformers' own eager attention."""
    from transformers import AutoModel, AutoTokenizer

    folder = bert if which == "bert" else llama
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    x = tok(["the cat sat on the mat today", "a dog"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = model(**x).last_hidden_state
        sim_impl.register("sim:fp32")
        model.set_attn_implementation(sim_impl.parse_sim("sim:fp32").registered)
        out = model(**x).last_hidden_state
        sim_impl.register("sim:fp8-e4m3")  # a policy with e4m3 inputs: visibly off, never NaN
        model.set_attn_implementation(sim_impl.parse_sim("sim:fp8-e4m3").registered)
        coarse = model(**x).last_hidden_state
    valid = x["attention_mask"].bool()
    scale = float(ref[valid].abs().max())
    err = float((out - ref)[valid].abs().max())
    assert err <= 64 * torch.finfo(torch.float32).eps * scale  # fp32 rounding of two orders of summation
    assert float((coarse - ref)[valid].abs().max()) > 100 * err


def test_registered_names_are_not_read_as_flash_kernels() -> None:
    from transformers.utils.generic import is_flash_attention_requested

    for name in sim_impl.valid_names():
        reg = sim_impl.parse_sim("sim:" + name).registered
        assert not is_flash_attention_requested(requested_attention_implementation=reg), reg
        assert "/" not in reg


def test_sim_layers_isolated_propagated_predicted(bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _invoke(str(bert), "--impls", "eager,sim:fa3-fp8,sim:bf16-mixed", "--dtypes", "fp32,bf16", "--out",
                  str(out), *FAST)  # fmt: skip
    assert res.exit_code in (0, 1), res.output
    data = json.loads((out / "summary.json").read_text())
    sims = {c["a"]: c for c in data["comparisons"] if c["impl"].startswith("sim:")}
    assert set(sims) == {"sim:fa3-fp8:fp32", "sim:bf16-mixed:fp32", "sim:fa3-fp8:bf16", "sim:bf16-mixed:bf16"}
    for c in sims.values():
        layers = c["layers"]
        assert layers[0]["isolated_max_abs"] == 0.0  # the embeddings see no attention
        for d in layers[1:]:
            assert d["isolated_max_abs"] > 0 and d["attention_rel_l2"] > 0 and d["predicted"] > 0
            assert d["growth"] == pytest.approx(d["max_abs"] / d["isolated_max_abs"])
        assert c["per_call"]["predicted_layers"] == len(layers) - 1
    # in an fp32 model layer 1 sees eager fp32's own inputs either way: isolated == propagated there
    for name in ("sim:fa3-fp8:fp32", "sim:bf16-mixed:fp32"):
        d1 = sims[name]["layers"][1]
        assert d1["isolated_max_abs"] == d1["max_abs"]
    # FP8 inputs err more than bf16 inputs, per call (isolated) and in prediction
    fp8, b16 = sims["sim:fa3-fp8:fp32"]["layers"][1], sims["sim:bf16-mixed:fp32"]["layers"][1]
    assert fp8["isolated_max_abs"] > b16["isolated_max_abs"] and fp8["predicted"] > b16["predicted"]
    assert (out / "figures" / "kernels_by_layer_bf16.png").is_file()
    text = " ".join(res.output.split())
    assert text.startswith("Answer")
    assert "sim:fa3-fp8 (bf16 model): " in text and "nearest neighbours kept on average" in text
    assert "errors grow" in text and "over 2 layers" in text
    report = (out / "report.md").read_text()
    assert report.index("Answer") < report.index("Comparisons") and "predicted within 2x" in report


def test_sim_decoder_greedy_agreement_and_kl(llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _invoke(str(llama), "--impls", "eager,sim:sage3-fp4", "--dtypes", "bf16", "--out", str(out), *FAST)
    assert res.exit_code in (0, 1), res.output
    data = json.loads((out / "summary.json").read_text())
    by = {c["a"]: c for c in data["comparisons"]}
    for name in ("sim:sage3-fp4:bf16", "eager:bf16"):
        gen = by[name]["generation"]
        kl = gen["kl_per_position"]
        assert len(kl) == data["settings"]["new_tokens"] and min(kl) >= 0.0
        firsts = [p["first_divergence"] for p in gen["prompts"] if p["first_divergence"] is not None]
        assert gen["first_divergence"] == (min(firsts) if firsts else None)
        same = [a == b for p in gen["prompts"] for a, b in zip(p["tokens"], p["ref_tokens"], strict=True)]
        assert gen["token_agreement"] == pytest.approx(sum(same) / len(same))
    # FP4 attention moves the next-token distributions more than the bf16 format alone does
    assert by["sim:sage3-fp4:bf16"]["generation"]["kl_mean"] > by["eager:bf16"]["generation"]["kl_mean"]
    assert "greedy tokens agree" in " ".join(res.output.split())


def test_unknown_sim_name_lists_the_valid_ones_before_loading(tmp_path: Path) -> None:
    res = _invoke(str(tmp_path / "no-model-here"), "--impls", "eager,sim:fa9", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "unknown simulated kernel 'sim:fa9'" in text and "fa3-fp8" in text and "sage3-fp4" in text
    assert "does not exist" not in text  # refused before the model folder was looked at


def test_a_head_dim_the_preset_cannot_take_is_one_line(tmp_path: Path) -> None:
    folder = _bert(tmp_path / "d48", hidden=48, heads=1)
    res = _invoke(str(folder), "--impls", "eager,sim:fa3-fp8", "--out", str(tmp_path / "o"), *FAST)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sim:fa3-fp8" in lines[0] and "head dim 48" in lines[0]
    assert "power-of-two" in lines[0]


def test_a_forward_only_kernel_in_a_training_model_says_so(bert: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bert)
    model = AutoModel.from_pretrained(bert, attn_implementation="eager", dtype=torch.float32)
    model.train()
    model.config.attention_probs_dropout_prob = 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = tok(["the cat sat"], return_tensors="pt")
    sim_impl.register("sim:sage3-fp4")
    model.set_attn_implementation(sim_impl.parse_sim("sim:sage3-fp4").registered)
    with pytest.raises(ValueError, match="sim:sage3-fp4 has no backward"):
        model(**x).last_hidden_state.sum().backward()
    with pytest.raises(ValueError, match=r"has no backward .* training mode"):
        sim_impl.check_model(sim_impl.parse_sim("sim:sage3-fp4"), 8, torch.bfloat16, training=True)
    sim_impl.register("sim:bf16-mixed")  # a kernel with a backward trains
    model.set_attn_implementation(sim_impl.parse_sim("sim:bf16-mixed").registered)
    model(**x).last_hidden_state.sum().backward()
    assert all(p.grad is not None for p in model.encoder.layer[0].attention.self.query.parameters())


def test_kv_cache_combines_with_a_sim_kernel(llama: Path, tmp_path: Path) -> None:
    """--kv-cache with sim: kernels in --impls: every cache again with the kernel as the attention; the bf16 cache
    with sim:fp32 (every stage fp32) reproduces the exact attention's generation."""
    args = ["validate", str(llama), "--kv-cache", "fp4", "--impls", "eager,sim:fp32,sim:fa4-fp8", "--prompts", "2",
            "--new-tokens", "4", "--prompt-len", "8", "--out", str(tmp_path / "kv"), "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = {r["kv"]: r for r in json.loads(res.output)["rows"]}
    assert list(rows) == ["bf16", "fp4", "bf16 + sim:fp32", "fp4 + sim:fp32", "bf16 + sim:fa4-fp8", "fp4 + sim:fa4-fp8"]
    assert rows["bf16 + sim:fp32"]["token_agreement"] == 1.0 and rows["bf16 + sim:fp32"]["kl_max"] < 1e-6
    assert rows["bf16 + sim:fa4-fp8"]["kl_mean"] > rows["bf16 + sim:fp32"]["kl_mean"]
    bad = runner.invoke(app, [*args[:4], "--impls", "sim:nope", "--out", str(tmp_path / "kv2")])
    assert bad.exit_code == 2 and "unknown simulated kernel 'sim:nope'" in bad.output


def test_the_verdict_says_per_call_or_only_end_to_end() -> None:
    """A kernel whose every isolated error is within its bound but whose propagated error is not 'passes per call
    but fails end to end' (naming the first such layer); one over its bound in isolation fails per call."""
    from flashcheck.validate.result import Check, Comparison, LayerDeviation
    from flashcheck.validate.sim_report import verdict_words

    def cmp(isolated: tuple[float, float]) -> Comparison:
        layers = (LayerDeviation(0, 0.1, 0.1, 0.2, 0.0), LayerDeviation(1, 0.1, 0.1, 0.2, isolated[0]),
                  LayerDeviation(2, 0.3, 0.1, 0.2, isolated[1]))  # fmt: skip
        return Comparison("sim:x:bf16", "eager:fp32", "sim:x", "bf16", 2.0, checks=(Check("h", 0.3, 0.2),),
                          layers=layers)  # fmt: skip

    hidden = cmp((0.05, 0.15))
    assert hidden.per_call()["passes_per_call"] and hidden.per_call()["first_layer_failing_only_end_to_end"] == 2
    assert verdict_words(hidden).startswith("FAIL: passes per call at every layer but fails end to end, first at layer")
    assert hidden.per_call()["last_layer_growth"] == 2.0
    early = cmp((0.05, 0.25))
    assert verdict_words(early).startswith("FAIL: fails per call already, first at layer 2")
