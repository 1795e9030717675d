"""Proof of which kernel ran, and where: the attention op names torch.profiler saw during a call.

A proof is a tuple of regular expressions that must each match one op name: exact "^aten::...$" names
for dispatcher ops (the CPU flash op `aten::_scaled_dot_product_flash_attention_for_cpu` must not prove
the CUDA op `aten::_scaled_dot_product_flash_attention`), and CUDA kernel names (`pytorch_flash::flash_fwd`,
`fmha_cutlassF`, `triton_tem_fused_flex_attention`) that only a run on the GPU records."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

import torch

ATTENTION_WORDS = ("attention", "attn", "fmha", "flash", "sdpa", "flex")
# A softmax CUDA kernel (`softmax_warp_forward`, `cunn_SoftMaxForward`): not a dispatcher op, so only a
# run on the GPU records one. Proves that decomposed attention (SDPA MATH, eager) ran on CUDA.
CUDA_SOFTMAX = r"^(?!aten::).*(?i:softmax)"


def attention_ops(fn: Callable[[], object], expected: tuple[str, ...] = (), device: str | None = None) -> list[str]:
    """Run fn under the profiler (CUDA kernels recorded when `device` is cuda; None: wherever a GPU is
    visible); return the op names that look like attention kernels or match an `expected` pattern (sorted)."""
    from torch.profiler import ProfilerActivity, profile

    # kineto logs "USDT: ... profiler_start/stop" to stderr on every profile below level 6 (its USDT level
    # is 5); it reads the level when the profiler first starts. A level the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    cuda = torch.cuda.is_available() if device is None else device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    return select_ops(_op_names(prof), expected)


def _op_names(prof) -> set[str]:
    """The names prof.key_averages() would list, read from the profiler's raw events: key_averages first builds a
    FunctionEvent per event (shapes, stacks, memory), ~50 ms on one text of a small model, 4x the forward itself.
    The same names, as torch's parser names and filters them; key_averages where this torch keeps them elsewhere."""
    try:
        from torch.autograd.profiler_util import _filter_name, _rewrite_name

        events = prof.profiler.kineto_results.events()
    except (ImportError, AttributeError):
        return {evt.key for evt in prof.key_averages()}
    return {
        _rewrite_name(name=e.name(), with_wildcard=True)
        for e in events
        if not _filter_name(e.name()) and not getattr(e, "is_hidden_event", lambda: False)()
    }


def select_ops(names: Iterable[str], expected: tuple[str, ...] = ()) -> list[str]:
    """The op names that look like attention kernels or match an `expected` pattern (sorted, unique)."""
    pats = [re.compile(e) for e in expected]
    return sorted({n for n in names if any(w in n.lower() for w in ATTENTION_WORDS) or any(p.search(n) for p in pats)})


def proves(ops: list[str], expected: tuple[str, ...]) -> bool | None:
    """True when every expected pattern (a regular expression) matches one of the ops seen (None: nothing
    to prove)."""
    if not expected:
        return None
    return all(any(re.search(e, op) for op in ops) for e in expected)
