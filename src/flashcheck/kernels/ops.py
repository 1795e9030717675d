"""The two primitives every simulated kernel is written in: round to a stage, multiply at a precision."""

from __future__ import annotations

import torch

from flashcheck.core.numerics import FP8_FORMATS, Format, Policy, info, round_to
from flashcheck.kernels.validation import check_scale


def rnd(x: torch.Tensor, policy: Policy, stage: str) -> torch.Tensor:
    """x rounded to the format of `stage` under policy (a no-op when the stage is the working dtype)."""
    return round_to(x, policy.stage(stage))


def rnd_(x: torch.Tensor, policy: Policy, stage: str, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """rnd in place: x holds its value rounded to the format of `stage` (and is returned). `scratch`, a flat
    buffer of that format's dtype with at least x.numel() elements, spares the cast's allocation."""
    fmt = policy.stage(stage)
    if info(fmt).dtype == x.dtype:
        return x
    if scratch is not None and x.dtype == torch.float32 and fmt not in FP8_FORMATS:
        narrow = scratch[: x.numel()].view(x.shape)
        return x.copy_(narrow.copy_(x))  # the same two casts as round_to
    return x.copy_(round_to(x, fmt))


def mm(a: torch.Tensor, b: torch.Tensor, policy: Policy, out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b formed and summed in policy.matmul precision, returned in a's dtype (written into `out`, of
    the product's shape, when given).

    Operands are already rounded to their stages, so an fp32 product of bf16/fp16/fp8 values is exact
    and only the sum rounds, as on tensor cores with an fp32 accumulator."""
    if policy.matmul == Format.FP32 and a.dtype == torch.float64:
        prod = torch.matmul(a.to(torch.float32), b.to(torch.float32)).to(torch.float64)
        return prod if out is None else out.copy_(prod)
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """m with -inf replaced by 0, so exp(x - m) of a fully masked row is exp(-inf) = 0, never NaN."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) for None, else `scale` (a finite real, see kernels.validation)."""
    checked = check_scale(scale)
    return head_dim**-0.5 if checked is None else checked
