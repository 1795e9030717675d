"""`flashcheck mutants`: how many realistic kernel bugs an acceptance rule catches, and how often it fails
correct kernels."""

from __future__ import annotations

import json

import typer

from flashcheck.cli.app import _console, _fail_usage, _not_others, _out_folder, _progress, app
from flashcheck.core.fileio import refuse_link


@app.command()
def mutants(
    rule: str = typer.Option("peers,flashcheck", help="Rules to score, comma-separated: peers, flashcheck."),
    size: str = typer.Option("quick", help="Grid: tiny, quick (a few minutes) or full (the benchmark's)."),
    out: str = typer.Option("flashcheck-mutants", help="Folder for summary.json, report.md and report.html."),
    threads: int = typer.Option(1, help="torch threads (the cases are small: one is usually the fastest)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Score acceptance rules on the mutant catalogue (flashcheck.testing.mutants): per mutant and dtype,
    caught or not; and the false failures over correct kernels. Exit 1 when a rule fails a correct kernel."""
    from flashcheck.reporting.page import write_report
    from flashcheck.testing import scores

    try:
        rules = _rules(rule)
        if size not in scores.GRIDS:
            raise ValueError(f"--size {size!r} is not allowed; expected one of {', '.join(scores.GRIDS)}")
        if not 1 <= threads <= 1024:
            raise ValueError(f"--threads {threads} is not allowed; give an integer from 1 to 1024")
        folder = _out_folder(out)
        _not_others(folder, "mutants", {"rules", "mutants", "catch_rate"})  # not a study's summary.json
        for name in ("summary.json", "report.md", "report.html"):  # refused before the scoring, not after it
            refuse_link(folder / name, f"{name} in --out")
        folder.mkdir(exist_ok=True)
    except ValueError as exc:
        _fail_usage(str(exc))
    except OSError as exc:
        _fail_usage(f"--out {out!r} is not writable: {exc.strerror or exc}")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # for the scoring only: a caller running the app in its process keeps its own
    try:
        with _progress(scores.step_count(size), "mutants", as_json) as advance:
            result = scores.score(rules, size, advance=advance)
    finally:
        torch.set_num_threads(before)
    data = result.to_dict() | {"size": size}
    write_report(folder, _page(result, size), data)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        _print(result)
        _console().print(f"report: {folder}/report.html, report.md, summary.json", markup=False)
    if any(result.false_failures.failed[r] for r in rules):
        raise typer.Exit(1)


def _rules(text: str) -> tuple[str, ...]:
    """The comma-separated --rule value as rule names; ValueError names the value and the rules allowed."""
    from flashcheck.core.budget import RULES

    names = tuple(r.strip() for r in text.split(","))
    if not all(names) or any(r not in RULES for r in names):
        raise ValueError(f"--rule {text!r} is not allowed; give one or more of {', '.join(RULES)}, comma-separated")
    return names


def _page(result, size: str):
    from flashcheck.reporting.page import Heading, Page, Table, Text
    from flashcheck.testing import scores

    header, rows = scores.table_rows(result)
    return Page(
        f"Mutation score of the acceptance rules ({size} grid)",
        [
            Text("A mutant is the clean tiled kernel plus one bug, at one dtype; caught = the rule fails at least "
                 "one grid case where the bug changes a tensor (failed/active cases, and the checks that fired)."),
            Heading("Mutant x rule"),
            Table(header, rows),
            Text(scores.cases_line(result)),
            Heading("False failures"),
            Text(scores.false_failure_line(result)),
        ],
    )  # fmt: skip


def _print(result) -> None:
    from rich.table import Table

    from flashcheck.testing import scores

    header, rows = scores.table_rows(result)
    table = Table()
    for col in header:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console = _console()
    console.print(table)
    console.print(scores.cases_line(result))
    console.print(scores.false_failure_line(result))
    for rule in result.rules:
        ff = result.false_failures
        verdict = "sound" if ff.failed[rule] == 0 else "FAILS CORRECT KERNELS"
        console.print(
            f"{rule}: catches {result.caught(rule)}/{len(result.rows)} mutants "
            f"({100 * result.catch_rate(rule):.1f}%), {ff.failed[rule]} false failures in {ff.runs} runs: {verdict}"
        )
        for example in ff.examples.get(rule, []):
            console.print(f"  false failure: {example}")
