"""Serving kernels as consistency targets: the FA3 and FlashInfer simulators with each launch's own tile and
split choice, and real backends or a user's callable behind the same f(q, k, v, causal) signature.

q [B, H, Lq, D], k, v [B, Hkv, Lk, D]; causal is bottom-right aligned (a decode step sees the whole cache).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashcheck.kernels.serving.attention import prepare, run_prepared
from flashcheck.kernels.serving.heuristics import (
    H100_SMS,
    fa3_launch_tile,
    fa3_num_splits,
    flashinfer_chunk_pages,
)
from flashcheck.kernels.serving.kvcache import parse_kv_format

SIMULATORS = ("sim-fa3", "sim-fa3-fixed", "sim-flashinfer", "sim-flashinfer-fixed")
FLASHINFER_TILE = 16  # keys per step of the simulated FlashInfer decode (one page)


@dataclass(frozen=True, slots=True)
class Fa3Launch:
    """What one FA3 launch chose: kBlockN and the split count."""

    block_n: int
    splits: int


def fa3_launch(q: torch.Tensor, k: torch.Tensor, *, fp8: bool, causal: bool, fixed_splits: int | None,
               num_sms: int = H100_SMS) -> Fa3Launch:  # fmt: skip
    """The tile (flash_api.cpp's rules, paged KV as vLLM runs it) and splits (get_num_splits, or fixed) of a launch."""
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[-2]
    _, block_n = fa3_launch_tile(lq, h, hk, d, fp8=fp8, causal=causal)
    splits = fixed_splits or fa3_num_splits(b, lq, lk, h, hk, d, fp8=fp8, causal=causal, num_sms=num_sms)
    return Fa3Launch(block_n, splits)


def sim_target(name: str, kv: str = "fp8", *, fixed_splits: int = 4, fixed_split_pages: int = 64,
               accumulation: str = "two-level") -> Callable:  # fmt: skip
    """The simulator `name` (SIMULATORS) over KV cache `kv` as f(q, k, v, causal) -> out (bf16 values in float64).

    sim-fa3: FA3's tile per launch and get_num_splits (which depends on the batch); sim-fa3-fixed: the same with
    `fixed_splits` splits always (flash-attention PR #2450's fixed split); sim-flashinfer: FlashInfer's decode
    chunking (scheduler.cuh's binary search over the whole batch), the arithmetic within a chunk FA3's with P
    kept in fp32 (a CUDA-core decode; not FlashInfer's kernel bit for bit); -fixed: chunks of
    `fixed_split_pages` pages (fixed_split_size, flashinfer#1675)."""
    if name not in SIMULATORS:
        raise ValueError(f"unknown simulator {name!r}; expected one of {', '.join(SIMULATORS)}")
    fmt = parse_kv_format(kv)
    fp8 = fmt.scheme in ("fp8", "fp8-head")

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        ops = prepare(q, k, v, fmt)
        if name.startswith("sim-fa3"):
            launch = fa3_launch(q, k, fp8=fp8, causal=causal, fixed_splits=fixed_splits if "fixed" in name else None)
            out, _ = run_prepared(ops, block_n=launch.block_n, splits=launch.splits, causal=causal,
                                  accumulation=accumulation)  # fmt: skip
            return out
        lk = k.shape[-2]
        fixed = fixed_split_pages if "fixed" in name else None
        pages = flashinfer_chunk_pages([lk] * q.shape[0], k.shape[1], fixed_split_pages=fixed)
        chunk = lk if pages is None else pages * 16
        spans = [
            [(t, min(c0 + chunk, lk, t + FLASHINFER_TILE)) for t in range(c0, min(c0 + chunk, lk), FLASHINFER_TILE)]
            for c0 in range(0, lk, chunk)
        ]
        out, _ = run_prepared(ops, block_n=FLASHINFER_TILE, spans=spans, causal=causal, round_p=False,
                              accumulation=accumulation)  # fmt: skip
        return out

    return run


def backend_target(name: str, device: str = "cpu") -> Callable:
    """A real backend (backends.get_backend) as f(q, k, v, causal): a single query row runs without a mask."""
    from flashcheck.backends import get_backend

    backend = get_backend(name)
    why = backend.available(device=device)
    if not why.ok:
        raise ValueError(f"backend {name!r} cannot run on {device}: {why.reason}")

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        causal = causal and q.shape[-2] > 1
        with torch.no_grad():
            return backend.forward(q.to(device), k.to(device), v.to(device), causal=causal).cpu()

    return run


def callable_target(spec: str) -> Callable:
    """A user's 'module:function', called as `flashcheck hunt` calls one: function(q, k, v, *, causal, scale, mask)
    with mask None, scale 1/sqrt(D) and bottom-right causal masks; ValueError names a missing parameter."""
    module, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r} ({exc}); expected an importable 'module:function'") from None
    if not callable(fn):
        raise ValueError(f"{spec!r} is not callable; expected 'module:function'")
    _check_signature(spec, fn)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        with torch.no_grad():
            return fn(q, k, v, causal=causal, scale=q.shape[-1] ** -0.5, mask=None)

    return run


def _check_signature(spec: str, fn: Callable) -> None:
    """ValueError naming what `fn` lacks of (q, k, v, *, causal, scale, mask); a signature Python cannot read passes."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    kinds = [p.kind for p in params.values()]
    positional = sum(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    missing = [] if positional >= 3 or inspect.Parameter.VAR_POSITIONAL in kinds else ["q, k, v (positional)"]
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        missing += [n for n in ("causal", "scale", "mask") if n not in params]
    if missing:
        raise ValueError(f"{spec!r} does not take {', '.join(missing)}; expected function(q, k, v, *, causal, scale, "
                         "mask) as `flashcheck hunt` calls it")  # fmt: skip


def resolve_target(spec: str, *, kv: str = "fp8", device: str = "cpu", **sim_options: object) -> Callable:
    """A simulator name, a 'module:function' or a backend name -> f(q, k, v, causal)."""
    if spec in SIMULATORS:
        return sim_target(spec, kv, **sim_options)
    if ":" in spec:
        return callable_target(spec)
    from flashcheck.backends import backend_names

    if spec not in backend_names():
        import difflib

        close = difflib.get_close_matches(spec, [*backend_names(), *SIMULATORS], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown target {spec!r}{hint}; expected a backend ({', '.join(backend_names())}), a "
                         f"simulator ({', '.join(SIMULATORS)}) or a 'module:function'")  # fmt: skip
    return backend_target(spec, device)
