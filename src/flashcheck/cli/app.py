"""The typer app, the shared option types and the helpers of every command."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from enum import StrEnum
from pathlib import Path

import typer
from typer.core import TyperCommand, TyperGroup

from flashcheck.core.fileio import LinkRefused, UnsafeFile

# click's base of every usage error (typer vendors click in newer releases, so found through typer's own class)
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _one_line(exc: Exception) -> str:
    """A click error as one line: typer's parsing errors say which value they got ("(got 'abc')"),
    without pydantic's "Value error, " prefix; where the command is known, the help to read."""
    message = exc.format_message()
    errors = getattr(exc.__cause__, "errors", None)
    value = errors()[0].get("input") if callable(errors) and errors() else None
    message = message.replace("Value error, ", "")
    if value is not None:  # "Input should be a valid integer, unable to parse ..." -> "'abc' is not a valid integer"
        message = re.sub(r"Input should be (a valid \w+)[^(]*", lambda m: f"{value!r} is not {m[1]}", message)
    if value is not None and str(value) not in message:
        message = f"{message} (got {value!r})"
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and type(exc).__name__ != "BadParameter":
        message = f"{message.rstrip('.')}; see '{ctx.command_path} --help'"
    return " ".join(message.split())


def _plain_flags(params: list) -> list:
    """`params` with no type shown for an on/off flag (--quiet, --json, --help): typer would print `<bool>`
    after it, as if it took a value."""
    for p in params:
        if getattr(p, "is_flag", False) and not getattr(p, "count", False) and p.metavar is None:
            p.metavar = ""
    return params


def _filled(params: list) -> list:
    """`params` whose help names "{KERNEL_PRESETS}" with the registry's preset names filled in: loaded when a
    command's help or options are read, never for `flashcheck --help` (the registry imports torch)."""
    for p in params:
        if "{KERNEL_PRESETS}" in (getattr(p, "help", None) or ""):
            from flashcheck.kernels.sim.presets import KERNEL_PRESETS

            p.help = p.help.replace("{KERNEL_PRESETS}", ", ".join(KERNEL_PRESETS))
    return params


class _Command(TyperCommand):
    """typer's command with plain flags in its help (_plain_flags) and preset names filled in (_filled)."""

    def get_params(self, ctx: typer.Context) -> list:
        return _filled(_plain_flags(super().get_params(ctx)))


class _Typer(typer.Typer):
    """typer's app whose commands are _Command unless a command asks for another class."""

    def command(self, *args: object, cls: type[TyperCommand] | None = None, **kwargs: object):
        return super().command(*args, cls=cls or _Command, **kwargs)


class _Group(TyperGroup):
    """typer's group, whose usage errors (an unknown option or command, a value out of range or of the
    wrong type, a missing argument) are one line on stderr, "error: ...", and exit code 2, like the
    commands' own checks; rich's framed error box and the usage lines are left out. Plain flags as in
    _Command."""

    def get_params(self, ctx: typer.Context) -> list:
        return _plain_flags(super().get_params(ctx))

    def make_context(
        self, info_name: str | None, args: list[str], parent: typer.Context | None = None, **extra: object
    ) -> typer.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _CLICK_ERROR as exc:
            _usage_error(exc)

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except _CLICK_ERROR as exc:
            _usage_error(exc)
        except (LinkRefused, UnsafeFile) as exc:  # wherever a command meets one: a file it must not use, one line
            _fail_usage(" ".join(str(exc).split()))
        except OSError as exc:
            from flashcheck.core.fileio import is_full

            if not is_full(exc):
                raise
            _disk_full(exc)


EXIT_DISK_FULL = 3  # README: exit codes


def _disk_full(exc: OSError) -> None:
    """A full disk as one line on stderr (the folder, its free space, what is still needed) and exit code 3."""
    import shutil

    target = Path(exc.filename or ".").absolute()  # no file named: the working folder
    folder = next((p for p in [target, *target.parents] if p.is_dir()), Path("/"))
    writing = f" while writing {target.name!r}" if target != folder else ""
    try:
        free = _size(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    needed = getattr(exc, "needed", None)
    need = f"free at least {_size(needed)} there" if needed else "free some space there"
    typer.echo(
        f"error: no space left in {str(folder)!r} ({free} free){writing}; {need} (or give "
        "another --out folder) and run the same command again: everything written before is kept whole",
        err=True,
    )
    raise typer.Exit(EXIT_DISK_FULL)


def _size(n: int) -> str:
    """Bytes in kB, MB or GB (powers of 1000) to three significant digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _usage_error(exc: Exception) -> None:
    """Print a click error on one line and exit with its code; `flashcheck` alone still prints the help."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    typer.echo(f"error: {_one_line(exc)}", err=True)
    raise typer.Exit(getattr(exc, "exit_code", 2))


app = _Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Is Flash Attention stable? Measure attention numerics against an exact FP64 reference.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"flashcheck {version('flashcheck')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("flashcheck (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _root(
    _version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print flashcheck's version and exit."
    ),
) -> None:
    """Is Flash Attention stable? Measure attention numerics against an exact FP64 reference."""


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
    sink = "sink"


class Fp8Scaling(StrEnum):
    tensor = "tensor"
    block = "block"


def _fail_usage(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def warnings_as_lines():
    """Warnings raised in the block become `warning: ...` lines on stderr (each text once, not Python's two lines
    of source path and code), printed when it ends, before any error it raises is reported."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                if (text := str(w.message)) not in seen:
                    seen.add(text)
                    typer.echo(f"warning: {text}", err=True)


def _starting(text: str, quiet: bool = False) -> None:
    """A long command's first line on a terminal, on stderr, before its heavy imports (torch alone takes seconds
    to load): what it is about to do. None with --quiet, and none off a terminal, where a usage error found after
    those imports stays the one line a script reads (as progress, which is plain lines there, starts later)."""
    if not quiet and sys.stderr.isatty():
        typer.echo(text, err=True)


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


BLOCK_MAX = 2**31 - 1


def _int_range(name: str, lo: int, hi: int):
    """A typer callback: the value must lie in [lo, hi] (so a huge integer is bad usage, not an OverflowError)."""

    def check(value: int | None) -> int | None:
        if value is not None and not lo <= value <= hi:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be an integer from {lo} to {hi}")
        return value

    return check


MAX_SEED = 2**63 - 1  # torch's generator takes a signed 64-bit seed
_seed = _int_range("--seed", 0, MAX_SEED)  # the rule of every command's --seed (a typer callback; None passes)


def _no_empty(options: dict[str, str | None]) -> None:
    """ValueError for the first option given as an empty string (it would otherwise mean its default)."""
    for flag, value in options.items():
        if value is not None and not str(value).strip():
            raise ValueError(f"{flag} {value!r} is empty; give a value or leave the option out for its default")


def _splits_fit(splits: list[int], lk: int, block_k: int) -> int:
    """The key blocks ceil(Lk / Bc); ValueError naming the first S above them (the split-KV kernel splits whole
    blocks, so it would run fewer chunks than asked)."""
    blocks = -(-lk // block_k)
    over = [s for s in splits if s > blocks]
    if over:
        raise ValueError(
            f"--splits {over[0]} is more than the {blocks} key block(s) of Lk={lk} at --block-k {block_k} "
            f"(ceil(Lk / block_k)); the kernel splits whole blocks, so give S from 1 to {blocks}"
        )
    return blocks


def _out_folder(out: str, flag: str = "--out") -> Path:
    """The folder a command writes into, checked before any work, leaving nothing behind (a probe folder is made
    and removed at once, see _probe): not empty, not a symbolic link, not a file, writable. A missing folder is
    created later, but only as the last part of the path (like mkdir): a missing parent (a typo such as
    'reslts/run1') is refused rather than created as a new tree. ValueError names the value and what is wrong."""
    if not str(out).strip():
        raise ValueError(f"{flag} {out!r} is empty; give a folder")
    path = Path(out).expanduser()
    from flashcheck.core.fileio import refuse_link

    refuse_link(path, f"{flag} folder")  # a link (dangling or not) is refused before any work: nothing written via it
    full = path.absolute()
    lowest = next(p for p in [full, *full.parents] if p.exists())  # the deepest part that exists
    if not lowest.is_dir():
        what = "it" if lowest == full else repr(str(lowest))
        raise ValueError(f"{flag} {out!r} is not writable: {what} is a file, not a folder; give a folder")
    if lowest not in (full, full.parent):
        missing = next(p for p in reversed(full.parents) if not p.exists())
        raise ValueError(
            f"{flag} {out!r}: the folder {str(missing)!r} does not exist; create it first or give another "
            f"{flag} (only its last folder is created)"
        )
    if not os.access(lowest, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out!r} is not writable: no write permission in {str(lowest)!r}")
    _probe(full if lowest == full else full.parent, f"{flag} {out!r}")
    return path


def _probe(folder: Path, what: str) -> None:
    """ValueError when no folder can be made in `folder` (a read-only or virtual file system such as /proc,
    where os.access says yes to root): one made and removed at once, so nothing is left behind."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".flashcheck-probe-", dir=folder))
    except OSError as exc:
        why = exc.strerror or exc
        raise ValueError(f"{what} is not writable: no folder can be made in {str(folder)!r} ({why})") from None


def _out_file(path: str, flag: str) -> Path:
    """A file a command writes (--pin), checked before any work like _out_folder: not empty, not a folder or
    link, in a folder that exists and is writable. ValueError names the value and what is wrong."""
    if not str(path).strip():
        raise ValueError(f"{flag} {path!r} is empty; give a file name")
    file = Path(path).expanduser()
    from flashcheck.core.fileio import refuse_link

    refuse_link(file, f"{flag} file")
    if file.is_dir():
        raise ValueError(f"{flag} {path!r} is a folder; give a file name")
    parent = file.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path!r}: the folder {str(parent)!r} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r} is not writable: no write permission in {str(parent)!r}")
    _probe(parent, f"{flag} {path!r}")
    return file


STUDY_FILES = ("records.jsonl", "study.json")  # a study's store: no other command writes into such a folder
WHOSE = dict.fromkeys(STUDY_FILES, "`flashcheck study`")


def _not_others(folder: Path, command: str, keys: set[str] | list[set[str]], flag: str = "--out") -> None:
    """ValueError when `folder` holds another command's output that `command` would overwrite: a study's records
    (STUDY_FILES), or a summary.json without all of `keys` (those of `command`'s own summary.json). Checked before
    any work; an absent folder or summary.json is fine."""
    from flashcheck.core.jsonguard import read_json

    taken = next((n for n in STUDY_FILES if os.path.lexists(folder / n)), None)
    if taken is None and os.path.lexists(folder / "summary.json"):
        try:  # bounded: a summary.json nested 500,000 deep is another command's, not a RecursionError
            data = read_json(folder / "summary.json", "summary.json in --out", follow=False, constants=True)
        except LinkRefused:
            raise  # a link in --out: said as such, not as another command's output
        except (OSError, ValueError):
            data = None
        shapes = keys if isinstance(keys, list) else [keys]  # the command's summaries (validate has two)
        taken = None if isinstance(data, dict) and any(k <= data.keys() for k in shapes) else "summary.json"
    if taken is not None:
        raise ValueError(
            f"{flag} {str(folder)!r} holds {taken}, {WHOSE.get(taken, 'another command')}'s output, which "
            f"`flashcheck {command}` would overwrite: give another {flag} (a new folder, or one {command} wrote)"
        )


def default_out(base: str, preset: str, config: str | None = None) -> str:
    """A command's default folder: `base` for the quick preset, `base-PRESET` for another, `base-NAME` for a
    custom sweep NAME.toml, so that running two of them one after the other needs no --out."""
    name = Path(config).stem if config is not None else preset
    if (name == "quick" and config is None) or not re.fullmatch(r"[\w.+-]+", name):  # an odd name errs later
        return base
    return f"{base}-{name}"


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
