"""`flashcheck hunt`: property-based search (Hypothesis) for the inputs that break an attention kernel.

case (one input configuration) -> target (what is hunted: real backends through their public API) -> judge (FP64
reference, same-precision baseline, budget) -> search (Hypothesis rounds under a time budget; onset: a numeric finding
lowered to its smallest logits) -> store (the findings, schema-checked) -> classify (category, known report) ->
report, and upstream (standalone reproducers, from the parts in repro/). semantics: what the target returns where
attention has no key to attend to; isolate: the target imported and run only in a worker process, every call under
the case timeout, so that a kernel that kills its process, hangs, forks or floods its output is a finding, not the end
of the hunt. Hypothesis is imported only by `space` and `search`."""

from flashcheck.hunt.case import HuntCase, parse_case
from flashcheck.hunt.target import Target, parse_target

__all__ = ["HuntCase", "Target", "parse_case", "parse_target"]
