"""The typer app, the shared option types and the helpers of every command."""

from __future__ import annotations

import sys
from enum import StrEnum

import typer
from typer.core import TyperGroup


class _Group(TyperGroup):
    """typer's group; a usage error about a value that does not name it (typer's own integer parsing:
    "Input should be a valid integer") gets "(got VALUE)" added."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            errors = getattr(exc.__cause__, "errors", None)
            value = errors()[0].get("input") if callable(errors) and errors() else None
            if value is not None and str(value) not in exc.message:
                exc.message = f"{exc.message} (got {value!r})"
            raise


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Is Flash Attention stable? Measure attention numerics against an exact FP64 reference.",
)


class Kernel(StrEnum):
    flash = "flash"
    standard = "standard"
    splitkv = "splitkv"


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
        vals = [int(x) for x in str(text).split(",")]  # an empty item ("64,,128") is an error, not dropped
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} {text!r} is not allowed; give positive integers, comma-separated")
    return vals


INT64 = (-(2**63), 2**63 - 1)
BLOCK_MAX = 2**31 - 1


def _int_range(name: str, lo: int, hi: int):
    """A typer callback: the value must lie in [lo, hi] (so a huge integer is bad usage, not an OverflowError)."""

    def check(value: int | None) -> int | None:
        if value is not None and not lo <= value <= hi:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be an integer from {lo} to {hi}")
        return value

    return check


def _no_empty(options: dict[str, str | None]) -> None:
    """ValueError for the first option given as an empty string (it would otherwise mean its default)."""
    for flag, value in options.items():
        if value is not None and not str(value).strip():
            raise ValueError(f"{flag} {value!r} is empty; give a value or leave the option out for its default")


def _names(text: str, flag: str) -> list[str]:
    """Comma-separated names, stripped; ValueError for an empty item ('a,,b', 'a,')."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise ValueError(f"{flag} {text!r} has an empty item; give names separated by commas")
    return items


def _console(stderr: bool = False):
    """A rich console without number highlighting or emoji codes. Off a terminal: 160 columns for tables
    and printed lines never wrapped (a verdict stays one line), no ANSI escapes."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 160, highlight=False, emoji=False, soft_wrap=not tty)


def _progress(total: int, label: str, as_json: bool = False):
    """Progress of a command's `total` steps on stderr (see flashcheck.core.progress): none for a single step,
    and with --json only on a terminal, so that output captured with 2>&1 stays JSON."""
    from flashcheck.core.progress import progress

    return progress(total, label, quiet=total <= 1 or (as_json and not sys.stderr.isatty()))
