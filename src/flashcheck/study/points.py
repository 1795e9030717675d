"""A sweep's stored records as points: one method at one setting, its per-seed errors in two views and its
per-seed ratios to the baseline of the one rule, with 95% intervals (reporting.verdicts).

The two views of error: the sweep's metric against the FP64 reference of the original inputs (the paper's
view, which includes rounding the inputs and the output), and the relative L2 error against the FP64
reference of the inputs as the method rounded them (the kernel's own error, the algorithm alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashcheck.measure.method import baseline_name
from flashcheck.reporting.verdicts import Estimate, Verdict, exp_or_inf, mean_interval, ratio_interval
from flashcheck.study.cases import CaseRecord, expand_sweep
from flashcheck.study.config import Sweep

OWN_METRIC = "rel_l2"  # the kernel's own error: relative L2 against FP64 of the rounded inputs


@dataclass(frozen=True, slots=True)
class Point:
    """One method at one (seq_len, head_dim, block, distribution), over seeds. Per-seed tuples are aligned:
    values[i] and base_values[i] are the method and its baseline on the same inputs (nan: no baseline)."""

    method: str
    seq_len: int
    head_dim: int
    block: tuple[int, int]
    distribution: str
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    own: tuple[float, ...]
    base_values: tuple[float, ...]
    base_own: tuple[float, ...]
    baseline: str | None

    @property
    def label(self) -> str:
        return f"{self.block[0]}x{self.block[1]}" if self.block != (0, 0) else "-"

    @property
    def n(self) -> int:
        return len(self.values)

    def estimate(self) -> Estimate:
        """Geometric mean of the metric over seeds, t interval on the logs (errors are positive: the interval
        stays positive, as on the figures' log axes)."""
        return geometric(self.values)

    def own_estimate(self) -> Estimate:
        return geometric(self.own)

    def ratio_estimate(self) -> Estimate | None:
        """Geometric mean of the per-seed ratios to the baseline (t interval on logs); None for a baseline."""
        return ratio_interval(self.values, self.base_values) if self.baseline else None

    def own_ratio_estimate(self) -> Estimate | None:
        """The same ratio in the kernel's own view (relative L2 against FP64 of the rounded inputs)."""
        return ratio_interval(self.own, self.base_own) if self.baseline else None

    @property
    def mean(self) -> float:
        return self.estimate().value

    @property
    def ratio(self) -> float | None:
        est = self.ratio_estimate()
        return None if est is None or est.n == 0 else est.value

    def ratios(self) -> list[float]:
        """Per-seed ratios (pairs with a missing or zero baseline dropped)."""
        return [a / b for a, b in zip(self.values, self.base_values, strict=True) if b > 0 and math.isfinite(b)]


def geometric(xs: tuple[float, ...]) -> Estimate:
    """Geometric mean of positive values with a t interval on their logs (non-positive values dropped)."""
    e = mean_interval([math.log(x) for x in xs if x > 0 and math.isfinite(x)])
    exp = [exp_or_inf(v) if math.isfinite(v) else math.nan for v in (e.value, e.low, e.high)]
    return Estimate(*exp, e.n, "geometric mean, t interval on logs")


def _is_baseline(method: str) -> bool:
    return method.partition(":")[0] in ("standard", "eager")


def sweep_points(sw: Sweep, records: dict[str, CaseRecord]) -> list[Point]:
    """Aggregate a sweep's ok records over seeds, each paired with its baseline's record on the same inputs
    (standard attention under the same policy; eager PyTorch at FMT for a backend)."""
    by_key: dict[tuple, list[CaseRecord]] = {}
    bases: dict[tuple, CaseRecord] = {}
    for c in expand_sweep(sw):
        rec = records.get(c.case_id)
        if rec is None or rec.status != "ok":
            continue
        if _is_baseline(c.method):
            bases[(c.method, c.input_key)] = rec
        by_key.setdefault((c.method, c.seq_len, c.head_dim, (c.block_q, c.block_k), c.distribution), []).append(rec)
    points = []
    for (method, length, d, block, dist), recs in by_key.items():
        recs.sort(key=lambda r: r.case.seed)
        base_name = None if _is_baseline(method) else baseline_name(method)
        base = [bases.get((base_name, r.case.input_key)) for r in recs]
        has_base = base_name is not None and any(b is not None for b in base)
        points.append(
            Point(
                method,
                length,
                d,
                block,
                dist,
                tuple(r.case.seed for r in recs),
                tuple(r.errors[sw.metric] for r in recs),
                tuple(r.errors_rounded.get(OWN_METRIC, math.nan) for r in recs),
                tuple(math.nan if b is None else b.errors[sw.metric] for b in base),
                tuple(math.nan if b is None else b.errors_rounded.get(OWN_METRIC, math.nan) for b in base),
                base_name if has_base else None,
            )
        )
    return points


# --- findings: a verdict as summary.json holds it -----------------------------------------------------

NOT_MEASURED = "not measured in this study"


def finding(
    fid: str, claim: str, measured: str, verdict: Verdict | None, *, paper: str | None = None, section: str = ""
) -> dict:
    """A summary.json finding: {id, claim, measured, status, holds, rule, reason, interval, estimate, n, ...}."""
    est = verdict.estimate if verdict is not None else None
    finite = est is not None and est.n >= 2 and math.isfinite(est.low)
    return {
        "id": fid,
        "claim": claim,
        "measured": measured,
        "status": verdict.status if verdict is not None else "not measured",
        "holds": verdict.holds if verdict is not None else None,
        "rule": verdict.rule if verdict is not None else "",
        "reason": verdict.reason if verdict is not None else "",
        "estimate": est.value if est is not None else None,
        "interval": [est.low, est.high] if finite else None,
        "n": est.n if est is not None else 0,
        "paper": paper,
        "section": section,
    }


def ratio_text(est: Estimate | None) -> str:
    """'21.5x [19.8, 23.3] (n=3)', or 'not measured'."""
    if est is None or est.n == 0:
        return "not measured"
    if est.n < 2 or not math.isfinite(est.low):
        return f"{est.value:.3g}x (n={est.n}, no interval)"
    return f"{est.value:.3g}x [{est.low:.3g}, {est.high:.3g}] (n={est.n})"


def paired(points: list[Point], a: str, b: str) -> tuple[list[float], list[float]]:
    """Values of methods a and b paired on the same inputs (length, head dim, distribution, seed)."""
    bv = {}
    for p in (p for p in points if p.method == b):
        for s, v in zip(p.seeds, p.values, strict=True):
            bv[(p.seq_len, p.head_dim, p.distribution, s)] = v
    num, den = [], []
    for p in (p for p in points if p.method == a):
        for s, v in zip(p.seeds, p.values, strict=True):
            if (p.seq_len, p.head_dim, p.distribution, s) in bv:
                num.append(v)
                den.append(bv[(p.seq_len, p.head_dim, p.distribution, s)])
    return num, den
