"""`flashcheck study` and `flashcheck report`."""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    _out_folder,
    _probe,
    _starting,
    app,
    default_out,
    warnings_as_lines,
)

LISTED_FAILURES = 20


class Executor(StrEnum):
    local = "local"
    ray = "ray"


@app.command()
def study(
    preset: str = typer.Option(
        None,
        help="quick | paper | fa3 | full | tiny | modern | production | guide | guide-full | guide-tiny | "
        "serving | serving-tiny (default: quick).",
        show_default=False,
    ),
    config: str = typer.Option(None, "--config", help="A TOML file defining a custom sweep (instead of --preset)."),
    out: str = typer.Option(
        None,
        help="Folder for records, figures and the report (default: flashcheck-study for quick, "
        "flashcheck-study-PRESET for another preset, flashcheck-study-NAME for --config NAME.toml).",
    ),
    workers: int = typer.Option(None, help="Processes (default: the core count; at most 256)."),
    executor: Executor = typer.Option(Executor.local, help="local process pool or ray."),
    ray_address: str = typer.Option(None, help="Address of a running Ray cluster (default: start a local one)."),
    quiet: bool = typer.Option(False, help="No progress and no findings; failures are still listed."),
    device: str = typer.Option("cpu", help="Where the simulators and the FP64 references run: cpu or cuda."),
) -> None:
    """Reproduce the published studies; resumable (run the same command again to continue, failed
    cases are tried again). Exit code 1 when a case failed."""
    preset, out = _announce(preset, config, out, quiet)
    from flashcheck.questions.serving import PRESETS as SERVING_PRESETS
    from flashcheck.study.config import load_config
    from flashcheck.study.config import preset as get_preset
    from flashcheck.study.registry import solo_set
    from flashcheck.study.report import build_report
    from flashcheck.study.runner import run_study

    if config is None and preset in SERVING_PRESETS:  # its own runner and printout (cli.serving)
        from flashcheck.cli.serving import study_serving

        return study_serving(preset, out, quiet)

    def run() -> tuple[dict, dict]:
        _not_a_study(_out_folder(out))
        if ray_address is not None and not ray_address.strip():
            raise ValueError("--ray-address '' is empty; give HOST:PORT of a running Ray cluster, or leave it out")
        if not str(preset).strip():
            raise ValueError("--preset '' is empty; expected one of quick, paper, fa3, full, tiny, modern")
        if ray_address is not None and executor != Executor.ray:
            raise ValueError(f"--ray-address {ray_address!r} needs --executor ray")
        cfg = load_config(config) if config is not None else get_preset(preset)
        owner = solo_set(cfg.name) if config is None else None
        if owner is not None and owner.own_report is not None:  # a preset with a report of its own (the guide's)
            if executor != Executor.local:
                raise ValueError(f"--preset {preset} runs locally (its timings need one machine); drop --executor")
            return run_study(cfg, out, workers=workers, quiet=quiet), _report(owner.own_report, out, quiet, cfg)
        kw = {"workers": workers, "executor": executor.value, "ray_address": ray_address, "device": device}
        stats = run_study(cfg, out, quiet=quiet, **kw)
        return stats, _report(build_report, out, quiet, cfg)

    from flashcheck.study.runner import StudyInterrupted

    try:
        stats, summary = _guarded(run)
    except StudyInterrupted as exc:  # one line, no traceback (fixa2-2)
        typer.echo(str(exc), err=True)
        raise typer.Exit(130) from None
    _print_study(summary, stats, out, quiet)


def _announce(preset: str | None, config: str | None, out: str | None, quiet: bool) -> tuple[str, str]:
    """(the preset, the --out folder) once both are checked (--preset with --config, a bad --out: one line, exit
    2), after the first line saying what the study is about to do, before any heavy import."""
    if preset is not None and config is not None:
        _fail_usage(
            f"--preset {preset} and --config {config}: give one of them (a --config file defines its own sweep, "
            "so the preset would not run)"
        )
    preset = "quick" if preset is None else preset
    out = default_out("flashcheck-study", preset, config) if out is None else out
    _guarded(lambda: _out_folder(out))  # a bad --out is one line (checked again later: it may change meanwhile)
    what = f"the sweep of {config}" if config is not None else f"the {preset} preset"
    _starting(f"study: measuring {what} into {out} (stopped early, the same command resumes it)", quiet)
    return preset, out


def _not_a_study(folder: Path) -> None:
    """ValueError when --out holds another command's summary.json (explain's, hunt's, ...) and no study's records:
    the study's report would overwrite it. A study's own folder (records.jsonl or study.json) is resumed."""
    from flashcheck.cli.app import STUDY_FILES

    if os.path.lexists(folder / "summary.json") and not any(os.path.lexists(folder / n) for n in STUDY_FILES):
        raise ValueError(
            f"--out {str(folder)!r} holds summary.json, another command's output (no study's records.jsonl beside "
            "it), which the study's report would overwrite: give another --out (a new folder, or a study's)"
        )


def _print_study(summary: dict, stats: dict, out: str, quiet: bool) -> None:
    """A study's findings (or the guide's claims) and its failures; exit 1 when a case failed."""
    if "settings" in summary:  # the guide's summary
        _print_guide(summary, stats, out, quiet=quiet)
    else:
        _print_findings(summary, stats, out, quiet=quiet)
    if summary["failed"]:
        raise typer.Exit(1)


@app.command()
def report(
    folder: str = typer.Argument(..., metavar="FOLDER", help="A study folder (--out of `flashcheck study`)."),
) -> None:
    """Rebuild a study's figures and report from its stored records, computing nothing."""
    from flashcheck.core.fileio import refuse_link
    from flashcheck.core.lock import lock_holder
    from flashcheck.study.registry import sets
    from flashcheck.study.report import build_report

    # report rewrites the folder's report and figures: a link is refused (dangling or not), as study's --out is
    _guarded(lambda: refuse_link(folder, "FOLDER, which report rewrites"))
    if Path(folder).is_dir():  # a folder report cannot write into: said before anything is read
        _guarded(lambda: _probe(Path(folder), f"FOLDER {folder!r}, which report rewrites,"))
    if holder := lock_holder(folder):  # a study still writing: its records so far; it rewrites the report at its end
        _console(stderr=True).print(
            f"note: {folder} is in use by {holder}, still running: this report covers the records stored so far "
            "(the study writes the full report when it finishes)",
            markup=False,
            highlight=False,
        )

    from flashcheck.questions.serving import is_serving_folder

    if is_serving_folder(folder):
        from flashcheck.cli.serving import print_serving
        from flashcheck.questions.serving.report import build_serving_report

        print_serving(_guarded(lambda: _room(build_serving_report, folder)), folder)
        return
    own = next((s.own_report for s in sets() if s.owns_folder is not None and s.owns_folder(folder)), None)
    if own is not None:  # a folder of a preset with a report of its own (the guide's)
        _print_guide(_guarded(lambda: _room(own, folder)), None, folder)
        return
    summary = _guarded(lambda: _room(build_report, folder))
    _print_findings(summary, None, folder)


def _report(build: Callable[[str], dict], folder: str, quiet: bool, config: Any) -> dict:
    """_room(build, folder), said first on stderr (the figures take seconds after the last case's progress line);
    a Ctrl-C meanwhile is runner.StudyInterrupted, its line saying what is stored and how to finish the report."""
    from flashcheck.study.runner import StudyInterrupted, interrupted_line

    if not quiet:
        typer.echo("report: drawing the figures, writing report.html and report.md", err=True)
    try:
        return _room(build, folder)
    except KeyboardInterrupt:
        raise StudyInterrupted(interrupted_line(config, Path(folder), in_report=True)) from None


def _room(build: Callable[[str], dict], folder: str) -> dict:
    """build(folder), a report; a full disk says the room a report takes (runner.REPORT_BYTES)."""
    from flashcheck.core.fileio import DiskFull, full_error
    from flashcheck.study.runner import REPORT_BYTES

    try:
        return build(folder)
    except DiskFull as exc:
        raise full_error(exc, exc.path, REPORT_BYTES) from exc


def _print_guide(summary: dict, stats: dict | None, out: str, quiet: bool = False) -> None:
    """The guide's claims, one line each: verdict, claim, what was measured (the conditions are in the report)."""
    from rich.markup import escape

    console = _console()
    _print_partial(summary, quiet)
    if stats and not quiet:
        console.print(
            f"{stats['cases_computed']} error cases computed, {stats['cases_reused']} reused; "
            f"{stats['guide_tasks_computed']} guide tasks computed; {stats['seconds']:.1f} s"
        )
    if not quiet:
        console.print(escape(summary["answer"]))
        _print_claims(summary["findings"], console)
    _print_failures(summary, _console(stderr=True) if quiet else console)
    if not quiet:
        console.print(f"report: {escape(str(out))}/report.html, report.md, summary.json")


def _print_claims(claims: list[dict], console) -> None:
    """The guide's claims, one line each: verdict, claim, id, what was measured (the conditions are in the report)."""
    from rich.markup import escape

    from flashcheck.questions.guide.report import shown_status

    colour = {"holds": "green", "does not hold": "red", "structural": "blue"}
    for f in claims:  # the verdict as the report's table shows it, with its why (a busy machine, a side missed)
        shown = shown_status(f)
        status, _, why = shown.partition(": ")
        if why and why in f["measured"]:  # the line says the why once: the measured text after the dash has it
            shown = status
        word = f"[{colour.get(f['status'], 'dim')}]{escape(shown)}[/]"
        console.print(f"{word}: {escape(f['claim'])} ({escape(f['id'])}) — {escape(f['measured'])}")


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run fn; a ValueError exits 2 with its message; warnings become `warning: ...` lines on stderr."""
    try:
        with warnings_as_lines():
            return fn()
    except ValueError as exc:
        _fail_usage(str(exc))


STATUS_STYLE = {
    "holds": "[green]holds[/]",
    "does not hold": "[red]does not hold[/]",
    "inconclusive": "[yellow]inconclusive[/]",
    "structural": "[blue]structural[/]",
}


def finding_status(f: dict) -> str:
    """A finding's status; older summaries carry only `holds`."""
    return f.get("status") or {True: "holds", False: "does not hold", None: "not measured"}[f["holds"]]


def _print_findings(summary: dict, stats: dict | None, out: str, quiet: bool = False) -> None:
    from rich.markup import escape

    from flashcheck.cli.show import verdict_text

    console = _console()
    _print_partial(summary, quiet)
    if stats and not quiet:
        too_big = f", {stats['cases_too_big']} too big for memory" if stats["cases_too_big"] else ""
        guide = f", {stats['guide_tasks_computed']} guide tasks" if "guide_tasks_computed" in stats else ""
        console.print(
            f"{stats['cases_computed']} cases computed, {stats['cases_reused']} reused from the store{too_big}, "
            f"{stats['reference_computations']} FP64 references{guide}, {stats['seconds']:.1f} s"
        )
    if not quiet:
        if summary.get("answer"):  # the report's first lines: the answer in plain sentences
            console.print("[bold]Answer[/]")
            for text in [summary["answer"]] if isinstance(summary["answer"], str) else summary["answer"]:
                console.print(escape(text))
        if summary.get("conclusion") and summary.get("study") != "production":  # production: verdicts first
            console.print("[bold]Conclusion[/]")
            for c in summary["conclusion"]:
                console.print(f"- {escape(c['text'])}")
            console.print("[bold]Verdicts[/] (95% intervals; rule and n in report.md, summary.json)")
        unmeasured = [f["id"] for f in summary["findings"] if finding_status(f) == "not measured"]
        for f in summary["findings"]:
            status = finding_status(f)
            if status == "not measured":
                continue  # one line for all of them, below (quick printed 13 such lines)
            mark = STATUS_STYLE.get(status, f"[dim]{escape(status)}[/]")
            console.print(f"{escape(f['id'])}: {mark} — {escape(verdict_text(f))}")
        if unmeasured:
            why = "not measured yet" if summary.get("complete") is False else "not measured by this study"  # partial
            console.print(f"[dim]{why} ({len(unmeasured)}): {escape(', '.join(unmeasured))}[/]")
        if summary.get("guide"):
            console.print("[bold]The production guide's claims[/] (conditions in report.md)")
            _print_claims(summary["guide"]["findings"], console)
    if not quiet:
        _print_skipped(summary, console)
    _print_failures(summary, _console(stderr=True) if quiet else console)
    if not quiet:
        console.print(f"report: {escape(str(out))}/report.html, report.md, summary.json")


def _print_partial(summary: dict, quiet: bool) -> None:
    """The first line of an unfinished study's output: "partial: 141 of 564 cases; rerun the same command to
    finish" (on stderr with --quiet, which prints no findings)."""
    if summary.get("partial"):
        _console(stderr=quiet).print(f"[bold yellow]{summary['partial']}[/]", markup=True)


def _print_skipped(summary: dict, console) -> None:
    from rich.markup import escape

    for s in summary.get("skipped", []):
        console.print(f"skipped: {escape(s['method'])}, {s['cases']} case(s): {escape(s['reason'] or 'no reason')}")


def _print_failures(summary: dict, console) -> None:
    from rich.markup import escape

    if not summary["failed"]:
        return
    console.print(f"[red]{summary['failed']} case(s) failed[/] (tried again on the next run):")
    for f in summary["failures"][:LISTED_FAILURES]:
        error = (f["error"] or "").strip().splitlines()[0] if (f["error"] or "").strip() else "no message"
        console.print(f"  {escape(f['case'])}: {escape(error)}")
    if summary["failed"] > LISTED_FAILURES:
        console.print(f"  ... and {summary['failed'] - LISTED_FAILURES} more (report.md, summary.json)")
