"""validate frees each dtype's model before the next dtype's copy loads (a 7B model in fp32 is 28 GB: two copies
must never be held at once), without a full garbage collection where nothing but its name kept it (~0.5 s each in
a process that imported transformers): runner._release collects only where a reference cycle keeps the model."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def _watched_loads(monkeypatch, cycle: bool) -> tuple[list, list[int]]:
    """ModelSource.load recording a weak reference to each model it hands out, and how many of the earlier
    ones were still alive at each load; `cycle`: each model keeps itself (a reference cycle)."""
    from flashcheck.validate.loading import ModelSource

    refs: list = []
    alive_at_load: list[int] = []
    load = ModelSource.load

    def watched(self, dtype: str, impl: str, device: str):
        alive_at_load.append(sum(r() is not None for r in refs))
        model = load(self, dtype, impl, device)
        if cycle:
            model.__dict__["_flashcheck_test_cycle"] = model
        refs.append(weakref.ref(model))
        return model

    monkeypatch.setattr(ModelSource, "load", watched)
    return refs, alive_at_load


@pytest.mark.parametrize("cycle", [False, True])
def test_each_dtypes_model_is_freed_before_the_next_loads(tiny_bert: Path, monkeypatch, cycle: bool) -> None:
    from flashcheck.validate import validate_model

    collections = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or collect(*a))
    refs, alive_at_load = _watched_loads(monkeypatch, cycle)
    validate_model(tiny_bert, None, impls=["eager", "sdpa"], dtypes=["fp32", "bf16"], samples=4, max_length=8)
    assert len(refs) == 3, alive_at_load  # fp64 (fp32's own deviation), fp32, bf16: one model each
    assert alive_at_load == [0, 0, 0]  # none held when the next loads
    # a collection only where the cycle kept a model (after each dtype), none where refcounts freed it
    assert len(collections) == (3 if cycle else 0), collections
