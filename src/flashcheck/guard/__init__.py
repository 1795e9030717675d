"""Guard attention in production: a preferred backend with a counted fallback, circuit breaker, shadow checks
in higher precision, output-norm and latency alarms, logging and Prometheus, transformers registration.

    guard = Guard("sdpa-flash", "sdpa-math", shadow=ShadowConfig(every=100))
    out = guard(q, k, v, causal=True, site="layer3")     # [B, H, L, D]
    register_transformers(guard)                         # attn_implementation="fcguard"
"""

from flashcheck.guard.config import BreakerConfig, MonitorConfig, ShadowConfig
from flashcheck.guard.export import PrometheusExporter, format_stats, log_stats
from flashcheck.guard.guard import REASONS, Guard
from flashcheck.guard.integrations import GuardedAttention, attention_function, register_transformers
from flashcheck.guard.monitor import Alarm
from flashcheck.guard.shadow import ShadowResult
from flashcheck.guard.stats import GuardStats, ShadowStats, SiteStats

__all__ = [
    "REASONS",
    "Alarm",
    "BreakerConfig",
    "Guard",
    "GuardStats",
    "GuardedAttention",
    "MonitorConfig",
    "PrometheusExporter",
    "ShadowConfig",
    "ShadowResult",
    "ShadowStats",
    "SiteStats",
    "attention_function",
    "format_stats",
    "log_stats",
    "register_transformers",
]
