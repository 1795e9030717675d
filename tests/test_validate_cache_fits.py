"""validate's cached runs are checked against the plan before use: a damaged or hand-made file of the right name
but another layout (rows, probe layers, another run's file) is computed again, never used or crashed on."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from flashcheck.validate import validate_model
from flashcheck.validate.cache import run_fits
from flashcheck.validate.forward import Batch
from flashcheck.validate.run import Plan, RunOutput


def _plan(causal: bool = False) -> Plan:
    batches = [Batch({}, [2, 0]), Batch({}, [1, 3])]
    return Plan(tok=None, enc=[], n_texts=4, probe=[0, 3], batches=batches, probe_batches=[Batch({}, [0, 3])],
                invariance_ids=[], invariance_singles=0, prompts=[[1, 2]] if causal else [], pooling="mean",
                normalize=True, causal=causal, new_tokens=2 if causal else 0, device="cpu")  # fmt: skip


def _run(probe_only: bool = False) -> RunOutput:
    n = 2 if probe_only else 4
    ids = torch.tensor([0, 3]) if probe_only else torch.arange(4)
    layers = [torch.randn(5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    return RunOutput("eager", "fp64" if probe_only else "fp32", ids, torch.randn(n, 8, dtype=torch.float64),
                     torch.ones(n, dtype=torch.float64), layers, torch.tensor([0, 0, 0, 3, 3]),
                     probe_only=probe_only)  # fmt: skip


def test_a_run_of_the_plans_layout_fits():
    assert run_fits(_run(), _plan(), "eager", "fp32", False) == ""
    assert run_fits(_run(probe_only=True), _plan(), "eager", "fp64", True) == ""


@pytest.mark.parametrize(
    "change,why",
    [
        ({"emb": torch.zeros(3, 8, dtype=torch.float64)}, "emb has another row count"),
        ({"emb": torch.zeros(4, dtype=torch.float64)}, "emb is not a 2-D tensor"),
        ({"emb_ids": torch.tensor([0, 1, 2, 4])}, "emb_ids are not the plan's"),
        ({"emb_ids": [0, 1, 2, 3]}, "emb_ids is not a 1-D tensor"),
        ({"norms": torch.ones(5, dtype=torch.float64)}, "norms has another length"),
        ({"probe_ids": torch.tensor([0, 0, 1, 3, 3])}, "foreign probe ids"),
        ({"probe": [torch.zeros(5, 8), torch.zeros(4, 8)]}, "the probe layers' shapes differ"),
        ({"probe": []}, "probe is not a list of 2-D tensors"),
        ({"probe": "layers"}, "probe is not a list of 2-D tensors"),
        ({"dtype": "bf16"}, "another run's file"),
        ({"probe_only": True}, "another run's file"),
        ({"argmax": torch.zeros(2, 2)}, "argmax is not a 1-D tensor"),
        ({"last_logits": torch.zeros(2)}, "last_logits is not a 2-D tensor"),
        ({"generation": [{}, {}]}, "generation is not one entry per prompt"),
    ],
)
def test_a_run_of_another_layout_is_named(change, why):
    assert why in run_fits(dataclasses.replace(_run(), **change), _plan(), "eager", "fp32", False)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from tests.test_validate import _save, _tokenizer
    from transformers import BertConfig, BertModel

    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=96, pad_token_id=0)  # fmt: skip
    return _save(BertModel(cfg).eval(), tok, tmp_path_factory.mktemp("tiny_bert"))


def test_a_forged_cache_file_is_computed_again_with_the_same_result(tiny_bert: Path, tmp_path: Path):
    """The second run finds its reference's file cut to 3 rows: it warns naming the file, computes the run again
    (the same numbers as the first run) and replaces the file; a third run reuses the repaired file silently."""
    out = tmp_path / "out"
    kw = {"impls": ("eager", "sdpa"), "dtypes": ("fp32",), "samples": 24, "out": out}
    first = validate_model(str(tiny_bert), **kw)
    (path,) = sorted((out / "cache").glob("eager-fp32-*.pt"))
    state = torch.load(path, weights_only=True)
    rows = state["emb"].shape[0]
    state["emb"], state["norms"] = state["emb"][:3], state["norms"][:3]
    torch.save(state, path)
    with pytest.warns(UserWarning, match=r"ignoring the cache file .*eager-fp32-.*emb has another row count"):
        second = validate_model(str(tiny_bert), **kw)
    assert [c.to_dict()["max_abs"] for c in second.comparisons] == [c.to_dict()["max_abs"] for c in first.comparisons]
    assert torch.load(path, weights_only=True)["emb"].shape[0] == rows  # the file replaced by the run's own
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the repaired file fits
        third = validate_model(str(tiny_bert), **kw)
    assert [c.to_dict()["max_abs"] for c in third.comparisons] == [c.to_dict()["max_abs"] for c in first.comparisons]
