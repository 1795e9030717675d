"""Long-context decoding at kernel level: one query row per head against 8k .. 128k cached keys, the output's
error against the exact (FP64) attention of the same quantised cache.

The haystack: keys N(0, 1); values N(0, 1) (`zero-mean`) or N(0, 1) + 1 (`shared-mean`: real values share a
mean component); a needle key placed `early` (10% into the cache), `late` (90%) or `absent`, whose score is the
haystack's largest plus `margin` (6). What breaks one-level FP8 accumulation is the haystack: once O holds the
needle, each small p * v of the haystack falls below the accumulator's truncation grid, while l (fp32) counts it.

Variants (`VARIANTS`): bf16 (FA3 bf16, ideal MMA), fp8-1level / fp8-2level (FA3 FP8 on Hopper's MMA model, the
MMA accumulating into O across every tile, or into a fresh fragment added in fp32), b200 (FP8 on B200's model:
c added in fp32), fp4 (SGLang's fp4 cache, attention in bf16). Decode tiles follow FA3's tile_size.h, one split
(one accumulator across the whole cache, the condition of the issue's independent check).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from flashcheck.kernels.serving.attention import exact_attention, serving_attention
from flashcheck.kernels.serving.heuristics import fa3_launch_tile

VARIANTS: dict[str, dict] = {
    "bf16": {"kv": "bf16", "mma": None, "accumulation": "two-level"},
    "fp8-1level": {"kv": "fp8", "mma": "hopper", "accumulation": "one-level"},
    "fp8-2level": {"kv": "fp8", "mma": "hopper", "accumulation": "two-level"},
    "b200": {"kv": "fp8", "mma": "b200", "accumulation": "one-level"},
    "fp4": {"kv": "fp4", "mma": None, "accumulation": "two-level"},
}
NEEDLES = ("early", "late", "absent")
VALUES = ("zero-mean", "shared-mean")
CAPTURED = ("minilm", 3)  # `captured` values: Q, K, V of this model's layer on real text (core.captured; D = 32)


@dataclass(frozen=True, slots=True)
class LongContextRow:
    """One (variant, length, values, needle) cell: relative L2 error of O (mean and max over heads) against the
    exact attention of the same cache, the cache's own error (the exact attention of this cache against that
    of the bf16 cache, mean over heads), the cosine of O and of the exact output with the needle's value row,
    and the seconds the cell's call took."""

    variant: str
    kv_len: int
    values: str
    needle: str
    rel_err: float
    rel_err_max: float
    cos_needle: float
    cos_needle_exact: float
    heads: int
    seconds: float
    cache_err: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def haystack(kv_len: int, head_dim: int, heads: int, *, values: str, needle: str, margin: float = 6.0,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int | None]:  # fmt: skip
    """q [1, heads, 1, D], k, v [1, heads, kv_len, D] (float32) and the needle's position (None: absent).
    values `captured`: Q, K, V recorded from CAPTURED's layer on the bundled corpus (real values' statistics)."""
    if values not in (*VALUES, "captured") or needle not in NEEDLES:
        raise ValueError(f"values {values!r} / needle {needle!r}; expected {(*VALUES, 'captured')} and {NEEDLES}")
    if values == "captured":
        from flashcheck.core.captured import captured_qkv

        q, k, v = (
            t.float() for t in captured_qkv(*CAPTURED, (1, heads, 1, head_dim), (1, heads, kv_len, head_dim), seed)
        )
    else:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(1, heads, 1, head_dim, generator=g)
        k = torch.randn(1, heads, kv_len, head_dim, generator=g)
        v = torch.randn(1, heads, kv_len, head_dim, generator=g) + (1.0 if values == "shared-mean" else 0.0)
    pos = None if needle == "absent" else int(kv_len * (0.1 if needle == "early" else 0.9))
    if pos is not None:
        scale = head_dim**-0.5
        top = (q @ k.transpose(-1, -2)).amax(dim=-1, keepdim=True) * scale  # [1, H, 1, 1]
        qn = q / q.norm(dim=-1, keepdim=True)
        k[..., pos : pos + 1, :] = qn * (top + margin) / (q.norm(dim=-1, keepdim=True) * scale)
    return q, k, v, pos


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def measure_cell(
    variant: str, kv_len: int, *, head_dim: int = 32, heads: int = 4, seed: int = 0, values: tuple[str, ...] = VALUES
) -> list[LongContextRow]:
    """Every `values` x needle combination of one variant and length, stacked in the batch (rows independent)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    cfg = VARIANTS[variant]
    combos = [(vals, nd) for vals in values for nd in NEEDLES]
    parts = [haystack(kv_len, head_dim, heads, values=vals, needle=nd, seed=seed) for vals, nd in combos]
    q, k, v = (torch.cat([p[i] for p in parts]) for i in range(3))
    _, block_n = fa3_launch_tile(1, heads, heads, head_dim, fp8=cfg["kv"] == "fp8", causal=True)
    t0 = time.perf_counter()
    out, _ = serving_attention(q, k, v, kv=cfg["kv"], block_n=block_n, mma=cfg["mma"],
                               accumulation=cfg["accumulation"], round_output=False)  # fmt: skip
    seconds = time.perf_counter() - t0
    exact = exact_attention(q, k, v, cfg["kv"])
    rel = ((out - exact).norm(dim=-1) / exact.norm(dim=-1)).squeeze(-1)  # [B, H]
    exact16 = exact if cfg["kv"] == "bf16" else exact_attention(q, k, v, "bf16")
    cache = ((exact - exact16).norm(dim=-1) / exact16.norm(dim=-1)).squeeze(-1)
    rows = []
    for i, ((vals, nd), (_, _, vv, pos)) in enumerate(zip(combos, parts, strict=True)):
        if pos is None:
            cos_k = cos_e = math.nan
        else:
            target = vv[0, :, pos].to(torch.float64)  # [H, D]
            cos_k = float(_cos(out[i, :, 0], target).mean())
            cos_e = float(_cos(exact[i, :, 0], target).mean())
        rows.append(LongContextRow(variant, kv_len, vals, nd, float(rel[i].mean()), float(rel[i].max()), cos_k,
                                   cos_e, heads, seconds / len(combos), float(cache[i].mean())))  # fmt: skip
    return rows


def long_context_table(variants: tuple[str, ...] = tuple(VARIANTS), lengths: tuple[int, ...] = (8192, 32768, 131072),
                       *, head_dim: int = 32, heads: int = 4, seed: int = 0) -> list[LongContextRow]:  # fmt: skip
    """measure_cell over variants x lengths."""
    return [row for var in variants for n in lengths for row in measure_cell(var, n, head_dim=head_dim, heads=heads,
                                                                             seed=seed)]  # fmt: skip
