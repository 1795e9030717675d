"""`Guard`: attention through a preferred backend with a counted, logged fallback, shadow checks and alarms.

Shapes: q [B, H, Lq, D], k and v [B, Hkv, Lk, D] (Hkv divides H), mask bool (True = keep) or additive,
broadcastable to [B, H, Lq, Lk]; the output is [B, H, Lq, Dv]."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

import flashcheck.guard.adapters as adapters
from flashcheck.guard.breaker import CLOSED, OPEN, CircuitBreaker
from flashcheck.guard.config import BreakerConfig, MonitorConfig, ShadowConfig
from flashcheck.guard.monitor import RAISED, Alarm
from flashcheck.guard.shadow import Sampler, ShadowChecker, ShadowResult, make_job
from flashcheck.guard.stats import GuardStats, SiteState, total

log = logging.getLogger("flashcheck.guard")

PREFERRED, FALLBACK = "preferred", "fallback"
REASONS = ("exception", "nonfinite", "breaker_open", "unavailable")
"""Why a call was served by the fallback: the preferred raised; returned NaN/Inf from finite inputs; the
breaker had pinned the fallback; the preferred cannot run this dtype on this device."""


@dataclass(slots=True)
class _Served:
    out: torch.Tensor
    rms: float
    finite: bool
    served_by: str
    reason: str | None = None
    error: str = ""
    preferred_nonfinite: bool = False
    inputs_nonfinite: bool = False
    breaker: str | None = None


class Guard:
    """A callable with the attention signature that never raises for a fault of the preferred backend
    while the fallback works. See docs/guard.md, "Guard attention in production".

    preferred, fallback: backend names (`flashcheck backends`) or Backend objects. breaker: when to pin the
    fallback (None: never). shadow: which calls to recompute in higher precision (None: none). monitor: the
    norm and latency bands. pin: a pin file of `flashcheck validate --pin`, compared with this environment
    now (`impl`: the name the pin uses for this attention, default the preferred backend's name). on_alarm:
    called with each Alarm. exporters: objects with on_call/on_fallback/on_shadow/on_alarm/on_breaker (e.g.
    PrometheusExporter). clock: seconds, monotonic (inject one to make latencies deterministic). device:
    where availability is checked at construction (default cuda if visible, else cpu)."""

    def __init__(
        self,
        preferred: str | adapters.Backend = "sdpa-flash",
        fallback: str | adapters.Backend = "sdpa-math",
        *,
        breaker: BreakerConfig | None = BreakerConfig(),
        shadow: ShadowConfig | None = None,
        monitor: MonitorConfig = MonitorConfig(),
        pin: str | None = None,
        impl: str | None = None,
        on_alarm: Callable[[Alarm], None] | None = None,
        exporters: Iterable[object] = (),
        clock: Callable[[], float] = time.perf_counter,
        device: str | torch.device | None = None,
    ) -> None:
        self.preferred, self.fallback = adapters.resolve(preferred), adapters.resolve(fallback)
        self.monitor, self.shadow_config = monitor, shadow
        self._clock, self._on_alarm, self.exporters = clock, on_alarm, list(exporters)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        ok, why = adapters.available(self.fallback, None, dev)
        if not ok:
            raise ValueError(f"fallback backend {self.fallback.name!r} cannot run on {dev.type}: {why}")
        self._lock = threading.Lock()
        self._sites: dict[str, SiteState] = {}
        self._breaker = CircuitBreaker(breaker)
        self._usable: dict[tuple[torch.dtype, str], tuple[bool, str]] = {}
        self._guard_alarms: Counter[str] = Counter()
        self._recent: deque[Alarm] = deque(maxlen=256)
        self._warned: set[str] = set()
        enabled = shadow is not None and shadow.enabled
        self._sampler = Sampler(shadow) if enabled else None
        self._shadow = ShadowChecker(shadow, self._record_shadow, self._shadow_error, clock) if enabled else None
        self._served_s = self._shadow_s = 0.0  # time serving calls and in shadow checks (the overhead cap)
        self.environment = self._check_environment(pin, impl or self.preferred.name, dev)

    # ---- the call ---------------------------------------------------------------------------------------
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        scale: float | None = None,
        mask: torch.Tensor | None = None,
        site: str = "attention",
    ) -> torch.Tensor:
        """Attention of q [B, H, Lq, D] over k, v [B, Hkv, Lk, D] -> [B, H, Lq, Dv], recorded under `site`."""
        k, v = _checked(q, k, v, mask, scale)
        t0 = self._clock()
        served = self._serve(q, k, v, causal, scale, mask)
        latency = self._clock() - t0
        alarms, shadow_idx, call = self._record(site, served, latency, _work(q, k, v))
        for exp in self.exporters:
            exp.on_call(site, served.served_by, latency, served.rms)
            if served.reason:
                exp.on_fallback(site, served.reason)
        self._after_call(site, served, alarms)
        if shadow_idx is not False:
            self._submit_shadow(site, call, served, q, k, v, causal, scale, mask, shadow_idx)
        return served.out

    def _serve(self, q, k, v, causal, scale, mask) -> _Served:
        """Run the preferred backend (unless pinned or unusable), and the fallback where it faulted."""
        run = {"causal": causal, "scale": scale, "mask": mask}
        ok, why = self._preferred_usable(q)
        if not ok:
            reason, error, breaker = "unavailable", why, None
        elif not self._breaker.allow(self._clock()):
            reason, error, breaker = "breaker_open", "", None
        else:
            try:
                out = adapters.run(self.preferred, q, k, v, **run)
            except Exception as e:
                reason, error = "exception", f"{type(e).__name__}: {e}"
            else:
                rms, finite = _rms(out)
                if finite:
                    return _Served(out, rms, True, PREFERRED, breaker=self._breaker.success())
                if not _all_finite(q, k, v):  # NaN in, NaN out: not the backend's fault
                    b = self._breaker.success()
                    return _Served(out, rms, False, PREFERRED, None, "", True, True, b)
                reason, error = "nonfinite", "non-finite output from finite inputs"
            breaker = self._breaker.failure(self._clock())
        out = adapters.run(self.fallback, q, k, v, **run)
        rms, finite = _rms(out)
        return _Served(out, rms, finite, FALLBACK, reason, error, reason == "nonfinite", False, breaker)

    def _preferred_usable(self, q: torch.Tensor) -> tuple[bool, str]:
        key = (q.dtype, q.device.type)
        if key not in self._usable:
            self._usable[key] = adapters.available(self.preferred, q.dtype, q.device)
        return self._usable[key]

    # ---- bookkeeping ------------------------------------------------------------------------------------
    def _site(self, site: str) -> SiteState:
        st = self._sites.get(site)
        if st is None:
            st = self._sites[site] = SiteState(site, self.monitor)
        return st

    def _record(self, site: str, s: _Served, latency: float, work: float) -> tuple[list[Alarm], object, int]:
        """Count one call under the lock; returns (alarms raised, shadow slices or False, the site's call no.)."""
        alarms = []
        with self._lock:
            st = self._site(site)
            st.calls += 1
            call = st.calls
            if s.served_by == PREFERRED:
                st.served_preferred += 1
            else:
                st.served_fallback += 1
                st.fallbacks[s.reason] += 1
            st.nonfinite_outputs += int(s.preferred_nonfinite) + int(s.served_by == FALLBACK and not s.finite)
            st.nonfinite_served += int(not s.finite)
            st.nonfinite_inputs += int(s.inputs_nonfinite)
            st.latencies.append(latency)
            st.latency_count += 1
            st.latency_sum += latency
            self._served_s += latency
            if s.finite and st.norm.add(s.rms) == RAISED:
                alarms.append(self._alarm_locked(st, "norm", _norm_message(st), st.norm.recent.mean, st.norm.band))
            if work > 0 and st.latency.add(latency / work) == RAISED:
                b = st.latency
                alarms.append(self._alarm_locked(st, "latency", _latency_message(st), b.recent.var, b.bound))
            if s.breaker == OPEN:
                self._guard_alarms["breaker"] += 1
            take = self._take_shadow_locked(st, s)
            idx = self._sampler.slices(q_slices(s.out)) if take else False
        return alarms, idx, call

    def _take_shadow_locked(self, st: SiteState, s: _Served) -> bool:
        """Whether this call is checked: sampled, finite, and the checks' time within max_overhead."""
        if self._sampler is None or not s.finite or s.out.numel() == 0 or not self._sampler.take(st.calls):
            return False
        cap = self.shadow_config.max_overhead
        if cap is not None and self._shadow_s > cap * self._served_s:
            st.shadow_skipped += 1
            return False
        return True

    def _alarm_locked(self, st: SiteState, kind: str, message: str, value: float, bound: float) -> Alarm:
        st.alarms[kind] += 1
        return Alarm(kind, st.name, st.calls, message, value, bound)

    def _after_call(self, site: str, s: _Served, alarms: list[Alarm]) -> None:
        """Log the fallback and the breaker's change; emit the alarms (outside the lock)."""
        if s.reason in ("exception", "nonfinite"):
            log.warning(
                "site %s: preferred %s faulted (%s: %s); served by fallback %s",
                site,
                self.preferred.name,
                s.reason,
                s.error,
                self.fallback.name,
            )
        elif s.reason and s.reason not in self._warned:
            self._warned.add(s.reason)
            log.warning(
                "site %s: served by fallback %s (%s%s); logged once, counted always",
                site,
                self.fallback.name,
                s.reason,
                f": {s.error}" if s.error else "",
            )
        if s.breaker == OPEN:
            cfg = self._breaker.config
            msg = f"{cfg.faults} faults within {cfg.window_s:g} s: fallback pinned for {cfg.cooldown_s:g} s"
            alarms = [*alarms, Alarm("breaker", "*", 0, f"circuit breaker opened: {msg}", cfg.faults, cfg.faults)]
        elif s.breaker == CLOSED:
            log.warning("circuit breaker closed: preferred %s is healthy again", self.preferred.name)
        if s.breaker:
            for exp in self.exporters:
                exp.on_breaker(s.breaker)
        for a in alarms:
            self._emit(a)

    def _emit(self, alarm: Alarm) -> None:
        self._recent.append(alarm)
        log.warning("ALARM %s at site %s (call %d): %s", alarm.kind, alarm.site, alarm.call, alarm.message)
        for exp in self.exporters:
            exp.on_alarm(alarm)
        if self._on_alarm is not None:
            self._on_alarm(alarm)

    # ---- shadow checks ----------------------------------------------------------------------------------
    def _submit_shadow(self, site, call, s: _Served, q, k, v, causal, scale, mask, idx) -> None:
        copy = self.shadow_config.background and self.shadow_config.copy_inputs
        working = adapters.working_dtype(self.preferred if s.served_by == PREFERRED else self.fallback, q.dtype)
        job = make_job(site, call, s.served_by, q, k, v, s.out, causal, scale, mask, idx, copy, working)
        if not self._shadow.submit(job):
            with self._lock:
                self._sites[site].shadow_dropped += 1

    def _record_shadow(self, r: ShadowResult, seconds: float) -> None:
        alarm = None
        with self._lock:
            self._shadow_s += seconds
            st = self._sites[r.site]
            st.shadow_checks += 1
            st.shadow_failed += int(not r.passed)
            st.worst_max_abs = max(st.worst_max_abs, r.max_abs)
            st.worst_rel_l2 = max(st.worst_rel_l2, r.rel_l2)
            st.worst_ratio = max(st.worst_ratio, r.ratio)
            if not r.passed and not st.shadow_active:
                st.shadow_active = True
                msg = (
                    f"served output ({r.served_by}) over budget at call {r.call}: {'; '.join(r.failed)} "
                    f"(max error {r.max_abs:.3e}, bound {r.bound:.3e}, rel L2 {r.rel_l2:.2e})"
                )
                alarm = self._alarm_locked(st, "shadow", msg, r.max_abs, r.bound)
            elif r.passed:
                st.shadow_active = False
        for exp in self.exporters:
            exp.on_shadow(r)
        if alarm is not None:
            self._emit(alarm)

    def _shadow_error(self, site: str, message: str) -> None:
        with self._lock:
            self._sites[site].shadow_errors += 1

    # ---- environment ------------------------------------------------------------------------------------
    def _check_environment(self, pin: str | None, impl: str, dev: torch.device) -> tuple[str, ...]:
        """Differences from the pin file, and a preferred backend that cannot run here; each raises an alarm."""
        diffs = []
        ok, why = adapters.available(self.preferred, None, dev)
        if not ok:
            diffs.append(f"preferred backend {self.preferred.name!r} cannot run on {dev.type}: {why}")
        if pin is not None:
            diffs += adapters.environment_differences(pin, impl)
        for d in diffs:
            self._guard_alarms["environment"] += 1
            self._emit(Alarm("environment", "*", 0, d, math.nan, math.nan))
        return tuple(diffs)

    # ---- public -----------------------------------------------------------------------------------------
    @property
    def breaker_state(self) -> str:
        """closed, open or half-open."""
        return self._breaker.state

    def stats(self) -> GuardStats:
        """A consistent snapshot of every counter (taken under the lock; queued shadow checks not included)."""
        with self._lock:
            sites = [st.snapshot() for st in self._sites.values()]
            pooled = [x for st in self._sites.values() for x in st.latencies]
            guard_alarms = dict(self._guard_alarms)
        return total(
            sites,
            preferred=self.preferred.name,
            fallback=self.fallback.name,
            breaker=self._breaker.state,
            breaker_opened=self._breaker.opened,
            environment=self.environment,
            guard_alarms=guard_alarms,
            pooled_latencies=pooled,
        )

    def alarms(self) -> list[Alarm]:
        """The most recent alarms (up to 256), oldest first."""
        return list(self._recent)

    def rebaseline(self, site: str | None = None) -> None:
        """Start a new warm-up of the norm and latency bands (of one site, or all) after a deliberate change."""
        with self._lock:
            for st in self._sites.values():
                if site is None or st.name == site:
                    st.norm.rebaseline()
                    st.latency.rebaseline()

    def flush(self) -> None:
        """Wait for queued background shadow checks to be recorded."""
        if self._shadow is not None:
            self._shadow.flush()

    def close(self) -> None:
        """Finish queued shadow checks and stop the worker thread."""
        if self._shadow is not None:
            self._shadow.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _checked(q, k, v, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (ValueError: bad input is not a backend fault); k, v with q's heads (grouped-query repeated)."""
    adapters.check_inputs(q, k, v, mask, scale)
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    return k, v


def _rms(out: torch.Tensor) -> tuple[float, bool]:
    """Root mean square of out, and whether every element is finite (one reduction when it is)."""
    n = out.numel()
    if n == 0:
        return 0.0, True
    norm = float(torch.linalg.vector_norm(out.detach()))
    if math.isfinite(norm):
        return norm / math.sqrt(n), True
    if not bool(torch.isfinite(out).all()):
        return math.nan, False
    return float(torch.linalg.vector_norm(out.detach(), dtype=torch.float64)) / math.sqrt(n), True  # overflow


def _all_finite(*ts: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


def _work(q, k, v) -> float:
    """GFLOP of one attention call: 2 B H Lq Lk (D + Dv)."""
    b, h, lq, d = q.shape
    return 2e-9 * b * h * lq * k.shape[-2] * (d + v.shape[-1])


def q_slices(out: torch.Tensor) -> int:
    return out.shape[0] * out.shape[1]


def _norm_message(st: SiteState) -> str:
    n = st.norm
    return f"output RMS level {n.recent.mean:.4g} left the band {n.base.mean:.4g} +- {n.band:.3g} (z = {n.zscore:+.1f})"


def _latency_message(st: SiteState) -> str:
    b = st.latency
    return f"latency variance {b.var_ratio:.1f}x its warm-up level (per unit of work, bound x{b.ratio:g})"
