"""`flashcheck validate`: a real model under each attention implementation and number format, compared
with the reference (eager, fp32) and judged against the deviation the format alone causes."""

from flashcheck.validate.result import Check, Comparison, LayerDeviation, Skipped, ValidationResult
from flashcheck.validate.runner import DEFAULT_DTYPES, DEFAULT_IMPLS, Settings, validate_model

__all__ = [
    "DEFAULT_DTYPES",
    "DEFAULT_IMPLS",
    "Check",
    "Comparison",
    "LayerDeviation",
    "Settings",
    "Skipped",
    "ValidationResult",
    "validate_model",
]
