"""validate --kv-cache on a tiny Llama-architecture decoder built from a config (no download)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli.app import app

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64)  # fmt: skip
    path = tmp_path_factory.mktemp("tinyllama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_kv_cache_rows_against_the_bf16_cache(tiny_llama):
    from transformers import AutoModelForCausalLM

    from flashcheck.validate.kvcache import IMPL, expand_formats, kv_cache_check, random_prompts, register

    assert expand_formats("fp8,fp4") == ["fp8/static", "fp8/calc", "fp4"]
    register()
    lm = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation=IMPL, dtype="float32").eval()
    rows = kv_cache_check(lm, ["fp8/static", "fp4"], random_prompts(64, 2, 8), 6)
    ref, fp8, fp4 = rows
    assert ref.kv == "bf16" and ref.token_agreement == 1.0 and ref.first_divergence is None and ref.kl_mean == 0.0
    for r in (fp8, fp4):
        assert 0.0 <= r.token_agreement <= 1.0 and r.kl_mean >= 0.0 and r.kl_max >= r.kl_mean
        assert r.first_divergence is None or 0 <= r.first_divergence < 6
        assert (r.first_divergence is None) == (r.token_agreement == 1.0)
    assert fp4.kl_mean > 0.0  # 2-bit mantissas change the distributions; the bf16 cache against itself does not


def test_validate_kv_cache_cli_table(tiny_llama, tmp_path):
    runner = CliRunner()
    args = ["validate", str(tiny_llama), "--kv-cache", "fp8", "--prompts", "2", "--new-tokens", "5",
            "--prompt-len", "8", "--out", str(tmp_path / "v")]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "--kv-cache: 2 prompts x 5 greedy tokens, vs the bf16 cache" in res.output
    for name in ("bf16", "fp8/static", "fp8/calc"):
        assert name in res.output
    saved = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert [r["kv"] for r in saved["rows"]] == ["bf16", "fp8/static", "fp8/calc"]
    res = runner.invoke(app, ["validate", str(tiny_llama), "--kv-cache", "fp3", "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and "unknown KV-cache scheme 'fp3'" in res.output
    res = runner.invoke(app, ["validate", str(tmp_path / "none"), "--kv-cache", "fp8", "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and "does not exist" in res.output
    from flashcheck.validate.loading import bundled_model_path

    res = runner.invoke(app, ["validate", str(bundled_model_path()), "--kv-cache", "fp8", "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and "is not a causal LM" in res.output
    study = tmp_path / "T"  # a study's folder is never overwritten (issue fixb2 item 2)
    study.mkdir()
    (study / "records.jsonl").write_text("")
    res = runner.invoke(app, [*args[:-1], str(study)])
    assert res.exit_code == 2 and "holds records.jsonl" in res.output and not (study / "summary.json").exists()
    assert runner.invoke(app, args).exit_code == 0  # its own folder: rewritten
