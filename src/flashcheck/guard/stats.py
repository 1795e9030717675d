"""What the guard counts per call site, and the frozen snapshot that `Guard.stats()` returns."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from flashcheck.guard.config import MonitorConfig
from flashcheck.guard.monitor import LatencyBand, NormBand

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class ShadowStats:
    """Shadow checks of one site (or all): how many ran, failed the budget, were dropped; worst errors."""

    checks: int = 0
    failed: int = 0
    dropped: int = 0
    errors: int = 0
    """Checks that could not run (the reference or baseline raised; logged)."""
    skipped: int = 0
    """Sampled calls not checked, to keep the checks' time under max_overhead of the serving time."""
    worst_max_abs: float = 0.0
    worst_rel_l2: float = 0.0
    worst_budget_ratio: float = 0.0
    """Largest max-error / bound seen (> 1 failed)."""


@dataclass(frozen=True, slots=True)
class SiteStats:
    """One call site (e.g. one layer). Latencies in seconds; `norm_*` is the output RMS."""

    site: str
    calls: int
    served_preferred: int
    served_fallback: int
    fallbacks: dict[str, int]
    nonfinite_outputs: int
    nonfinite_served: int
    nonfinite_inputs: int
    shadow: ShadowStats
    alarms: dict[str, int]
    active_alarms: tuple[str, ...]
    norm_baseline_mean: float
    norm_baseline_std: float
    norm_recent: float
    norm_z: float
    latency_count: int
    latency_mean_s: float
    latency_percentiles_s: dict[int, float]
    latency_var_ratio: float
    """Recent / warm-up variance of the latency per unit of work (the latency alarm's statistic)."""


@dataclass(frozen=True, slots=True)
class GuardStats:
    """A snapshot of a guard: totals over sites, the breaker, the environment check, and each site."""

    preferred: str
    fallback: str
    breaker: str
    breaker_opened: int
    calls: int
    served_preferred: int
    served_fallback: int
    fallbacks: dict[str, int]
    nonfinite_outputs: int
    nonfinite_served: int
    shadow: ShadowStats
    alarms: dict[str, int]
    latency_percentiles_s: dict[int, float]
    environment: tuple[str, ...]
    sites: dict[str, SiteStats] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class SiteState:
    """Mutable counters of one site; the guard updates them under its lock."""

    def __init__(self, name: str, cfg: MonitorConfig) -> None:
        self.name = name
        self.calls = self.served_preferred = self.served_fallback = 0
        self.fallbacks: Counter[str] = Counter()
        self.nonfinite_outputs = self.nonfinite_served = self.nonfinite_inputs = 0
        self.norm, self.latency = NormBand(cfg), LatencyBand(cfg)
        self.latencies: deque[float] = deque(maxlen=cfg.percentile_window)
        self.latency_count, self.latency_sum = 0, 0.0
        self.shadow_checks = self.shadow_failed = self.shadow_dropped = self.shadow_errors = 0
        self.shadow_skipped = 0
        self.worst_max_abs = self.worst_rel_l2 = self.worst_ratio = 0.0
        self.shadow_active = False
        self.alarms: Counter[str] = Counter()

    def shadow_stats(self) -> ShadowStats:
        return ShadowStats(
            self.shadow_checks,
            self.shadow_failed,
            self.shadow_dropped,
            self.shadow_errors,
            self.shadow_skipped,
            self.worst_max_abs,
            self.worst_rel_l2,
            self.worst_ratio,
        )

    def active(self) -> tuple[str, ...]:
        flags = {"norm": self.norm.active, "latency": self.latency.active, "shadow": self.shadow_active}
        return tuple(k for k, on in flags.items() if on)

    def snapshot(self) -> SiteStats:
        n = self.latency_count
        return SiteStats(
            site=self.name,
            calls=self.calls,
            served_preferred=self.served_preferred,
            served_fallback=self.served_fallback,
            fallbacks=dict(self.fallbacks),
            nonfinite_outputs=self.nonfinite_outputs,
            nonfinite_served=self.nonfinite_served,
            nonfinite_inputs=self.nonfinite_inputs,
            shadow=self.shadow_stats(),
            alarms=dict(self.alarms),
            active_alarms=self.active(),
            norm_baseline_mean=self.norm.base.mean,
            norm_baseline_std=math.sqrt(self.norm.base.var),
            norm_recent=self.norm.recent.mean,
            norm_z=self.norm.zscore,
            latency_count=n,
            latency_mean_s=self.latency_sum / n if n else math.nan,
            latency_percentiles_s=percentiles(self.latencies),
            latency_var_ratio=self.latency.var_ratio,
        )


def percentiles(values, ps: tuple[int, ...] = PERCENTILES) -> dict[int, float]:
    """Nearest-rank percentiles of `values` (nan for an empty sample)."""
    xs = sorted(values)
    if not xs:
        return {p: math.nan for p in ps}
    return {p: xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))] for p in ps}


def total(sites: list[SiteStats], **guard_fields) -> GuardStats:
    """Totals over `sites` (pooling their recent latencies for the percentiles)."""
    fallbacks: Counter[str] = Counter()
    alarms: Counter[str] = Counter(guard_fields.pop("guard_alarms", {}))
    for s in sites:
        fallbacks.update(s.fallbacks)
        alarms.update(s.alarms)
    sh = [s.shadow for s in sites]
    shadow = ShadowStats(
        sum(x.checks for x in sh),
        sum(x.failed for x in sh),
        sum(x.dropped for x in sh),
        sum(x.errors for x in sh),
        sum(x.skipped for x in sh),
        max((x.worst_max_abs for x in sh), default=0.0),
        max((x.worst_rel_l2 for x in sh), default=0.0),
        max((x.worst_budget_ratio for x in sh), default=0.0),
    )
    pooled = guard_fields.pop("pooled_latencies", [])
    return GuardStats(
        calls=sum(s.calls for s in sites),
        served_preferred=sum(s.served_preferred for s in sites),
        served_fallback=sum(s.served_fallback for s in sites),
        fallbacks=dict(fallbacks),
        nonfinite_outputs=sum(s.nonfinite_outputs for s in sites),
        nonfinite_served=sum(s.nonfinite_served for s in sites),
        shadow=shadow,
        alarms=dict(alarms),
        latency_percentiles_s=percentiles(pooled),
        sites={s.site: s for s in sites},
        **guard_fields,
    )
