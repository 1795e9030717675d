"""The measurement layer: a Method parsed once, a Case run against the FP64 reference into a Record, the one
baseline rule, attribution of error to stages, and determinism checks."""

from flashcheck.measure.case import HEADLINE, METRICS, Case, Record, References, run_case
from flashcheck.measure.method import Method, Unavailable, baseline_name, parse_method

__all__ = [
    "HEADLINE",
    "METRICS",
    "Case",
    "Method",
    "Record",
    "References",
    "Unavailable",
    "baseline_name",
    "parse_method",
    "run_case",
]
