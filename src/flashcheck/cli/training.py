"""`flashcheck train-study` and `flashcheck drift`."""

from __future__ import annotations

import json
import math
import sys
from contextlib import ExitStack

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    app,
)

MAX_WORKERS = 256  # runs trained at once; a study has 5
MAX_SKETCH_POINTS = 10_000_000  # per tensor; beyond this an exact W1 (--exact-limit) is the better tool


class _Progress:
    """An on_progress(done, total, note) callback for the training functions, shown with
    flashcheck.core.progress (a bar on a terminal, periodic lines on stderr otherwise); opened on the first call,
    when the total is known."""

    def __init__(self, label: str, quiet: bool) -> None:
        self.label, self.quiet, self.done = label, quiet, 0
        self.stack = ExitStack()
        self.advance = None

    def __call__(self, done: int, total: int, note: str = "") -> None:
        if self.advance is None:
            from flashcheck.core.progress import progress

            self.advance = self.stack.enter_context(
                progress(total, self.label, done=done, quiet=self.quiet or total <= 1)
            )
            self.done = done
        if done > self.done:
            self.advance(done - self.done, note)
            self.done = done

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.stack.__exit__(*exc)


def _fail_check(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command("train-study")
def train_study(
    preset: str = typer.Option("quick", help="quick | paper | full | tiny | tied-max."),
    out: str = typer.Option("flashcheck-train-study", help="Folder for runs, figures and the report."),
    workers: int = typer.Option(None, help="Runs trained in parallel (default: the core count)."),
    quiet: bool = typer.Option(False, help="No progress and no findings on the terminal."),
) -> None:
    """Train runs that differ in one factor (attention, format, seed) and compare their weights.
    A run killed at any point resumes where it stopped when the command is run again."""
    from flashcheck.training.experiments import NonFiniteWeights, StudyInterrupted

    try:
        for flag, value in (("--preset", preset), ("--out", out)):
            if not value.strip():
                raise ValueError(f"{flag} {value!r} is empty; give a value or leave the option out for its default")
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"--workers {workers} is not allowed; give an integer from 1 to {MAX_WORKERS}")
        if preset == "tied-max":
            from flashcheck.training.tied_max import tied_max_report

            with _Progress("train-study", quiet) as on_progress:
                summary = tied_max_report(out, on_progress=on_progress)
        else:
            from flashcheck.training.experiments import run_train_study, train_preset

            study = train_preset(preset)
            with _Progress("train-study", quiet) as on_progress:
                summary = run_train_study(study, out, workers=workers, on_progress=on_progress)
    except ValueError as exc:
        _fail_usage(str(exc))
    except (StudyInterrupted, NonFiniteWeights) as exc:
        _fail_check(str(exc))
    if not quiet:
        _print_train_study(summary, out)


def _print_train_study(summary: dict, out: str) -> None:
    c = _console()
    for f in summary["findings"]:
        c.print(f"{f['id']}: {'holds' if f['holds'] else 'does not hold'} — {f['measured']}", markup=False)
    if "pairs" in summary:
        from rich.table import Table

        table = Table(title="weight deviation at the last step")
        for col in ("pair", "factor", "Wasserstein-1", "max |A-B|", "W1 slope / step"):
            table.add_column(col)
        for name, p in summary["pairs"].items():
            table.add_row(
                name,
                p["factor"],
                f"{p['wasserstein'][-1]:.3e}",
                f"{p['max_abs'][-1]:.3e}",
                f"{p['slope_wasserstein']:.3e}",
            )
        c.print(table)
    c.print(f"report: {out}/report.html, report.md, summary.json", markup=False)


def _within(name: str, lo: int, hi: int):
    """A typer callback: the value must lie in [lo, hi] (a huge number is bad usage, not an overflow)."""

    def check(value: int) -> int:
        if not lo <= value <= hi:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be an integer from {lo} to {hi}")
        return value

    return check


@app.command()
def drift(
    a: str = typer.Argument(..., help="Checkpoint (file, sharded, folder) or folder of checkpoints by step (run A)."),
    b: str = typer.Argument(..., help="The same for run B."),
    sketch_points: int = typer.Option(
        4096,
        callback=_within("--sketch-points", 1, MAX_SKETCH_POINTS),
        help="Quantiles per tensor for the whole-model W1 of big models.",
    ),
    exact_limit: int = typer.Option(
        20_000_000,
        callback=_within("--exact-limit", 0, 2**63 - 1),
        help="Values up to which whole-model W1 is exact.",
    ),
    per_tensor: bool = typer.Option(True, help="Include per-tensor figures in --json."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Weight deviation between two checkpoint series: max |A - B| and Wasserstein-1, per tensor and model.
    Exit 1 when a tensor holds NaN or Inf (named on stderr)."""
    from flashcheck.training.drift import compare_series

    try:
        for flag, value in (("A", a), ("B", b)):
            if not value.strip():
                raise ValueError(f"checkpoint {flag} '' is empty; give a file or folder")
        with _Progress("drift", as_json and not sys.stderr.isatty()) as on_progress:
            pairs = compare_series(a, b, sketch_points=sketch_points, exact_limit=exact_limit, on_progress=on_progress)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        _print_drift_json(pairs, per_tensor)
    else:
        _print_drift(pairs)
    bad = [
        f"step {p.step} {name} (A: {n['a']}, B: {n['b']} of {n['numel']})"
        for p in pairs
        for name, n in p.nonfinite.items()
    ]
    if bad:
        _fail_check(
            f"NaN/Inf weights, left out of the figures: {'; '.join(bad[:20])}" + (" ..." if len(bad) > 20 else "")
        )


def _print_drift_json(pairs: list, per_tensor: bool) -> None:
    from flashcheck.training.drift import slope

    rows = []
    for p in pairs:
        d = p.to_dict()
        if not per_tensor:
            d.pop("per_tensor")
        rows.append(d)
    s = slope([p.step for p in pairs], [p.wasserstein for p in pairs])
    typer.echo(json.dumps({"pairs": rows, "slope_wasserstein": None if math.isnan(s) else s}, indent=2))


def _print_drift(pairs: list) -> None:
    from rich.table import Table

    table = Table(title="weight deviation A vs B")
    for col in ("step", "tensors", "max |A-B|", "Wasserstein-1", "method (bound)", "mismatches", "NaN/Inf tensors"):
        table.add_column(col)
    for p in pairs:
        mm = sum(len(v) for v in p.mismatches.values())
        table.add_row(
            str(p.step),
            str(len(p.per_tensor)),
            f"{p.max_abs:.3e}",
            f"{p.wasserstein:.3e}",
            f"{p.method} (±{p.wasserstein_bound:.1e})",
            str(mm) if mm else "",
            str(len(p.nonfinite)) if p.nonfinite else "",
        )
    c = _console()
    c.print(table)
    for key, items in pairs[-1].mismatches.items():
        for item in items[:10]:
            c.print(f"mismatch ({key}): {item}", markup=False)
