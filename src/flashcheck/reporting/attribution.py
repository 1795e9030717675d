"""The attribution figure of `flashcheck explain` (which stage causes the deviation)."""

from __future__ import annotations

from flashcheck.reporting.figures import COLOURS, figure


def draw_attribution(attr, path) -> None:
    """A bar chart of an attribution (measure.attribution.Attribution): each stage alone in low precision
    and each stage alone raised to FP64, next to the full policy's error."""
    from flashcheck.core.numerics import STAGES

    with figure(path, size=(8, 4)) as (_, ax):
        _bars(ax, attr, STAGES)


def _bars(ax, attr, stages: tuple[str, ...]) -> None:
    xs = range(len(stages))
    ax.bar(
        [x - 0.2 for x in xs],
        [attr.alone[s] for s in stages],
        width=0.4,
        label="stage alone in low precision",
        color=COLOURS[0],
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [attr.raised[s] for s in stages],
        width=0.4,
        label="stage alone raised to FP64",
        color=COLOURS[1],
    )
    ax.axhline(attr.full, color="k", ls="--", lw=1, label=f"full policy {attr.policy.name}")
    ax.set_xticks(list(xs), [f"{s}\n({attr.policy.stage(s).value})" for s in stages])
    ax.set_yscale("symlog", linthresh=max(attr.full * 1e-3, 1e-300))
    ax.set_ylabel(f"{attr.metric} vs FP64")
    ax.legend(fontsize=8)
    sub = getattr(attr, "dominant_substage", None)  # measure.substages: e.g. input:qk within input
    ax.set_title(f"which stage causes the deviation? dominant: {attr.dominant}" + (f", within it {sub}" if sub else ""))
