"""The one interface a question set implements (QuestionSet; what it reads and adds to a report: study.part) and
the table of registered sets that the engine reads: the engine names no set. The shipped sets register when
`QUESTION_MODULES` are imported (lazily, on the first look-up, so `import flashcheck` stays cheap); a test or a
plug-in calls `register` itself."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

QUESTION_MODULES = ["flashcheck.questions"]  # imported on the first look-up; each registers its sets
Draw = Callable[[Any, list, Path, str], None]  # draw(sweep, points, path, title): a question's own figure
_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class QuestionSet:
    """One set of questions: its presets, verdicts, report part and figures. order: its place in the report
    (verdicts, conclusion, summary keys). solo: its presets whose report holds its verdicts alone.
    notes: a question's note above its table; cells: a verdict's id -> its 'paper' cell in the verdicts table
    (where the finding's own `paper` is too short for it); published: question -> method -> a paper's value (the table's
    'paper' column); draw: question -> draw(sweep, points, path, title), a figure of its own.
    settings: (a table of study.json and TOML, its class with from_dict(data, source) and to_dict()) and
    tasks(folder, settings, quiet) -> statistics: work it runs after the cases when a study has that table.
    own_report(folder) -> summary: the whole report of its solo presets (owns_folder tells such a folder).
    titles: a question's (or table's) id -> the heading a reader sees (the id stays its anchor).
    files: the files its tasks keep in a study folder (part of the study's store: refused when linked)."""

    name: str
    order: int
    presets: Mapping[str, Callable[[], Any]] = field(default_factory=dict)  # name -> a StudyConfig maker
    solo: frozenset[str] = frozenset()
    findings: Callable[[Any], list[dict]] | None = None  # findings(study.part.Study)
    report: Callable[[Any], Any] | None = None  # report(study.part.Study) -> study.part.Part
    notes: Mapping[str, str] = field(default_factory=dict)
    cells: Mapping[str, str] = field(default_factory=dict)
    published: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    draw: Mapping[str, Draw] = field(default_factory=dict)
    settings: tuple[str, Any] | None = None
    tasks: Callable[[Path, Any, bool], dict] | None = None
    own_report: Callable[[str | Path], dict] | None = None
    owns_folder: Callable[[str | Path], bool] | None = None
    titles: Mapping[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()


_SETS: dict[str, QuestionSet] = {}
_LOADED: list[str] = []


def register(qs: QuestionSet) -> QuestionSet:
    """Add a question set (ValueError when its name or one of its presets is taken)."""
    if not isinstance(qs, QuestionSet):
        raise TypeError(f"register() takes a QuestionSet, got a {type(qs).__name__}")
    if qs.name in _SETS:
        raise ValueError(f"a question set named {qs.name!r} is registered already")
    taken = [p for s in _SETS.values() for p in s.presets if p in qs.presets]
    if taken:
        raise ValueError(f"question set {qs.name!r}: preset {taken[0]!r} is another set's")
    _SETS[qs.name] = qs
    return qs


def unregister(name: str) -> None:
    _SETS.pop(name, None)


@contextmanager
def registered(qs: QuestionSet) -> Iterator[QuestionSet]:
    """`qs` registered for the block (tests)."""
    sets()
    register(qs)
    try:
        yield qs
    finally:
        unregister(qs.name)


def sets() -> list[QuestionSet]:
    """Every registered set, in report order (importing QUESTION_MODULES on the first call)."""
    for module in QUESTION_MODULES:
        if module not in _LOADED:
            _LOADED.append(module)
            importlib.import_module(module)
    return sorted(_SETS.values(), key=lambda s: s.order)


def presets() -> dict[str, Callable[[], Any]]:
    """Every registered preset name -> its StudyConfig maker, in registration order."""
    sets()
    return {name: make for s in _SETS.values() for name, make in s.presets.items()}


def solo_set(preset: str) -> QuestionSet | None:
    """The set whose report a study of `preset` shows alone (None for a study of several sets)."""
    return next((s for s in sets() if preset in s.solo), None)


def settings_tables() -> dict[str, Any]:
    """Table name -> settings class, for every set that has settings."""
    return {s.settings[0]: s.settings[1] for s in sets() if s.settings is not None}


def store_files() -> tuple[str, ...]:
    """The files every registered set keeps in a study folder (QuestionSet.files), in report order."""
    return tuple(f for s in sets() for f in s.files)


def notes() -> dict[str, str]:
    return {q: text for s in sets() for q, text in s.notes.items()}


def titles() -> dict[str, str]:
    """Every registered question's heading by its id (a question without one is headed by its id)."""
    return {q: text for s in sets() for q, text in s.titles.items()}


def cells() -> dict[str, str]:
    return {fid: text for s in sets() for fid, text in s.cells.items()}


def published(question: str) -> Mapping[str, float]:
    return next((s.published[question] for s in sets() if question in s.published), _EMPTY)


def drawer(question: str) -> Draw | None:
    return next((s.draw[question] for s in sets() if question in s.draw), None)
