"""Proof of which kernel ran: the attention op names torch.profiler saw during a call."""

from __future__ import annotations

from collections.abc import Callable

import torch

ATTENTION_WORDS = ("attention", "attn", "fmha", "flash", "sdpa", "flex")


def attention_ops(fn: Callable[[], object], expected: tuple[str, ...] = ()) -> list[str]:
    """Run fn under the profiler; return the op names that look like attention kernels or contain one
    of the `expected` fragments (sorted)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    names = {evt.key for evt in prof.key_averages()}
    return sorted(n for n in names if any(w in n.lower() for w in ATTENTION_WORDS) or any(e in n for e in expected))


def proves(ops: list[str], expected: tuple[str, ...]) -> bool | None:
    """True when one of the expected op-name fragments is among the ops seen (None: nothing to prove)."""
    if not expected:
        return None
    return any(e in op for e in expected for op in ops)
