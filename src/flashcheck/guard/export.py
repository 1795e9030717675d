"""The guard's counters for people and for scrapers: a text table through `logging`, Prometheus metrics.

prometheus_client is imported only when a PrometheusExporter is made (`pip install flashcheck[guard]`)."""

from __future__ import annotations

import logging
import math
import threading

from flashcheck.guard.monitor import Alarm
from flashcheck.guard.shadow import ShadowResult
from flashcheck.guard.stats import GuardStats

log = logging.getLogger("flashcheck.guard")

LATENCY_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
ERROR_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def format_stats(s: GuardStats) -> str:
    """A snapshot as text: one line of totals, then one row per site."""
    fb = ", ".join(f"{k} {v}" for k, v in sorted(s.fallbacks.items())) or "none"
    al = ", ".join(f"{k} {v}" for k, v in sorted(s.alarms.items())) or "none"
    p = s.latency_percentiles_s
    lines = [
        f"guard {s.preferred} -> {s.fallback}: {s.calls} calls, {s.served_fallback} served by the fallback "
        f"({fb}); breaker {s.breaker} (opened {s.breaker_opened}x); non-finite outputs {s.nonfinite_outputs} "
        f"(served {s.nonfinite_served}); shadow {s.shadow.checks} checks, {s.shadow.failed} over budget, "
        f"worst rel L2 {s.shadow.worst_rel_l2:.2e}; alarms: {al}; "
        f"latency p50 {_ms(p[50], ' ms')} p99 {_ms(p[99], ' ms')}",
    ]
    if s.environment:
        lines.append("environment differs from the pin: " + "; ".join(s.environment))
    head = f"{'site':<16}{'calls':>8}{'fallback':>9}{'nonfin':>7}{'shadow':>8}{'over':>5}{'worst relL2':>12}"
    lines.append(head + f"{'norm z':>8}{'p50 ms':>9}{'p99 ms':>9}{'var x':>7}  active alarms")
    for st in s.sites.values():
        lp = st.latency_percentiles_s
        lines.append(
            f"{st.site:<16}{st.calls:>8}{st.served_fallback:>9}{st.nonfinite_outputs:>7}{st.shadow.checks:>8}"
            f"{st.shadow.failed:>5}{st.shadow.worst_rel_l2:>12.2e}{_num(st.norm_z, '+.1f'):>8}{_ms(lp[50]):>9}"
            f"{_ms(lp[99]):>9}{_num(st.latency_var_ratio, '.1f'):>7}  {', '.join(st.active_alarms) or '-'}"
        )
    return "\n".join(lines)


def log_stats(s: GuardStats, level: int = logging.INFO, logger: logging.Logger = log) -> None:
    """Emit `format_stats(s)` through logging, one record per line."""
    for line in format_stats(s).splitlines():
        logger.log(level, "%s", line)


def _ms(seconds: float, unit: str = "") -> str:
    """Milliseconds with 3 decimals (and `unit`), or "-" when nothing was timed."""
    return "-" if math.isnan(seconds) else f"{1e3 * seconds:.3f}{unit}"


def _num(x: float, spec: str) -> str:
    return "-" if math.isnan(x) else format(x, spec)


class PrometheusExporter:
    """Guard events as Prometheus metrics, labelled by `site`, in `registry` (default: the global one).

    Counters (`<ns>_calls_total{site,served_by}`, `_fallbacks_total{site,reason}`,
    `_shadow_checks_total{site,verdict}`, `_alarms_total{site,kind}`, `_breaker_transitions_total{state}`),
    histograms (`_latency_seconds{site}`, `_shadow_max_abs_error{site}`) and gauges (`_output_rms{site}`,
    `_shadow_worst_max_abs_error{site}`, `_breaker_open`). Pass it to Guard(exporters=[...]); serve it with
    `serve(port)` or your application's own endpoint."""

    def __init__(self, registry=None, namespace: str = "flashcheck_guard") -> None:
        try:
            import prometheus_client as pc
        except ImportError as e:
            raise ImportError("PrometheusExporter needs prometheus_client: pip install 'flashcheck[guard]'") from e
        self._pc = pc
        self.registry = registry if registry is not None else pc.REGISTRY
        kw = {"namespace": namespace, "registry": self.registry}
        self.calls = pc.Counter("calls", "Attention calls through the guard", ["site", "served_by"], **kw)
        self.fallbacks = pc.Counter("fallbacks", "Calls served by the fallback, by reason", ["site", "reason"], **kw)
        self.shadow_checks = pc.Counter("shadow_checks", "Shadow checks by verdict", ["site", "verdict"], **kw)
        self.alarms = pc.Counter("alarms", "Alarms raised, by kind", ["site", "kind"], **kw)
        self.breaker = pc.Counter("breaker_transitions", "Circuit breaker transitions", ["state"], **kw)
        self.latency = pc.Histogram("latency_seconds", "Call latency", ["site"], buckets=LATENCY_BUCKETS, **kw)
        self.shadow_error = pc.Histogram(
            "shadow_max_abs_error", "Max abs error of checked outputs", ["site"], buckets=ERROR_BUCKETS, **kw
        )
        self.output_rms = pc.Gauge("output_rms", "RMS of the last output", ["site"], **kw)
        self.shadow_worst = pc.Gauge("shadow_worst_max_abs_error", "Worst shadow max abs error", ["site"], **kw)
        self.breaker_open = pc.Gauge("breaker_open", "1 while the fallback is pinned", **kw)
        self._worst: dict[str, float] = {}
        self._lock = threading.Lock()

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Serve this registry at http://addr:port/metrics on a daemon thread; returns (server, thread)."""
        return self._pc.start_http_server(port, addr=addr, registry=self.registry)

    def on_call(self, site: str, served_by: str, latency_s: float, rms: float) -> None:
        self.calls.labels(site, served_by).inc()
        self.latency.labels(site).observe(latency_s)
        if math.isfinite(rms):
            self.output_rms.labels(site).set(rms)

    def on_fallback(self, site: str, reason: str) -> None:
        self.fallbacks.labels(site, reason).inc()

    def on_shadow(self, r: ShadowResult) -> None:
        self.shadow_checks.labels(r.site, "pass" if r.passed else "fail").inc()
        self.shadow_error.labels(r.site).observe(r.max_abs)
        with self._lock:
            worst = self._worst[r.site] = max(self._worst.get(r.site, 0.0), r.max_abs)
        self.shadow_worst.labels(r.site).set(worst)

    def on_alarm(self, a: Alarm) -> None:
        self.alarms.labels(a.site, a.kind).inc()

    def on_breaker(self, state: str) -> None:
        self.breaker.labels(state).inc()
        self.breaker_open.set(1.0 if state == "open" else 0.0)
