"""`flashcheck study` and `flashcheck report`."""

from __future__ import annotations

from enum import StrEnum

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    app,
)


class Executor(StrEnum):
    local = "local"
    ray = "ray"


@app.command()
def study(
    preset: str = typer.Option("quick", help="quick | paper | fa3 | full | tiny."),
    config: str = typer.Option(None, "--config", help="A TOML file defining a custom sweep (overrides --preset)."),
    out: str = typer.Option("flashcheck-study", help="Folder for records, figures and the report."),
    workers: int = typer.Option(None, help="Processes (default: the core count)."),
    executor: Executor = typer.Option(Executor.local, help="local process pool or ray."),
    ray_address: str = typer.Option(None, help="Address of a running Ray cluster (default: start a local one)."),
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Reproduce the published studies; resumable (run the same command again to continue)."""
    from flashcheck.study.config import load_config
    from flashcheck.study.config import preset as get_preset
    from flashcheck.study.report import build_report
    from flashcheck.study.runner import run_study

    try:
        if workers is not None and workers < 1:
            raise ValueError(f"--workers {workers} is not allowed; it must be a positive integer")
        cfg = load_config(config) if config else get_preset(preset)
        stats = run_study(cfg, out, workers=workers, executor=executor.value, ray_address=ray_address, quiet=quiet)
        summary = build_report(out)
    except ValueError as exc:
        _fail_usage(str(exc))
    if not quiet:
        _print_findings(summary, stats, out)


@app.command()
def report(folder: str = typer.Argument(..., help="A study folder (--out of `flashcheck study`).")) -> None:
    """Rebuild a study's figures and report from its stored records, computing nothing."""
    from flashcheck.study.report import build_report

    try:
        summary = build_report(folder)
    except ValueError as exc:
        _fail_usage(str(exc))
    _print_findings(summary, None, folder)


def _print_findings(summary: dict, stats: dict | None, out: str) -> None:
    from rich.markup import escape

    console = _console()
    if stats:
        console.print(
            f"{stats['cases_computed']} cases computed, {stats['cases_reused']} reused from the store, "
            f"{stats['reference_computations']} FP64 references, {stats['seconds']:.1f} s"
        )
    for f in summary["findings"]:
        mark = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "[dim]not measured[/]"}[f["holds"]]
        console.print(f"{escape(f['id'])}: {mark} — {escape(f['measured'])}")
    console.print(f"report: {escape(str(out))}/report.html, report.md, summary.json")
