"""Test helpers: the peers' acceptance rule (flash-attention's tests/test_flash_attn.py) through the project's
own `check_budget`, so the tests judge kernels exactly as users' tests do."""

from __future__ import annotations

import torch

from flashcheck.core.budget import check_budget


def budget_ok(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, k: float) -> tuple[bool, str]:
    """The peers' rule: max|out - ref| <= k * max|base - ref| + 2 * max|(ref + 0.3 - 0.3) - ref| (reference in
    fp32, as flash-attention's tests round it), and the same on the mean error."""
    res = check_budget(out, ref, base, k=k, dtype=torch.float32, rule="peers")
    return res.passed, res.message()
