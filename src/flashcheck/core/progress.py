"""Progress of long commands: a rich bar on a terminal, plain periodic lines on stderr otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

Advance = Callable[..., None]


@contextmanager
def progress(
    total: int,
    label: str,
    *,
    done: int = 0,
    stream: TextIO | None = None,
    interval: float = 2.0,
    quiet: bool = False,
    opening: bool = False,
) -> Iterator[Advance]:
    """Report progress of `total` steps; yields `advance(n=1, note="")`, called after each step.

    On a terminal (`stream.isatty()`, stream defaults to stderr) a rich bar; otherwise one line
    `"{label} {done}/{total}, {seconds} s[, note]"` at most every `interval` seconds and one at the end (normal
    exit only); with `opening`, one at the start too (a log shows the work began: a study's first case can take
    half a minute; not where an error found later must stay the one line a script reads). `done` counts steps
    finished before (a resumed run). `quiet`: report nothing.
    """
    if total < 0 or done < 0:
        raise ValueError(f"progress total={total}, done={done}: both must be >= 0")
    out = sys.stderr if stream is None else stream
    if quiet:
        yield _ignore
    elif out.isatty():
        with _rich_bar(total, label, done, out) as advance:
            yield advance
    else:
        with _plain_lines(total, label, done, out, interval, opening) as advance:
            yield advance


def _ignore(n: int = 1, note: str = "") -> None:
    del n, note


@contextmanager
def _plain_lines(total: int, label: str, done: int, out: TextIO, interval: float, opening: bool) -> Iterator[Advance]:
    start = last = time.monotonic()
    state = {"done": done, "note": "", "shown": -1}

    def line() -> None:
        state["shown"] = state["done"]
        note = f", {state['note']}" if state["note"] else ""
        out.write(f"{label} {state['done']}/{total}, {time.monotonic() - start:.0f} s{note}\n")
        out.flush()

    def advance(n: int = 1, note: str = "") -> None:
        nonlocal last
        state["done"] += n
        state["note"] = note
        now = time.monotonic()
        if now - last >= interval:
            last = now
            line()

    if opening and total > done:
        line()
    yield advance
    if state["shown"] != state["done"]:
        line()


@contextmanager
def _rich_bar(total: int, label: str, done: int, out: TextIO) -> Iterator[Advance]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=out, highlight=False, emoji=False)
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", markup=False),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=total, completed=done, note="")

        def advance(n: int = 1, note: str = "") -> None:
            bar.update(task, advance=n, note=note)

        yield advance
