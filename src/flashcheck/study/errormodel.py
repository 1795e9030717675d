"""The error model (measure.predict) against a study's records: prediction / measured for every simulated
case, the share within 2x (a verdict), the table and the figure of the report."""

from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path

from flashcheck.core.numerics import parse_policy
from flashcheck.measure.predict import COEFFS, TRAINING, Setting, fit_coefficients, predict
from flashcheck.reporting.verdicts import compare, mean_interval
from flashcheck.study.cases import CaseRecord

TARGET, FOLD = 0.9, 2.0  # the target: within 2x for at least 90% of the cases


def setting_of(rec: CaseRecord) -> Setting | None:
    """The model's view of a simulated case (None: a real backend, or a record without input statistics)."""
    c, st = rec.case, rec.stats
    if c.kernel not in ("flash", "standard", "splitkv") or not st or "visible" not in st:
        return None
    return Setting(
        kernel=c.kernel,
        policy=parse_policy(c.policy),
        visible=max(1.0, st["visible"]),
        head_dim=c.head_dim,
        block_k=c.block_k or 128,
        splits=c.splits or 4,
        f_score=st["f_score"],
        f_p=st["f_p"],
    )


def measured(rec: CaseRecord) -> float | None:
    m = rec.errors_rounded.get("rel_l2")
    return m if m is not None and m > 0 and math.isfinite(m) else None


def pairs(records: dict[str, CaseRecord]) -> list[tuple[CaseRecord, Setting, float]]:
    """(record, setting, measured) for every ok simulated case with statistics and a positive error."""
    out = []
    for r in records.values():
        s, m = (setting_of(r), measured(r)) if r.status == "ok" else (None, None)
        if s is not None and m is not None:
            out.append((r, s, m))
    return out


def refit(records: dict[str, CaseRecord], seeds: tuple[int, ...] = (0,)) -> dict[str, float]:
    """Coefficients fitted on the cases of `seeds` (the training set); the others are held out."""
    train = [(s, m) for r, s, m in pairs(records) if r.case.seed in seeds]
    return fit_coefficients([s for s, _ in train], [m for _, m in train])


def evaluate(records: dict[str, CaseRecord], coeffs: dict[str, float] | None = None) -> dict:
    """Prediction / measured over the study: rows, median, 90th percentile of the fold error, within-2x share,
    and the verdict on the 90% target."""
    rows = []
    for r, s, m in pairs(records):
        p = predict(s, coeffs)
        rows.append({"case": r.case, "predicted": p, "measured": m, "ratio": p / m})
    ratios = sorted(x["ratio"] for x in rows)
    folds = sorted(max(x, 1 / x) for x in ratios)
    inside = [1.0 if f <= FOLD else 0.0 for f in folds]
    with warnings.catch_warnings():  # all inside (or all outside): a zero spread, which scipy warns about
        warnings.simplefilter("ignore", RuntimeWarning)
        est = mean_interval(inside)
    est = type(est)(est.value, est.low, est.high, est.n, "share of cases within 2x, t interval")
    return {
        "rows": rows,
        "n": len(rows),
        "median_ratio": statistics.median(ratios) if ratios else math.nan,
        "p90_fold": folds[min(len(folds) - 1, math.ceil(0.9 * len(folds)) - 1)] if folds else math.nan,
        "within_2x": sum(inside) / len(inside) if inside else math.nan,
        "verdict": compare(est, threshold=TARGET),
        "coefficients": dict(coeffs or COEFFS),
        "training": TRAINING,
    }


def table(ev: dict, limit: int = 60) -> tuple[list[str], list[list[str]]]:
    """The worst cases first (largest fold error), then a line per question's count."""
    header = ["case", "predicted", "measured", "pred/meas"]
    rows = sorted(ev["rows"], key=lambda x: -max(x["ratio"], 1 / x["ratio"]))
    out = []
    for x in rows[:limit]:
        c = x["case"]
        label = f"{c.method} L={c.seq_len}" + (f"/{c.seq_len_k}" if c.seq_len_k else "")
        label += f" D={c.head_dim} Bc={c.block_k} {c.distribution}{' causal' if c.causal else ''} seed {c.seed}"
        out.append([label, f"{x['predicted']:.3g}", f"{x['measured']:.3g}", f"{x['ratio']:.2f}"])
    return header, out


def draw(ev: dict, folder: Path) -> Path | None:
    """Scatter of predicted vs measured (log-log) with the 2x band; None without matplotlib or cases."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    from flashcheck.reporting.figures import figure, label_axes

    if not ev["rows"]:
        return None
    path = folder / "error_model.png"
    m = [x["measured"] for x in ev["rows"]]
    p = [x["predicted"] for x in ev["rows"]]
    with figure(path, size=(5.5, 5.0)) as (_, ax):
        ax.scatter(m, p, s=10, alpha=0.6)
        lo, hi = min(m + p), max(m + p)
        for f, style in ((1, "-"), (FOLD, "--"), (1 / FOLD, "--")):
            ax.plot([lo, hi], [lo * f, hi * f], style, color="grey", lw=0.8)
        ax.set(xscale="log", yscale="log")
        label_axes(ax, x="measured rel-L2 (kernel's own)", y="predicted rel-L2")
        ax.set_title(f"error model: {ev['within_2x']:.0%} of {ev['n']} cases within 2x (dashed)")
    return path
