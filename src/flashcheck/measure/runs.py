"""Running a method's function on prepared inputs and bringing the result back as float64 on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch


def run_float64(fn: Callable, tensors, do: torch.Tensor | None = None):
    """fn(*tensors) as float64 on the CPU, and with dO the gradients of (out * dO).sum() too."""
    if do is None:
        with torch.no_grad():
            return fn(*tensors).detach().double().cpu(), None
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    out.backward(do.to(out.device, out.dtype))
    return out.detach().double().cpu(), tuple(t.grad.detach().double().cpu() for t in leaves)
