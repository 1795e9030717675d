"""flash_attention's mask at its API: a mask that requires grad is refused (it would get none and silently not
train), a detached one runs; a mask of a shape that does not broadcast names the rule."""

from __future__ import annotations

import pytest
import torch

from flashcheck.kernels import flash_attention, standard_attention


def _qkv():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]


def test_a_mask_that_requires_grad_is_refused_and_a_detached_one_runs():
    q, k, v = _qkv()
    bias = torch.zeros(1, 2, 8, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match=r"mask requires grad.*pass mask\.detach\(\)"):
        flash_attention(q, k, v, mask=bias)
    flash_attention(q, k, v, mask=bias.detach()).sum().backward()
    assert q.grad is not None and bias.grad is None
    with torch.no_grad():  # no autograd: nothing to lose
        flash_attention(q, k, v, mask=bias)
    standard_attention(q, k, v, mask=bias).sum().backward()  # the alternative the message names trains the bias
    assert bias.grad is not None and bool(bias.grad.abs().sum() > 0)


def test_a_mask_that_does_not_broadcast_names_the_rule():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"mask of shape \(8,\) does not broadcast .*2 to 4 dims"):
        flash_attention(q, k, v, mask=torch.ones(8, dtype=torch.bool))
