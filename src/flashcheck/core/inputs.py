"""Seeded input generators for attention: Q [B, H, Lq, D], K and V [B, Hkv, Lk, D], float64; the padding mask."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DISTRIBUTIONS = ("normal", "uniform", "outliers", "sharp", "tied", "sink")
SINK_DELTA = 8.0  # the "sink" distribution's sink score; "sink:DELTA" scores the sink DELTA (arXiv 2606.06521)
SINK_MAX = 50.0  # the largest sink score "sink:DELTA" takes
PAPER_SINKS = 4  # "sink4:DELTA": arXiv 2606.06521's own setting, 4 sink tokens and i.i.d. N(0, 1) scores
CAPTURED = "captured"  # "captured:MODEL": Q, K, V recorded from a real model (core.captured)
PADDING_SIDES = ("none", "left", "right")


def as_adjective(distribution: str) -> str:
    """A distribution's name as it reads before "inputs": "outlier inputs", not "outliers inputs"."""
    return "outlier" if distribution == "outliers" else distribution


def is_captured(distribution: str) -> bool:
    return isinstance(distribution, str) and distribution.startswith(CAPTURED + ":")


def sink_delta(distribution: str) -> float | None:
    """The sink score of "sink" (SINK_DELTA), "sink:DELTA" or "sink4:DELTA" (0 < DELTA <= SINK_MAX); None for any
    other name or a malformed one (known_distribution rejects those)."""
    if distribution == "sink":
        return SINK_DELTA
    name, sep, val = str(distribution).partition(":")
    if name not in ("sink", "sink4") or not sep:
        return None
    try:
        delta = float(val)
    except ValueError:
        return None
    return delta if 0.0 < delta <= SINK_MAX else None


def sink_tokens(distribution: str) -> int:
    """How many sink keys a sink distribution has: 4 for "sink4:DELTA" (the paper's setting), 1 for "sink" and
    "sink:DELTA" (the study's own), 0 for any other distribution."""
    if sink_delta(distribution) is None:
        return 0
    return PAPER_SINKS if str(distribution).startswith("sink4:") else 1


def known_distribution(distribution: str) -> bool:
    """One of DISTRIBUTIONS, captured:MODEL, sink:DELTA or sink4:DELTA."""
    return distribution in DISTRIBUTIONS or is_captured(distribution) or sink_delta(distribution) is not None


def parse_padding(spec: str) -> tuple[str, float]:
    """("none", 0.0), or (side, fraction) from "left:0.25" / "right:0.5"; ValueError names what is allowed."""
    side, _, frac = str(spec).partition(":")
    if side == "none" and not frac:
        return "none", 0.0
    try:
        f = float(frac)
    except ValueError:
        f = -1.0
    if side not in PADDING_SIDES[1:] or not 0.0 < f < 1.0:
        raise ValueError(f"padding {spec!r}; expected 'none', 'left:F' or 'right:F' with 0 < F < 1 (e.g. 'left:0.25')")
    return side, f


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
    kv_heads: int | None = None
    padding: str = "none"
    layer: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.seq_len_k is not None and self.seq_len_k < 1:
            raise ValueError(f"seq_len_k={self.seq_len_k} must be a positive integer")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads={self.kv_heads} must be a positive divisor of heads={self.heads}")
        if not known_distribution(self.distribution):
            raise ValueError(
                f"unknown distribution {self.distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}, "
                "captured:MODEL (a local Hugging Face model folder, or minilm for the bundled one), sink:DELTA "
                f"or sink4:DELTA (the sink's score, 0 < DELTA <= {SINK_MAX:g})"
            )
        parse_padding(self.padding)
        if self.layer < 0:
            raise ValueError(f"layer={self.layer} must be a non-negative integer")

    @property
    def lk(self) -> int:
        return self.seq_len if self.seq_len_k is None else self.seq_len_k

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


def make_qkv(spec: InputSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q [B, H, Lq, D], K and V [B, Hkv, Lk, D], float64, reproducible from spec.seed (and, for captured:MODEL,
    from the model and the bundled text: core.captured)."""
    g = torch.Generator().manual_seed(spec.seed)
    b, h, d = spec.batch, spec.heads, spec.head_dim
    shape_q, shape_k = (b, h, spec.seq_len, d), (b, spec.hkv, spec.lk, d)
    if is_captured(spec.distribution):
        from flashcheck.core.captured import captured_qkv

        return captured_qkv(spec.distribution.split(":", 1)[1], spec.layer, shape_q, shape_k, spec.seed)
    delta = sink_delta(spec.distribution)
    if delta is not None:
        draw_sink = _paper_sinks if sink_tokens(spec.distribution) == PAPER_SINKS else _sink
        return draw_sink(spec, g, shape_q, shape_k, delta)
    draw = _DRAW[spec.distribution]
    return draw(spec, g, shape_q, shape_k)


def make_mask(spec: InputSpec) -> torch.Tensor | None:
    """The padding mask of `spec`: bool [B, 1, Lq, Lk] (True = keep), or None without padding.

    Batch element b pads a fraction F * (b + 1) / B of its keys (at least one, at most Lk - 1) on the given side
    (variable lengths across the batch, as in a padded batch); its query rows at padded positions (aligned to the
    end of the keys when Lq < Lk) see no key at all: the rows whose output each implementation defines its own
    way (zeros, NaN, ...). With a causal mask as well, left padding also leaves the rows before the first real
    key without a visible key."""
    side, frac = parse_padding(spec.padding)
    if side == "none":
        return None
    b, lq, lk = spec.batch, spec.seq_len, spec.lk
    keep_k = torch.ones(b, lk, dtype=torch.bool)
    for bi in range(b):
        n = min(lk - 1, max(1, round(frac * (bi + 1) / b * lk)))
        keep_k[bi, :n] = False if side == "left" else keep_k[bi, :n]
        keep_k[bi, lk - n :] = False if side == "right" else keep_k[bi, lk - n :]
    keep_q = keep_k[:, lk - lq :] if lq <= lk else torch.ones(b, lq, dtype=torch.bool)
    return (keep_q[:, :, None] & keep_k[:, None, :])[:, None]


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


def _sink(spec, g, sq, sk, delta: float = SINK_DELTA):
    """An attention sink (arXiv 2606.06521's synthetic setting): Q, K, V ~ N(0, 1) except Q's first coordinate,
    sqrt(D) in every row, and K's: 0 for every key but key 0 (the sink), whose K is delta e_0. With the
    scale 1/sqrt(D), every row scores the sink delta exactly and the other keys ~ N(0, (D - 1) / D)."""
    q, k, v = _randn(sq, g), _randn(sk, g), _randn(sk, g)
    d = sq[-1]
    q[..., 0] = d**0.5
    k[..., 0] = 0.0
    k[..., 0, :] = 0.0
    k[..., 0, 0] = delta
    return q, k, v


def _paper_sinks(spec, g, sq, sk, delta: float):
    """arXiv 2606.06521's own setting: k_sink = 4 sink tokens (keys 0-3) scored delta + N(0, 1) by every row (the
    paper's delta_k ~ 1 is the expected maximum of those 4 normals) and every other score N(0, 1), independent
    across keys: Q's first coordinate sqrt(D), the rest sqrt(D) times a unit vector u; K's first coordinate delta
    for a sink and 0 otherwise, the rest N(0, 1). With the scale 1/sqrt(D) the normal part of a score is u . k,
    N(0, 1) in every row (the study's own "sink" gives each row the variance |q|^2 / D, and one sink at delta)."""
    q, k, v = _randn(sq, g), _randn(sk, g), _randn(sk, g)
    d = sq[-1]
    rest = q[..., 1:]
    q[..., 1:] = d**0.5 * rest / torch.linalg.vector_norm(rest, dim=-1, keepdim=True)
    q[..., 0] = d**0.5
    k[..., 0] = 0.0
    k[..., : min(PAPER_SINKS, sk[-2]), 0] = delta
    return q, k, v


_DRAW = {"normal": _normal, "uniform": _uniform, "outliers": _outliers, "sharp": _sharp, "tied": _tied, "sink": _sink}
