"""`flashcheck study --preset serving | serving-tiny`: the serving question set (questions.serving)."""

from __future__ import annotations

import typer

from flashcheck.cli.app import _fail_usage, _not_others, _out_folder
from flashcheck.core.fileio import LinkRefused


def study_serving(preset: str, out: str, quiet: bool) -> None:
    """Run (or resume) the serving study into `out`, write its report and print its Answer."""
    from flashcheck.questions.serving.report import build_serving_report
    from flashcheck.questions.serving.settings import PRESETS
    from flashcheck.questions.serving.tasks import check_writable, load_units, run_serving

    try:
        _not_others(_out_folder(out), "study --preset serving", {"answer", "published", "units"})
        check_writable(out)  # linked outputs are refused before anything runs
        load_units(out)  # and so are stored units that are links or not what their unit writes (a resume keeps them)
    except ValueError as exc:
        _fail_usage(str(exc))
    try:
        stats = run_serving(out, PRESETS[preset], quiet=quiet)
        summary = build_serving_report(out)
    except LinkRefused as exc:  # a link made while the study ran
        _fail_usage(str(exc))
    typer.echo(f"serving study ({preset}): {stats['ran']} units run, {stats['kept']} kept from before, "
               f"{stats['seconds']:.0f} s")  # fmt: skip
    print_serving(summary, out)


def print_serving(summary: dict, out: str) -> None:
    """The serving report's Answer, one bullet per question, and where the report is."""
    typer.echo("Answer")  # the heading every study prints
    for line in summary["answer"]:
        typer.echo(f"- {line}")
    typer.echo(f"report: {out}/report.html, report.md, summary.json")
