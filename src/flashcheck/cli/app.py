"""The typer app, the shared option types and the helpers of every command."""

from __future__ import annotations

import sys
from enum import StrEnum

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Is Flash Attention stable? Measure attention numerics against an exact FP64 reference.",
)


class Kernel(StrEnum):
    flash = "flash"
    standard = "standard"


class Algorithm(StrEnum):
    fa1 = "fa1"
    fa2 = "fa2"


class Distribution(StrEnum):
    normal = "normal"
    uniform = "uniform"
    outliers = "outliers"
    sharp = "sharp"
    tied = "tied"


class Fp8Scaling(StrEnum):
    tensor = "tensor"
    block = "block"


def _fail_usage(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _positive(name: str):
    def check(value: int) -> int:
        if value < 1:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be a positive integer")
        return value

    return check


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} {text!r} is not allowed; give positive integers, comma-separated")
    return vals


def _console(stderr: bool = False):
    """A rich console without number highlighting or emoji codes. Off a terminal: 160 columns for tables
    and printed lines never wrapped (a verdict stays one line), no ANSI escapes."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 160, highlight=False, emoji=False, soft_wrap=not tty)


def _progress(total: int, label: str, as_json: bool = False):
    """Progress of a command's `total` steps on stderr (see flashcheck.progress): none for a single step,
    and with --json only on a terminal, so that output captured with 2>&1 stays JSON."""
    from flashcheck.progress import progress

    return progress(total, label, quiet=total <= 1 or (as_json and not sys.stderr.isatty()))
