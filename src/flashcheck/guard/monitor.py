"""Per-site running statistics with bands: output RMS (level drift) and latency per unit of work (variance).

Both follow one pattern: the first `warmup` calls of a site set a baseline (mean and variance, Welford);
from then on an EWMA of the recent values is compared with the baseline's band. The baseline stays fixed
(an adapting band would follow a slow drift and never fire); `rebaseline()` starts a new warm-up after a
deliberate change. An alarm is raised when the recent value leaves the band and cleared (with
hysteresis) when it is back well inside."""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashcheck.guard.config import MonitorConfig

RAISED, CLEARED = "raised", "cleared"


@dataclass(frozen=True, slots=True)
class Alarm:
    """An alarm raised by the guard. kind: norm | latency | shadow | breaker | environment."""

    kind: str
    site: str
    call: int
    """The site's call count when it was raised (0: at construction)."""
    message: str
    value: float
    bound: float


class Welford:
    """Mean and variance of a stream (numerically stable)."""

    __slots__ = ("m2", "mean", "n")

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


class Ewma:
    """Exponentially weighted mean and variance (weight `alpha` for the newest value)."""

    __slots__ = ("alpha", "mean", "var")

    def __init__(self, alpha: float) -> None:
        self.alpha, self.mean, self.var = alpha, math.nan, 0.0

    def add(self, x: float) -> None:
        if math.isnan(self.mean):
            self.mean = x
            return
        d = x - self.mean
        inc = self.alpha * d
        self.mean += inc
        self.var = (1.0 - self.alpha) * (self.var + d * inc)


class _Banded:
    """Baseline + EWMA + alarm state; subclasses say when the recent statistics are out of band."""

    def __init__(self, warmup: int, alpha: float) -> None:
        self.warmup, self.alpha = warmup, alpha
        self.rebaseline()

    def rebaseline(self) -> None:
        self.base, self.recent, self.active = Welford(), Ewma(self.alpha), False

    @property
    def warm(self) -> bool:
        return self.base.n >= self.warmup

    def add(self, x: float) -> str | None:
        """Add one value; RAISED / CLEARED when the alarm state changed, else None."""
        if not math.isfinite(x):
            return None
        if not self.warm:
            self.base.add(x)
            self.recent.add(x)
            return None
        self.recent.add(x)
        if not self.active and self.outside():
            self.active = True
            return RAISED
        if self.active and self.back_inside():
            self.active = False
            return CLEARED
        return None

    def outside(self) -> bool:
        raise NotImplementedError

    def back_inside(self) -> bool:
        raise NotImplementedError


class NormBand(_Banded):
    """Output RMS of one site: the recent level (EWMA) against baseline mean +- max(z std, min_rel mean)."""

    def __init__(self, cfg: MonitorConfig) -> None:
        self.z, self.min_rel = cfg.norm_z, cfg.norm_min_rel
        super().__init__(cfg.warmup, cfg.norm_alpha)

    @property
    def band(self) -> float:
        return max(self.z * math.sqrt(self.base.var), self.min_rel * abs(self.base.mean))

    @property
    def deviation(self) -> float:
        return abs(self.recent.mean - self.base.mean)

    @property
    def zscore(self) -> float:
        """(recent level - baseline mean) / baseline std (nan before the warm-up ends)."""
        sd = math.sqrt(self.base.var)
        if not self.warm:
            return math.nan
        return (self.recent.mean - self.base.mean) / sd if sd > 0 else 0.0

    def outside(self) -> bool:
        return self.deviation > self.band

    def back_inside(self) -> bool:
        return self.deviation <= 0.5 * self.band


class LatencyBand(_Banded):
    """Latency per unit of work of one site: recent (EWMA) variance against the warm-up variance."""

    def __init__(self, cfg: MonitorConfig) -> None:
        self.ratio, self.min_cv = cfg.latency_ratio, cfg.latency_min_cv
        super().__init__(cfg.warmup, cfg.latency_alpha)

    @property
    def var_ratio(self) -> float:
        """Recent variance / warm-up variance (nan before the warm-up ends, inf over a zero variance)."""
        if not self.warm:
            return math.nan
        if self.base.var > 0:
            return self.recent.var / self.base.var
        return math.inf if self.recent.var > 0 else 1.0

    @property
    def bound(self) -> float:
        """The variance above which the alarm fires."""
        return max(self.ratio * self.base.var, (self.min_cv * self.base.mean) ** 2)

    def outside(self) -> bool:
        return self.recent.var > self.bound

    def back_inside(self) -> bool:
        return self.recent.var <= max(math.sqrt(self.ratio) * self.base.var, (self.min_cv * self.base.mean) ** 2)
