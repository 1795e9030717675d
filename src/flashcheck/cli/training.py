"""`flashcheck train-study` and `flashcheck drift`."""

from __future__ import annotations

import json

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    _positive,
    app,
)


@app.command("train-study")
def train_study(
    preset: str = typer.Option("quick", help="quick | paper | full | tiny | tied-max."),
    out: str = typer.Option("flashcheck-train-study", help="Folder for runs, figures and the report."),
    workers: int = typer.Option(None, help="Runs trained in parallel (default: the core count)."),
    quiet: bool = typer.Option(False),
) -> None:
    """Train runs that differ in one factor (attention, format, seed) and compare their weights."""
    try:
        if workers is not None and workers < 1:
            raise ValueError(f"--workers {workers} is not allowed; it must be a positive integer")
        if preset == "tied-max":
            from flashcheck.training.tied_max import tied_max_report

            summary = tied_max_report(out)
        else:
            from flashcheck.training.study import run_train_study, train_preset

            summary = run_train_study(train_preset(preset), out, workers=workers, quiet=quiet)
    except ValueError as exc:
        _fail_usage(str(exc))
    if not quiet:
        for f in summary["findings"]:
            typer.echo(f"{f['id']}: {'holds' if f['holds'] else 'does not hold'} — {f['measured']}")
        typer.echo(f"report: {out}/report.html, report.md, summary.json")


@app.command()
def drift(
    a: str = typer.Argument(..., help="Checkpoint file or folder of checkpoints named by step (run A)."),
    b: str = typer.Argument(..., help="The same for run B."),
    sketch_points: int = typer.Option(
        4096, callback=_positive("--sketch-points"), help="Quantiles per tensor for the whole-model W1 of big models."
    ),
    exact_limit: int = typer.Option(20_000_000, help="Values up to which whole-model W1 is exact."),
    per_tensor: bool = typer.Option(True, help="Include per-tensor figures in --json."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Weight deviation between two checkpoint series: max |A - B| and Wasserstein-1, per tensor and model."""
    from flashcheck.training.drift import compare_series, slope

    try:
        pairs = compare_series(a, b, sketch_points=sketch_points, exact_limit=exact_limit)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        rows = []
        for p in pairs:
            d = p.to_dict()
            if not per_tensor:
                d.pop("per_tensor")
            rows.append(d)
        typer.echo(
            json.dumps(
                {"pairs": rows, "slope_wasserstein": slope([p.step for p in pairs], [p.wasserstein for p in pairs])},
                indent=2,
            )
        )
        return
    from rich.table import Table

    table = Table(title="weight deviation A vs B")
    for col in ("step", "max |A-B|", "Wasserstein-1", "method (bound)", "mismatches"):
        table.add_column(col)
    for p in pairs:
        mm = sum(len(v) for v in p.mismatches.values())
        table.add_row(
            str(p.step),
            f"{p.max_abs:.3e}",
            f"{p.wasserstein:.3e}",
            f"{p.method} (±{p.wasserstein_bound:.1e})",
            str(mm) if mm else "",
        )
    c = _console()
    c.print(table)
    for key, items in pairs[-1].mismatches.items():
        for item in items[:10]:
            c.print(f"mismatch ({key}): {item}")
