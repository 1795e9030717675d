"""The guard's settings: circuit breaker, shadow checks and monitoring, each a keyword-only frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcheck.guard.adapters import K_FORWARD, RULES


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}.{name}={value!r} is not allowed; expected a number > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerConfig:
    """When to stop trying the preferred backend, and when to try it again."""

    faults: int = 5
    """Faults (exceptions or non-finite outputs) within `window_s` that pin the fallback."""
    window_s: float = 60.0
    """Length of the sliding window that faults are counted in, in seconds of the guard's clock."""
    cooldown_s: float = 30.0
    """Seconds the fallback stays pinned; then one call tries the preferred backend again."""

    def __post_init__(self) -> None:
        _positive("BreakerConfig", faults=self.faults, window_s=self.window_s, cooldown_s=self.cooldown_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowConfig:
    """Which calls are recomputed in higher precision, and how the served output is judged.

    A checked call's served output is compared with `reference` run at `reference_dtype`; it passes when
    max |out - ref| <= k * max |baseline - ref| + floor (and likewise for the mean), `baseline` being
    `baseline` run in the served output's dtype: the project's budget rule (flashcheck.core.budget), its floor
    raised to the rounding allowance of a correct kernel where that is larger (flashcheck.guard.allowance)."""

    every: int = 0
    """Check every N-th call of each site (0: off)."""
    probability: float = 0.0
    """Or check each call with this probability (drawn from a generator seeded with `seed`)."""
    reference: str = "sdpa-math"
    """Backend that computes the reference, run at `reference_dtype`."""
    reference_dtype: torch.dtype = torch.float64
    """Precision of the reference (float64: the exact oracle)."""
    baseline: str = "eager"
    """Backend run in the served dtype whose error sets the budget (the peers' same-precision baseline)."""
    k: float = K_FORWARD
    """Budget factor: allowed error = k x the baseline's error + the rounding floor."""
    rule: str = "peers"
    """Budget rule (flashcheck.core.budget): "peers", the max and mean errors of the peers' tests (few false
    alarms: the right default for an alarm), or "flashcheck", which adds error-energy, gain and per-row views."""
    max_heads: int | None = 32
    """At most this many (batch, head) slices are recomputed per check (None: all); bounds the cost."""
    max_overhead: float | None = 0.05
    """Skip a sampled check while the time spent in checks exceeds this fraction of the time spent serving
    calls (counted as skipped; None: never skip). Bounds the overhead whatever the machine."""
    background: bool = False
    """Run checks on a worker thread so that the call returns without waiting for them."""
    queue_size: int = 16
    """Checks waiting for the worker at most; a check that finds the queue full is dropped (and counted)."""
    copy_inputs: bool = True
    """Copy the tensors of a background check (set False only if callers never modify them in place)."""
    seed: int = 0
    """Seed of the sampling and of the choice of slices."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"ShadowConfig.every={self.every!r} is not allowed; expected 0 (off) or N >= 1")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"ShadowConfig.probability={self.probability!r} is not allowed; expected 0..1")
        if self.max_heads is not None:
            _positive("ShadowConfig", max_heads=self.max_heads)
        if self.rule not in RULES:
            raise ValueError(f"ShadowConfig.rule={self.rule!r} is not allowed; expected one of {', '.join(RULES)}")
        if self.max_overhead is not None:
            _positive("ShadowConfig", max_overhead=self.max_overhead)
        _positive("ShadowConfig", k=self.k, queue_size=self.queue_size)

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.probability > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorConfig:
    """Per-site output-norm and latency statistics, and the bands that raise alarms."""

    warmup: int = 100
    """Calls per site that set the baseline (mean and variance); no alarm before."""
    norm_alpha: float = 0.05
    """Weight of a new call in the EWMA of the output RMS (the recent level)."""
    norm_z: float = 6.0
    """The norm alarm fires when the recent level leaves baseline mean +- norm_z x baseline std."""
    norm_min_rel: float = 0.01
    """...or +- this fraction of the baseline mean, whichever is wider (a floor for near-constant norms)."""
    latency_alpha: float = 0.05
    """Weight of a new call in the EWMA mean and variance of the latency per unit of work."""
    latency_ratio: float = 4.0
    """The latency alarm fires when the recent variance exceeds latency_ratio x the warm-up variance..."""
    latency_min_cv: float = 0.05
    """...and the recent standard deviation exceeds this fraction of the warm-up mean."""
    percentile_window: int = 1024
    """Latencies kept per site for the percentiles in stats()."""

    def __post_init__(self) -> None:
        if self.warmup < 2:
            raise ValueError(f"MonitorConfig.warmup={self.warmup!r} is not allowed; expected >= 2 calls")
        _positive(
            "MonitorConfig",
            norm_z=self.norm_z,
            latency_ratio=self.latency_ratio,
            percentile_window=self.percentile_window,
        )
        for name in ("norm_alpha", "latency_alpha"):
            a = getattr(self, name)
            if not 0.0 < a <= 1.0:
                raise ValueError(f"MonitorConfig.{name}={a!r} is not allowed; expected 0 < alpha <= 1")
        if self.norm_min_rel < 0 or self.latency_min_cv < 0:
            raise ValueError("MonitorConfig.norm_min_rel and latency_min_cv must be >= 0")
