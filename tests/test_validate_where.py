"""`validate` says where: a model with one head's attention made wrong on purpose fails, and the comparison names
that layer, that head and the tokens (per-head outputs captured through hooks, validate/locate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app

pytest.importorskip("transformers")
BAD_LAYER, BAD_HEAD = 1, 2  # 0-based layer_idx of the module; reported as layer 2 (1-based block)


def _bad_head(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA, except head BAD_HEAD of layer BAD_LAYER, whose output is scaled by 1.5 (a wrong head)."""
    mask = None if attention_mask is None else attention_mask.bool()
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    if getattr(module, "layer_idx", None) == BAD_LAYER:
        out = out.clone()
        out[:, BAD_HEAD] = out[:, BAD_HEAD] * 1.5
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def bad_head_model(tmp_path_factory) -> Path:
    from transformers import AttentionInterface, BertConfig, BertModel
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from test_validate import _save, _tokenizer

    AttentionInterface.register("bad_head", _bad_head)
    AttentionMaskInterface.register("bad_head", sdpa_mask)
    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=96, pad_token_id=0)  # fmt: skip
    return _save(BertModel(cfg).eval(), tok, tmp_path_factory.mktemp("bad_head_bert"))


def test_validate_names_the_planted_bad_head(bad_head_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(bad_head_model), "--impls", "eager,bad_head", "--dtypes", "fp32", "--out", str(out)]
    res = CliRunner().invoke(app, ["validate", *args, "--samples", "24", "--quiet"])
    assert res.exit_code == 1, res.output
    rows = {c["a"]: c for c in json.loads((out / "summary.json").read_text())["comparisons"]}
    where = rows["bad_head:fp32"]["where"]
    assert where["layer"] == BAD_LAYER + 1 and where["head"] == BAD_HEAD and where["tokens"][0] == 0, where
    assert rows["eager:fp32"]["pass"] and rows["eager:fp32"]["where"] is None
    text = " ".join(res.output.split())
    assert f"attention first leaves its budget at layer {BAD_LAYER + 1}, head {BAD_HEAD}, tokens 0-" in text
    assert f"layer {BAD_LAYER + 1}, head {BAD_HEAD}" in (out / "report.md").read_text()


def test_first_divergence_reports_nan_and_the_token_span() -> None:
    from flashcheck.validate.locate import first_divergence

    ref = [torch.zeros(2, 8, 4, 3) for _ in range(3)]
    cand = [t.clone() for t in ref]
    cand[1][1, 5:7, 3, 0] = float("nan")  # layer 2, head 3, tokens 5-6
    cand[2][:, :, 0, :] = 1.0  # everything after diverges too: the first layer is named
    valid = torch.ones(2, 8, dtype=torch.bool)
    where = first_divergence(cand, ref, valid, 3.0, torch.float32)
    assert str(where) == "layer 2, head 3, tokens 5-6, NaN"
    valid[1, 5:] = False  # padding is not judged
    assert str(first_divergence(cand, ref, valid, 3.0, torch.float32)).startswith("layer 3, head 0")
