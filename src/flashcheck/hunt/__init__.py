"""`flashcheck hunt`: property-based search (Hypothesis) for the inputs that break an attention kernel.

case (one input configuration) -> target (what is hunted) -> judge (FP64 reference, same-precision baseline,
budget) -> search (Hypothesis rounds under a time budget, findings store) -> report. semantics: what the target
returns where attention has no key to attend to; isolate: the target run in a worker process, so that a kernel
that kills its process is a `crash` finding, not the end of the hunt. Hypothesis is imported only by `space`
and `search`."""

from flashcheck.hunt.case import HuntCase, parse_case
from flashcheck.hunt.target import Target, parse_target

__all__ = ["HuntCase", "Target", "parse_case", "parse_target"]
