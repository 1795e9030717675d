"""What a validation found: one frozen record per comparison, the skipped implementations, the verdict."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class Check:
    """`value` must be <= `bound` (NaN fails)."""

    name: str
    value: float
    bound: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.value <= self.bound

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": _num(self.value),
            "bound": _num(self.bound),
            "pass": self.passed,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class LayerDeviation:
    """Max |hidden - reference| over the probe texts' valid tokens at one layer, next to the format's own."""

    layer: int  # hidden-state index: 0 the embeddings, i the output of block i
    max_abs: float
    format_only_max_abs: float
    bound: float  # k * format_only_max_abs + rounding floor
    # simulated kernels (validate.layer_error): this layer's error with only its attention through the kernel on
    # eager fp32's inputs (what a per-call unit test sees), and its attention's rel-L2, measured and predicted
    isolated_max_abs: float | None = None
    attention_rel_l2: float | None = None
    predicted_rel_l2: float | None = None

    @property
    def passed(self) -> bool:
        return self.max_abs <= self.bound

    @property
    def growth(self) -> float | None:
        """Propagated over isolated error: what the layers before add (None where not measured or zero)."""
        if self.isolated_max_abs is None or not self.isolated_max_abs > 0:
            return None
        return self.max_abs / self.isolated_max_abs

    @property
    def prediction_ratio(self) -> float | None:
        """Predicted over measured attention rel-L2 (None where either is missing)."""
        if self.predicted_rel_l2 is None or not self.attention_rel_l2:
            return None
        return self.predicted_rel_l2 / self.attention_rel_l2

    def to_dict(self) -> dict:
        out = {"layer": self.layer, "name": self.name, "max_abs": self.max_abs,
               "format_only_max_abs": self.format_only_max_abs, "bound": self.bound, "pass": self.passed}  # fmt: skip
        if self.isolated_max_abs is not None:
            out |= {
                "isolated_max_abs": self.isolated_max_abs,
                "isolated_pass": self.isolated_max_abs <= self.bound,
                "growth": self.growth,
                "attention_rel_l2": self.attention_rel_l2,
                "predicted": self.predicted_rel_l2,
                "predicted_over_measured": self.prediction_ratio,
            }
        return out

    @property
    def name(self) -> str:
        return layer_name(self.layer)


def layer_name(layer: int) -> str:
    return "embeddings" if layer == 0 else f"layer {layer}"


@dataclass(frozen=True, slots=True)
class Comparison:
    """One (impl, dtype) run against the reference (eager, fp32), judged in the context of the format."""

    a: str  # "impl:dtype"
    b: str  # the reference it is compared with
    impl: str
    dtype: str
    k: float
    checks: tuple[Check, ...] = ()
    layers: tuple[LayerDeviation, ...] = ()
    embeddings: dict = field(default_factory=dict)  # min/mean cosine, percentiles, max_rel_error, norm W1
    format_only: dict = field(default_factory=dict)  # the same figures for eager in this dtype
    retrieval: dict = field(default_factory=dict)  # topk_overlap, kendall_tau, and the format's
    impl_only_max_abs: float | None = None  # against eager in the same dtype (last layer)
    nonfinite: dict | None = None
    invariance: dict = field(default_factory=dict)
    logits: dict | None = None
    generation: dict | None = None
    error: str | None = None
    seconds: float = 0.0
    kernels: tuple[str, ...] = ()  # attention ops the profiler saw (the implementation that actually ran)
    spread: float | None = None  # the format-only deviation's spread over the texts, from which k comes
    where: dict | None = None  # locate.Where.to_dict(): first layer, head and tokens out of budget (a failure)

    @property
    def passed(self) -> bool:
        nan_grad = bool(self.where and self.where.get("backward_nonfinite"))  # NaN / Inf dQ, dK or dV
        return self.error is None and self.nonfinite is None and not nan_grad and all(c.passed for c in self.checks)

    @property
    def first_bad_layer(self) -> int | None:
        return next((d.layer for d in self.layers if not d.passed), None)

    def per_call(self) -> dict | None:
        """Simulated kernels: whether every layer's isolated error (one call through the kernel) is within its
        bound, the first layer where the propagated error is not while the isolated one is (passes per call,
        fails end to end), the growth at the last layer and how many layers' predictions are within 2x."""
        iso = [d for d in self.layers if d.isolated_max_abs is not None and d.layer > 0]
        if not iso:
            return None
        hidden = next((d.layer for d in iso if d.isolated_max_abs <= d.bound and not d.passed), None)
        ratios = [d.prediction_ratio for d in iso if d.prediction_ratio is not None]
        return {
            "passes_per_call": all(d.isolated_max_abs <= d.bound for d in iso),
            "passes_end_to_end": all(d.passed for d in self.layers),
            "first_layer_failing_only_end_to_end": hidden,
            "first_layer_failing_per_call": next((d.layer for d in iso if d.isolated_max_abs > d.bound), None),
            "last_layer_growth": iso[-1].growth,
            "predicted_within_2x": sum(0.5 <= r <= 2.0 for r in ratios),
            "predicted_layers": len(ratios),
        }

    @property
    def max_abs(self) -> float | None:
        return self.layers[-1].max_abs if self.layers else None

    @property
    def format_only_max_abs(self) -> float | None:
        return self.layers[-1].format_only_max_abs if self.layers else None

    def failures(self) -> list[str]:
        """One line per failed check (empty when the comparison passed)."""
        out = [f"error: {self.error}"] if self.error else []
        if self.nonfinite:
            out.append("non-finite values: " + describe_nonfinite(self.nonfinite))
        out += [
            f"{c.name}: {c.value:.3g} > bound {c.bound:.3g}{' (' + c.detail + ')' if c.detail else ''}"
            for c in self.checks
            if not c.passed
        ]
        if self.where and not self.passed:
            out.append(f"where: {where_text(self.where)}")
        return out

    def notes(self) -> list[str]:
        """What was found but is not part of the verdict: on a comparison that passed, where attention's backward
        first leaves its per-call budget (finite gradients; a NaN / Inf one fails the comparison instead)."""
        if not (self.where and self.passed):
            return []
        return [f"note, not part of the verdict (finite gradients, per call): {where_text(self.where)}"]

    def to_dict(self) -> dict:
        bad = self.first_bad_layer
        emb = {k: v for k, v in self.embeddings.items() if k != "cosines"}
        return _clean(
            {
                "a": self.a,
                "b": self.b,
                "impl": self.impl,
                "dtype": self.dtype,
                "pass": self.passed,
                "min_cosine": emb.get("min_cosine"),
                "mean_cosine": emb.get("mean_cosine"),
                "cosine_percentiles": emb.get("cosine_percentiles"),
                "max_abs": self.max_abs,
                "format_only_max_abs": self.format_only_max_abs,
                "impl_only_max_abs": self.impl_only_max_abs,
                "topk_overlap": self.retrieval.get("topk_overlap"),
                "kendall_tau": self.retrieval.get("kendall_tau"),
                "nonfinite": self.nonfinite,
                "first_bad_layer": bad,
                "first_bad_layer_name": None if bad is None else layer_name(bad),
                "where": self.where,
                "k": self.k,
                "k_spread": self.spread,
                "embeddings": emb,
                "format_only": {k: v for k, v in self.format_only.items() if k != "cosines"},
                "retrieval": self.retrieval,
                "layers": [d.to_dict() for d in self.layers],
                "per_call": self.per_call(),
                "checks": [c.to_dict() for c in self.checks],
                "invariance": self.invariance,
                "logits": self.logits,
                "generation": self.generation,
                "error": self.error,
                "seconds": self.seconds,
                "kernels": list(self.kernels),
                "failures": self.failures(),
                "notes": self.notes(),
            }
        )


def describe_nonfinite(loc: dict) -> str:
    """'NaN/Inf first at layer 1, text 12, token 0 (fully padded row) in the right-padded batch'."""
    text = "a fully padded row" if loc.get("fully_padded_row") else f"text {loc.get('text')}"
    pad = ", a padding position" if loc.get("padding") and not loc.get("fully_padded_row") else ""
    return (
        f"NaN/Inf first at {layer_name(loc['layer'])} (hidden-state index {loc['layer']}), {text} "
        f"(batch row {loc['row']}), token {loc['token']}{pad}, in the {loc['where']}; {loc['count']} positions"
    )


@dataclass(frozen=True, slots=True)
class Skipped:
    impl: str
    dtype: str
    reason: str


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The verdict (`passed`), every comparison, what was skipped and why, and the environment."""

    model: str
    comparisons: tuple[Comparison, ...]
    skipped: tuple[Skipped, ...]
    environment: dict
    settings: dict
    k: dict  # dtype -> k used

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def __bool__(self) -> bool:
        return self.passed

    def to_dict(self) -> dict:
        return _clean(
            {
                "pass": self.passed,
                "model": self.model,
                "comparisons": [c.to_dict() for c in self.comparisons],
                "skipped": [asdict(s) for s in self.skipped],
                "environment": self.environment,
                "settings": self.settings,
                "k": self.k,
            }
        )


def _num(x: float) -> float | str:
    return x if isinstance(x, int) or math.isfinite(x) else str(x)


def _clean(obj):
    """JSON-safe: inf/nan as strings, tuples as lists."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, float):
        return _num(obj)
    return obj


def where_text(where: dict) -> str:
    """locate's finding in words: where attention first leaves its budget, or why it could not say."""
    located = where.get("layer") is not None or where.get("backward")
    return f"attention first leaves its budget at {where['text']}" if located else where["text"]
