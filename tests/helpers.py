"""Test helpers: the peers' acceptance rule (flash-attention's tests/test_flash_attn.py)."""

from __future__ import annotations

import torch


def budget_ok(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, k: float) -> tuple[bool, str]:
    """flash-attention's rule: max|out - ref| <= k * max|base - ref| + 2 * max|(ref + 0.3 - 0.3) - ref|."""
    ref64 = ref.detach().double()
    err = (out.detach().double() - ref64).abs().max().item()
    base_err = (base.detach().double() - ref64).abs().max().item()
    r32 = ref64.float()
    floor = 2 * ((r32 + 0.3 - 0.3) - r32).abs().max().item()
    bound = k * base_err + floor
    return (
        err <= bound,
        f"err {err:.3e} vs bound {bound:.3e} (k={k}, baseline {base_err:.3e}, floor {floor:.1e})",
    )
