"""The KernelPreset record (kernels.presets holds the presets themselves)."""

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
