"""Determinism of a method: repeated runs bit for bit (forward, and backward with dO), and batch invariance
(one batch row alone equals the same row inside a batch)."""

from __future__ import annotations

import dataclasses

import torch

from flashcheck.core.inputs import make_qkv
from flashcheck.measure.runs import run_float64 as _run


def determinism(case, qkv: tuple[torch.Tensor, ...], do: torch.Tensor | None = None) -> dict:
    """`case.determinism` repeated runs of `case.method` on qkv (float64 [B, H, L, D]) compared bit for bit,
    and batch invariance on a fresh batch of at least two rows (seed + 1)."""
    m = case.method
    fn = m.runner(causal=case.causal)
    first, first_g = _run(fn, m.prepare(*qkv), do)
    fwd_same = bwd_same = True
    for _ in range(case.determinism - 1):
        again, again_g = _run(fn, m.prepare(*qkv), do)
        fwd_same &= torch.equal(first, again)
        if do is not None:
            bwd_same &= all(torch.equal(a, b) for a, b in zip(first_g, again_g, strict=True))
    spec = dataclasses.replace(case.inputs, batch=max(2, case.inputs.batch), seed=case.inputs.seed + 1)
    batch = make_qkv(spec)
    full, _ = _run(fn, m.prepare(*batch))
    alone, _ = _run(fn, m.prepare(*(t[1:2] for t in batch)))
    res = {
        "runs": case.determinism,
        "forward_identical": bool(fwd_same),
        "batch_invariant": bool(torch.equal(full[1:2], alone)),
        "batch_max_diff": float((full[1:2] - alone).abs().max()),
    }
    if do is not None:
        res["backward_identical"] = bool(bwd_same)
    return res
