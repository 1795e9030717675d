"""validate's cached runs are checked against the plan before use: a damaged or hand-made file of the right name
but another layout (rows, probe layers, another run's file) is computed again, never used or crashed on."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tests.test_validate import _no_figures  # noqa: F401  (autouse: the reports here need no figures)

from flashcheck.validate import validate_model
from flashcheck.validate.cache import model_layout, run_fits
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
        ({"emb": torch.zeros(4, 10, dtype=torch.float64)}, "emb is 10 wide, its hidden states 8"),
        ({"probe": [torch.zeros(5, 8)] * 2}, "2 hidden states 8 wide, the model's are 3 of 8"),
        ({"probe": [torch.zeros(5, 6)] * 3, "emb": torch.zeros(4, 6, dtype=torch.float64)}, "the model's are 3 of 8"),
    ],
)
def test_a_run_of_another_layout_is_named(change, why):
    assert why in run_fits(dataclasses.replace(_run(), **change), _plan(), "eager", "fp32", False, (3, 8))


def test_the_models_layout_from_its_config():
    assert model_layout({"num_hidden_layers": 6, "hidden_size": 384}) == (7, 384)
    assert model_layout({"n_layer": 2, "n_embd": 64}) == (3, 64)
    assert model_layout({"num_hidden_layers": 2}) is None and model_layout({}) is None


def test_a_forged_cache_file_is_computed_again_with_the_same_result(tiny_bert: Path, tmp_path: Path):
    """The second run finds its reference's file cut to 3 rows: it warns naming the file, computes the run again
    (the same numbers as the first run) and replaces the file; a third run reuses the repaired file silently."""
    out = tmp_path / "out"
    kw = {"impls": ("eager", "sdpa"), "dtypes": ("fp32",), "samples": 4, "max_length": 16, "out": out}
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


def test_the_cli_names_a_cache_file_of_another_model_in_one_line(tiny_bert: Path, tmp_path: Path):
    """The fp64 context file cut to 2 of the model's 3 hidden states (or its emb made wider): `warning: ignoring
    the cache file ...` on stderr, one line, and the same table as before; no traceback, no `error:`."""
    from typer.testing import CliRunner

    from flashcheck.cli import app

    out = tmp_path / "out"
    args = [
        "validate",
        str(tiny_bert),
        "--impls",
        "eager,sdpa",
        "--dtypes",
        "fp32",
        "--samples",
        "4",
        "--max-length",
        "16",
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    (path,) = sorted((out / "cache").glob("eager-fp64-*.pt"))
    for forge in ("layers", "width"):
        state = torch.load(path, weights_only=True)
        if forge == "layers":
            state["probe"] = state["probe"][:2]
        else:
            state["emb"] = torch.zeros(state["emb"].shape[0], 10, dtype=state["emb"].dtype)
        torch.save(state, path)
        again = CliRunner().invoke(app, args)
        assert again.exit_code == 0 and again.stdout == first.stdout, again.output
        warned = [ln for ln in again.stderr.splitlines() if "ignoring the cache file" in ln]
        assert len(warned) == 1 and warned[0].startswith(f"warning: ignoring the cache file {str(path)!r}: "), (
            again.stderr
        )
        assert "Traceback" not in again.output and "UserWarning" not in again.stderr
