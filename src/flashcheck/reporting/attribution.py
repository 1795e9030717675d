"""The attribution figure of `flashcheck explain` (which stage causes the deviation)."""

from __future__ import annotations

from flashcheck.reporting.figures import COLOURS, figure, legend_below


def draw_attribution(attr, path) -> None:
    """A bar chart of an attribution (measure.attribution.Attribution): each stage alone in low precision
    and each stage alone raised to FP64, next to the full policy's error."""
    from flashcheck.core.numerics import STAGES

    with figure(path, size=(8, 4)) as (_, ax):
        _bars(ax, attr, STAGES)


def _bars(ax, attr, stages: tuple[str, ...]) -> None:
    xs = range(len(stages))
    ax.set_xticks(list(xs), [f"{s}\n({attr.policy.stage(s).value})" for s in stages])
    ax.set_ylabel(f"{attr.metric} vs FP64")
    ax.set_xlabel("stage (its format in the policy)")
    sub = getattr(attr, "dominant_substage", None)  # measure.substages: e.g. input:qk within input
    ax.set_title(f"which stage causes the deviation? dominant: {attr.dominant}" + (f", within it {sub}" if sub else ""))
    shown = [v for v in (*attr.alone.values(), *attr.raised.values(), attr.full) if v > 0]
    if not shown:  # an exact policy (fp64): nothing to draw, and said so
        ax.text(0.5, 0.5, "no error: every stage is exact", transform=ax.transAxes, ha="center")
        return
    for shift, values, label, colour in (
        (-0.2, attr.alone, "stage alone in low precision", COLOURS[0]),
        (0.2, attr.raised, "stage alone raised to FP64", COLOURS[1]),
    ):
        ax.bar([x + shift for x in xs], [values[s] for s in stages], width=0.4, label=label, color=colour)
    ax.axhline(attr.full, color="k", ls="--", lw=1, label=f"full policy {attr.policy.name}")
    ax.set_yscale("log", nonpositive="clip")  # an exact stage (0) draws no bar; symlog's 0 tick sat on 10^-5
    ax.set_ylim(bottom=min(shown) / 3)
    legend_below(ax, ncol=3, fontsize=8)  # the bars reach the top: a legend inside covered them
