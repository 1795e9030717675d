"""Seeded input generators for attention: Q, K, V in [B, H, L, D], float64."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DISTRIBUTIONS = ("normal", "uniform", "outliers", "sharp", "tied")


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpec:
    """What to draw. `seq_len_k` defaults to `seq_len`; `sharpness` is the std of Q and K entries for
    `sharp` (logits then have std sharpness**2); `tied_keys` is how many key positions share the
    maximum for `tied`."""

    batch: int = 1
    heads: int = 8
    seq_len: int = 1024
    seq_len_k: int | None = None
    head_dim: int = 64
    distribution: str = "normal"
    seed: int = 0
    sharpness: float = 3.0
    tied_keys: int = 4

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.seq_len_k is not None and self.seq_len_k < 1:
            raise ValueError(f"seq_len_k={self.seq_len_k} must be a positive integer")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {self.distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}")

    @property
    def lk(self) -> int:
        return self.seq_len if self.seq_len_k is None else self.seq_len_k


def make_qkv(spec: InputSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q [B, H, Lq, D], K and V [B, H, Lk, D], float64, reproducible from spec.seed."""
    g = torch.Generator().manual_seed(spec.seed)
    b, h, d = spec.batch, spec.heads, spec.head_dim
    shape_q, shape_k = (b, h, spec.seq_len, d), (b, h, spec.lk, d)
    draw = _DRAW[spec.distribution]
    return draw(spec, g, shape_q, shape_k)


def make_grad(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A seeded upstream gradient dO ~ N(0, 1), float64."""
    g = torch.Generator().manual_seed(seed + 7_919)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _randn(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _normal(spec, g, sq, sk):
    return _randn(sq, g), _randn(sk, g), _randn(sk, g)


def _uniform(spec, g, sq, sk):
    def u(shape):
        return torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1

    return u(sq), u(sk), u(sk)


def _outliers(spec, g, sq, sk):
    # FlashAttention-3 section 4.3: N(0, 1) + N(0, 100) * Bernoulli(0.001)
    def x(shape):
        base = _randn(shape, g)
        big = _randn(shape, g) * 10.0
        mask = torch.rand(shape, generator=g, dtype=torch.float64) < 1e-3
        return base + big * mask

    return x(sq), x(sk), x(sk)


def _sharp(spec, g, sq, sk):
    s = spec.sharpness
    return _randn(sq, g) * s, _randn(sk, g) * s, _randn(sk, g)


def _tied(spec, g, sq, sk):
    """Rows whose maximum score is reached at several keys exactly (arXiv 2510.04212's failure mode).

    `tied_keys` key positions per head hold the same vector t; every query is 3*sqrt(D) * t/|t| plus
    small noise, so its largest score is q.t, reached exactly at each tied position."""
    q, k, v = _normal(spec, g, sq, sk)
    b, h, lk, d = sk
    n_tied = min(spec.tied_keys, lk)
    t = _randn((b, h, 1, d), g)
    for bi in range(b):
        for hi in range(h):
            pos = torch.randperm(lk, generator=g)[:n_tied]
            k[bi, hi, pos] = t[bi, hi, 0]
    direction = t / torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    q = 3.0 * math.sqrt(d) * direction + 0.1 * q
    return q, k, v


_DRAW = {"normal": _normal, "uniform": _uniform, "outliers": _outliers, "sharp": _sharp, "tied": _tied}
