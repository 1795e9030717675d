"""The validation report: a conclusion in plain words first, then the comparisons, figures (per-layer
deviation next to the format's own, cosine histograms, retrieval agreement), the rule and the environment;
written as report.md, report.html and summary.json."""

from __future__ import annotations

from pathlib import Path

from flashcheck.reporting import Bullets, Figure, Heading, Page, Table, Text, matplotlib_available, write_report
from flashcheck.reporting.figures import Styler, figure, label_axes
from flashcheck.validate.result import Comparison, ValidationResult, describe_nonfinite, layer_name, where_text

RULE = (
    "Every run is compared with the reference (eager attention, fp32) and judged against the deviation the "
    "number format alone causes: eager attention in the same format vs the reference (for fp32: the reference "
    "vs an fp64 run). A comparison passes when, at every layer, for the embeddings, their norms, the retrieval "
    "similarities, the logits and the padding / batch-size invariance checks, deviation <= k x format-only "
    "deviation + the reference's own deviation from fp64 + the format's rounding floor, and when no NaN/Inf "
    "appears anywhere. k is the 95th percentile, over 200 random halvings of the probe texts and over layers, "
    "of the ratio between the two halves' worst format-only deviation (how much the format's own deviation "
    "changes with the texts measured), never below 2 (the factor of flash-attention's tests). Retrieval "
    "rankings may change only on near ties that the allowed similarity deviation explains. Per-layer figures "
    "cover the probe texts and the max-length rows; embeddings and retrieval cover every text."
)


def conclusion(result: ValidationResult) -> str:
    """Plain words: the verdict, what failed first and where, what was skipped."""
    ran = [c for c in result.comparisons if c.impl != "eager"]
    if result.passed:
        text = (
            f"PASS: every implementation that ran ({', '.join(c.a for c in ran) or 'none besides eager'}) stays "
            f"within {_k_text(ran)} the deviation its number format causes on its own (the format-only column), on "
            "every layer, the embeddings and the retrieval rankings; no NaN/Inf appeared."
        )
    else:
        bad = [c for c in result.comparisons if not c.passed]
        text = "FAIL: " + "; ".join(_why(c) for c in bad) + "."
    if result.skipped:
        text += " Skipped, with the reasons listed: " + ", ".join(f"{s.impl}:{s.dtype}" for s in result.skipped) + "."
    return text


def _k_text(ran: list[Comparison]) -> str:
    """'k = 2 times' (one k for every comparison) or 'k = 2 to 3.1 times' (each its own, from its texts' spread)."""
    ks = sorted({float(f"{c.k:.3g}") for c in ran if c.k == c.k})
    if not ks:
        return "k times"
    return f"k = {ks[0]:g} times" if len(ks) == 1 else f"k = {ks[0]:g} to {ks[-1]:g} times"


def _bullet(c: Comparison) -> str:
    """A comparison's line in the report: its failures, or its k and what was noted beside the verdict."""
    return "; ".join(c.failures() or [f"k = {c.k:.3g}, all checks within bounds", *c.notes()])


def _why(c: Comparison) -> str:
    at = f"; {where_text(c.where)}" if c.where else ""
    return _why_failed(c) + at


def _why_failed(c: Comparison) -> str:
    if c.error:
        return f"{c.a} crashed ({c.error})"
    if c.nonfinite:
        return f"{c.a} produced NaN/Inf ({describe_nonfinite(c.nonfinite)})"
    if all(ch.passed for ch in c.checks):
        return f"{c.a} gives NaN/Inf gradients where {c.b}'s are finite"
    layer = c.first_bad_layer
    where = f", first at {layer_name(layer)}" if layer is not None else ""
    first = next(ch for ch in c.checks if not ch.passed)
    return (
        f"{c.a} deviates from {c.b} beyond its format's context{where} "
        f"({first.name}: {first.value:.3g} > {first.bound:.3g})"
    )


def _kernels(c: Comparison) -> str:
    return ", ".join(c.kernels) or "none named (matmul and softmax)"


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _gap(cos: float | None) -> str:
    """1 - cosine, readable where the cosine itself would print as 1.0000000."""
    return "-" if cos is None else f"{1 - cos:.2e}"


def comparison_table(result: ValidationResult) -> Table:
    header = [
        "a",
        "b",
        "1 - min cos",
        "1 - mean cos",
        "max abs",
        "format-only",
        "top-k overlap",
        "Kendall tau",
        "NaN/Inf",
        "hidden states first over bound",  # per call, attention may leave its budget earlier (the where: line)
        "verdict",
    ]
    rows = []
    for c in result.comparisons:
        bad = c.first_bad_layer
        rows.append(
            [
                c.a,
                c.b,
                _gap(c.embeddings.get("min_cosine")),
                _gap(c.embeddings.get("mean_cosine")),
                _fmt(c.max_abs),
                _fmt(c.format_only_max_abs),
                _fmt(c.retrieval.get("topk_overlap"), ".4f"),
                _fmt(c.retrieval.get("kendall_tau"), ".4f"),
                "yes" if c.nonfinite else "no",
                "-" if bad is None else layer_name(bad),
                "pass" if c.passed else "FAIL",
            ]
        )
    return Table(header, rows)


def _figures(result: ValidationResult, folder: Path) -> list[Figure]:
    if not matplotlib_available():
        return []
    out = []
    for dtype in dict.fromkeys(c.dtype for c in result.comparisons if c.layers):
        path = folder / "figures" / f"layers_{dtype}.png"
        with figure(path) as (_, ax):
            style = Styler()
            rows = [c for c in result.comparisons if c.dtype == dtype and c.layers and c.impl != "eager"]
            rows = rows or [c for c in result.comparisons if c.dtype == dtype and c.layers]
            xs = [d.layer for d in rows[0].layers]
            ax.plot(xs, [max(d.format_only_max_abs, 1e-30) for d in rows[0].layers], **style("format only"), ls="--")
            ax.plot(xs, [d.bound for d in rows[0].layers], **style("bound"), ls=":")
            for c in rows:
                ax.plot(xs, [max(d.max_abs, 1e-30) for d in c.layers], **style(f"{c.a} vs {c.b}"))
            ax.set_yscale("log")
            label_axes(ax, x="layer (0 = embeddings)", y="max |hidden - reference|")
            ax.legend(fontsize=7)
        out.append(Figure(path, f"per-layer deviation in {dtype}, next to the format-only deviation and the bound"))
    out += _cosine_figure(result, folder)
    out += _retrieval_figure(result, folder)
    return out


def _cosine_figure(result: ValidationResult, folder: Path) -> list[Figure]:
    rows = [c for c in result.comparisons if "cosines" in c.embeddings]
    if not rows:
        return []
    path = folder / "figures" / "cosines.png"
    with figure(path) as (_, ax):
        style = Styler()
        for c in rows:
            gap = (1 - c.embeddings["cosines"]).clamp(min=1e-17).log10().numpy()
            ax.hist(gap, bins=40, histtype="step", color=style(c.a)["color"], label=f"{c.a} vs {c.b}")
        label_axes(ax, x="log10(1 - cosine to the reference)", y="texts")
        ax.legend(fontsize=7)
    return [Figure(path, "distribution of 1 - cosine similarity of each text's embedding to the reference's")]


def _retrieval_figure(result: ValidationResult, folder: Path) -> list[Figure]:
    rows = [c for c in result.comparisons if c.retrieval]
    if not rows:
        return []
    path = folder / "figures" / "retrieval.png"
    with figure(path) as (_, ax):
        style = Styler()
        for shift, key, name in ((-0.2, "topk_overlap", "1 - top-k overlap"), (0.2, "kendall_tau", "1 - Kendall tau")):
            xs = [i + shift for i in range(len(rows))]
            st = style(name)
            ax.bar(xs, [1 - c.retrieval[key] for c in rows], 0.4, color=st["color"], label=name)
            bounds = [c.retrieval["explained_by_near_ties"][key] for c in rows]
            ax.scatter(xs, bounds, color=st["color"], marker="_", s=300, label=f"{name}: bound (near ties)")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylim(bottom=0)
        ax.set_xticks(list(range(len(rows))), [c.a for c in rows], rotation=20, fontsize=7)
        label_axes(ax, x="run", y="ranking disagreement with the reference")
        ax.legend(fontsize=7)
    return [Figure(path, "retrieval: how much each run's rankings differ from the reference's, and the bound")]


def build_page(result: ValidationResult, folder: Path) -> Page:
    from flashcheck.validate.sim_report import answer_lines, kernel_table, layer_figures

    page = Page(f"flashcheck validate: {result.model}")
    if lines := answer_lines(result):  # simulated kernels: what each does to the model, first
        page.add(Heading("Answer"), Bullets([("", None, line) for line in lines], False), kernel_table(result))
        page.add(*layer_figures(result, folder) if matplotlib_available() else [])
    page.add(Text(conclusion(result)), Heading("Comparisons"), comparison_table(result))
    items = [(f"{c.a} vs {c.b}", c.passed, _bullet(c)) for c in result.comparisons]
    page.add(Bullets(items))
    if result.skipped:
        page.add(Heading("Skipped"), Bullets([(f"{s.impl}:{s.dtype}", None, s.reason) for s in result.skipped], False))
    page.add(Heading("Figures"), *_figures(result, folder), Heading("Checks"))
    for c in result.comparisons:
        rows = [
            [ch.name, _fmt(ch.value), _fmt(ch.bound), "pass" if ch.passed else "FAIL", ch.detail] for ch in c.checks
        ]
        spread = "-" if c.spread is None else f"{c.spread:.3g}"
        head = f"{c.a} vs {c.b}: k = {c.k:.3g} (spread {spread}), {c.seconds:.1f} s, attention ops seen: {_kernels(c)}"
        page.add(Text(head), Table(["check", "value", "bound", "verdict", "note"], rows))
    page.add(Heading("How this is judged"), Text(RULE))
    notes = result.settings.get("notes") or []
    if notes:
        page.add(Bullets([("", None, n) for n in notes], False))
    env = [[k, str(v)] for k, v in result.environment.items()]
    page.add(Heading("Environment"), Table(["what", "version"], env))
    return page


def write_validation_report(out: str | Path, result: ValidationResult) -> None:
    """summary.json, report.md, report.html and figures/*.png in `out`."""
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    write_report(folder, build_page(result, folder), result.to_dict())
