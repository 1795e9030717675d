"""The one place where the guard calls the backends, the budget rule and the environment check."""

from __future__ import annotations

import torch

from flashcheck.backends import Backend, get_backend
from flashcheck.backends.sdpa import SdpaBackend
from flashcheck.core.budget import K_FORWARD, RULES, BudgetResult, check_budget, rounding_floor
from flashcheck.core.metrics import rel_l2
from flashcheck.kernels.sim.validation import check_attention_inputs

__all__ = [
    "K_FORWARD",
    "RULES",
    "Backend",
    "BudgetResult",
    "available",
    "budget",
    "check_inputs",
    "environment_differences",
    "rel_l2",
    "resolve",
    "run",
]


def resolve(backend: str | Backend) -> Backend:
    """A backend by name (as `flashcheck backends` lists them), or the Backend given."""
    if isinstance(backend, Backend):
        return backend
    if not isinstance(backend, str):
        raise ValueError(f"backend {backend!r} is not allowed; expected a name or a flashcheck Backend")
    return get_backend(backend)


def available(backend: Backend, dtype: torch.dtype | None, device: torch.device) -> tuple[bool, str]:
    """Whether `backend` can run inputs of `dtype` on `device` here, and why not."""
    try:
        a = backend.available(dtype, device.type)
    except ValueError as e:  # a device the backend layer does not know
        return False, str(e)
    return a.ok, a.reason


def check_inputs(q: object, k: object, v: object, mask: object, scale: object) -> None:
    """The project's input rule (kernels.sim.validation): ValueError naming the bad value; K/V may have fewer heads."""
    check_attention_inputs(q, k, v, mask=mask, scale=scale, gqa=True)


def run(
    backend: Backend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """backend's attention on the tensors' device: q, k, v [B, H, L, D] -> [B, H, Lq, Dv]."""
    # SDPA backends call their aten op directly (backends/sdpa.py): no process-wide flag to guard with a lock
    return backend.run(q, k, v, device=q.device.type, causal=causal, scale=scale, mask=mask)


def working_dtype(backend: Backend, dtype: torch.dtype) -> torch.dtype | None:
    """The format a backend computes in for inputs of `dtype`, where it is not fp32 or better: SDPA math in
    true low precision (sdpa-math-lowp) works in the input's bf16/fp16; None for every other backend."""
    low = dtype in (torch.bfloat16, torch.float16)
    return dtype if low and isinstance(backend, SdpaBackend) and backend.lowp_math else None


def budget(
    out: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, k: float, rule: str, floor: float = 0.0
) -> BudgetResult:
    """The project's acceptance rule `rule` (one of RULES): |out - ref| <= k x |baseline - ref| + the rounding
    floor of out's dtype (or `floor` where larger), and the rule's other views; out, ref, baseline of one
    shape [..., L, D]."""
    fl = max(rounding_floor(ref, out.dtype), floor)
    return check_budget(out, ref, baseline, k=k, dtype=out.dtype, rule=rule, floor=fl)


def environment_differences(pin: str, impl: str | None) -> list[str]:
    """Differences between the pin file written by `flashcheck validate --pin` and this environment,
    with `impl` as the attention implementation that will run (ValueError for a bad pin file)."""
    from flashcheck.core.environment import check_pin, environment_fingerprint

    return check_pin(pin, environment_fingerprint(impl))
