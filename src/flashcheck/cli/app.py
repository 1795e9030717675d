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
    """A rich console: no number highlighting; 160 columns when the output is not a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)
