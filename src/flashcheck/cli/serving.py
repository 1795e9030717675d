"""`flashcheck study --preset serving | serving-tiny`: the serving question set (questions.serving)."""

from __future__ import annotations

import typer

from flashcheck.cli.app import _fail_usage, _out_folder


def study_serving(preset: str, out: str, quiet: bool) -> None:
    """Run (or resume) the serving study into `out`, write its report and print its Answer."""
    from flashcheck.questions.serving.report import build_serving_report
    from flashcheck.questions.serving.settings import PRESETS
    from flashcheck.questions.serving.tasks import run_serving

    try:
        _out_folder(out)
    except ValueError as exc:
        _fail_usage(str(exc))
    stats = run_serving(out, PRESETS[preset], quiet=quiet)
    summary = build_serving_report(out)
    typer.echo(f"serving study ({preset}): {stats['ran']} units run, {stats['kept']} kept from before, "
               f"{stats['seconds']:.0f} s")  # fmt: skip
    print_serving(summary, out)


def print_serving(summary: dict, out: str) -> None:
    """The serving report's Answer, one bullet per question, and where the report is."""
    typer.echo("Answer:")
    for line in summary["answer"]:
        typer.echo(f"- {line}")
    typer.echo(f"report: {out}/report.html, report.md, summary.json")
