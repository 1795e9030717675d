"""The KernelPreset record (kernels.sim.presets holds the presets themselves)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flashcheck.core.numerics import Format, Policy


@dataclass(frozen=True, slots=True)
class KernelPreset:
    """`tiles(lq, lk, d, causal) -> (block_q, block_k)`; `policy(fmt)` the kernel's own policy at dtype fmt;
    `default_format` the input format it runs when none is given; `key_order` its KV iteration order."""

    name: str
    description: str
    tiles: Callable[[int, int, int, bool], tuple[int, int]]
    policy: Callable[[Format], Policy]
    algorithm: str = "fa2"
    exp2: bool = False
    default_format: str = "bf16"
    key_order: str = "forward"


def fa3_fp8_tiles(lq: int, lk: int, d: int, causal: bool) -> tuple[int, int]:
    """FA3's FP8 forward tiles (Br, Bc) by head dim: flash-attn 3 hopper/tile_size.h, 1-byte elements."""
    if d <= 64:
        return 192, 160
    if d <= 96:
        return 192, 128
    if d <= 128:
        return 128, 224
    return (128, 160) if d <= 192 else (128, 128)
