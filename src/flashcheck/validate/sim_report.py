"""The simulated kernels' part of the validation report: one Answer line per kernel (what the model's user sees,
how the error grows over the layers, the verdict), a table of per-kernel figures, and the figure of error against
layer, isolated and propagated, with the tolerance."""

from __future__ import annotations

from pathlib import Path

from flashcheck.reporting import Figure, Table
from flashcheck.reporting.figures import Styler, figure, label_axes
from flashcheck.validate.result import Comparison, ValidationResult, layer_name


def sim_rows(result: ValidationResult) -> list[Comparison]:
    return [c for c in result.comparisons if c.impl.startswith("sim:")]


def _format_only(result: ValidationResult, c: Comparison) -> Comparison | None:
    """eager in the comparison's dtype (the format-only change), when it ran."""
    return next((e for e in result.comparisons if e.impl == "eager" and e.dtype == c.dtype and e.b == c.b), None)


def consequence(c: Comparison, fmt_only: Comparison | None) -> str:
    """What the model's user sees: retrieval (embeddings) or greedy generation (decoders), beside the format's."""
    gen = c.generation or {}
    if gen.get("token_agreement") is not None:
        first = gen.get("first_divergence")
        where = "never diverge" if first is None else f"first diverge at generated token {first}"
        kl = "" if gen.get("kl_mean") is None else f", KL(eager fp32 || kernel) {gen['kl_mean']:.3g} per token"
        base = (fmt_only.generation or {}).get("token_agreement") if fmt_only else None
        also = "" if base is None else f" (the {c.dtype} format alone: {100 * base:.1f}%)"
        return f"greedy tokens agree {100 * gen['token_agreement']:.1f}% with eager fp32{also}, {where}{kl}"
    r = c.retrieval
    if r.get("topk_overlap") is None:
        cos = c.embeddings.get("min_cosine")
        return "" if cos is None else f"min cosine to eager fp32 {cos:.5f}"
    k = r.get("topk", 10)
    fo = r.get("format_only_topk_overlap")
    also = "" if fo is None else f" (the {c.dtype} format alone: {k * fo:.2f})"
    return (
        f"{k * r['topk_overlap']:.2f} of {k} nearest neighbours kept on average{also}, Kendall tau "
        f"{r['kendall_tau']:.4f}, min cosine {c.embeddings.get('min_cosine', float('nan')):.5f}"
    )


def growth_words(c: Comparison) -> str:
    pc = c.per_call()
    if pc is None:
        return ""
    last = c.layers[-1]
    g = pc["last_layer_growth"]
    grow = "" if g is None else f"errors grow {g:.2g}x over {len(c.layers) - 1} layers "
    return f"{grow}(last layer: isolated {last.isolated_max_abs:.3g}, propagated {last.max_abs:.3g})"


def verdict_words(c: Comparison) -> str:
    """PASS, or FAIL saying whether the kernel fails per call already or only end to end, and where first."""
    if c.passed:
        return "PASS against the tolerance"
    first = f" ({c.failures()[0]})" if c.failures() else ""
    pc = c.per_call()
    if pc and pc["passes_per_call"] and not pc["passes_end_to_end"]:
        at = layer_name(c.first_bad_layer)
        return f"FAIL: passes per call at every layer but fails end to end, first at {at}{first}"
    if pc and pc["first_layer_failing_per_call"] is not None:
        return f"FAIL: fails per call already, first at {layer_name(pc['first_layer_failing_per_call'])}{first}"
    return "FAIL" + first


def answer_lines(result: ValidationResult) -> list[str]:
    """One line per simulated kernel and dtype: the consequence, the growth and the verdict."""
    out = []
    for c in sim_rows(result):
        if c.error:
            out.append(f"{c.impl} ({c.dtype} model): crashed: {c.error}")
            continue
        parts = [p for p in (consequence(c, _format_only(result, c)), growth_words(c)) if p]
        out.append(f"{c.impl} ({c.dtype} model): " + "; ".join(parts) + f"; {verdict_words(c)}")
    return out


def _f(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _first(gen: dict) -> str:
    if gen.get("token_agreement") is None:
        return "-"
    return "none" if gen.get("first_divergence") is None else str(gen["first_divergence"])


def kernel_table(result: ValidationResult) -> Table:
    """Per kernel: last-layer propagated and isolated error, growth, predictions within 2x, top-k overlap, min
    cosine, greedy agreement and first divergence."""
    header = ["kernel", "dtype", "last layer propagated", "isolated", "growth", "predicted within 2x",
              "top-k overlap", "min cosine", "greedy agreement", "first divergence", "verdict"]  # fmt: skip
    rows = []
    for c in sim_rows(result):
        pc = c.per_call() or {}
        last = c.layers[-1] if c.layers else None
        gen = c.generation or {}
        agree = gen.get("token_agreement")
        rows.append([
            c.impl, c.dtype, _f(last and last.max_abs), _f(last and last.isolated_max_abs),
            _f(pc.get("last_layer_growth"), ".2f"),
            f"{pc['predicted_within_2x']} of {pc['predicted_layers']}" if pc else "-",
            _f(c.retrieval.get("topk_overlap"), ".3f"), _f(c.embeddings.get("min_cosine"), ".5f"),
            "-" if agree is None else f"{100 * agree:.1f}%",
            _first(gen),
            "pass" if c.passed else "FAIL",
        ])  # fmt: skip
    return Table(header, rows)


def layer_figures(result: ValidationResult, folder: Path) -> list[Figure]:
    """Per dtype: max |hidden - reference| against layer, isolated (dashed) and propagated (solid), one colour per
    kernel, the tolerance (the layer bounds) dotted."""
    out = []
    for dtype in dict.fromkeys(c.dtype for c in sim_rows(result) if c.per_call()):
        rows = [c for c in sim_rows(result) if c.dtype == dtype and c.per_call()]
        path = folder / "figures" / f"kernels_by_layer_{dtype}.png"
        with figure(path) as (_, ax):
            style = Styler()
            xs = [d.layer for d in rows[0].layers][1:]
            ax.plot(xs, [d.bound for d in rows[0].layers][1:], color="black", ls=":", label="tolerance (bound)")
            for c in rows:
                st = style(c.impl)
                ax.plot(xs, [max(d.max_abs, 1e-30) for d in c.layers][1:], color=st["color"], marker="o",
                        label=f"{c.impl}: propagated")  # fmt: skip
                ax.plot(xs, [max(d.isolated_max_abs or 0.0, 1e-30) for d in c.layers][1:], color=st["color"],
                        ls="--", marker="x", label=f"{c.impl}: isolated (per call)")  # fmt: skip
            ax.set_yscale("log")
            label_axes(ax, x="layer", y="max |hidden - eager fp32|")
            ax.legend(fontsize=6)
        what = "each kernel alone at one layer (isolated, what a unit test sees) and at every layer (propagated)"
        out.append(Figure(path, f"error against layer in a {dtype} model: {what}, with the tolerance"))
    return out
