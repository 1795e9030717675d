"""A hunt's findings store (findings.json in --out): the Finding and HuntState it holds, written atomically and read
back schema-checked, field by field, like a study's records.jsonl: a store anyone may have edited gives one line
naming the file and the field (a ValueError), never a KeyError, a TypeError or a path outside --out."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.core.fileio import write_atomic
from flashcheck.core.jsonguard import read_json
from flashcheck.hunt.case import HuntCase, parse_case
from flashcheck.hunt.judge import KINDS as VERDICT_KINDS
from flashcheck.hunt.target import Target

STORE = "findings.json"
KINDS = (*VERDICT_KINDS, "failed")  # failed: the target raised on every case
# a finding's tensor: out / dq / dk / dv, a signal ('SIGSEGV', 'exit code 3'), 'hang' or 'all' (failed): it names a
# file of findings/, so it is one short plain word group, never a path
TENSOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,39}$")
CATEGORIES = (
    "kernel-bug",
    "simulated",
    "format-overflow",
    "convention",
    "private-only",
    "crash",
    "hang",
    "target-error",
)


@dataclass
class Finding:
    """A failure of one kind on one tensor, shrunk: the minimal case, where it fails and when it was found.
    `api`: 'public', or 'private: OP' (the private op the target calls); `category`: CATEGORIES; `max_logit`: the
    largest |scaled logit| of the minimal case; `known`: a known upstream report it matches ('' when none)."""

    kind: str
    tensor: str
    case: HuntCase
    where: str
    message: str
    found_after_s: float  # hunt time when the first case of this kind was seen
    shrunk_after_s: float  # hunt time when its shrinking ended
    examples_before: int
    margin: float = 0.0  # the worst check's error / bound (how far over the budget a budget finding is)
    provisional: bool = False  # a crash stored when first seen, before its round shrank it
    api: str = "public"
    category: str = ""
    max_logit: float | None = None
    known: str = ""

    @property
    def signature(self) -> tuple[str, str]:
        return (self.kind, self.tensor)

    def reproducer(self, target: Target) -> str:
        device = f" --device {target.device}" if target.device != "cpu" else ""
        return f"flashcheck compare --backend {target.name}{device} --case '{self.case.to_text()}'"

    def to_dict(self, target: Target | None = None) -> dict:
        d = {
            "kind": self.kind,
            "tensor": self.tensor,
            "case": self.case.to_text(),
            "describe": self.case.describe(),
            "where": self.where,
            "message": self.message,
            "found_after_s": round(self.found_after_s, 2),
            "shrunk_after_s": round(self.shrunk_after_s, 2),
            "examples_before": self.examples_before,
            "margin": round(self.margin, 4) if math.isfinite(self.margin) else None,  # JSON has no Infinity
            "api": self.api,
            "category": self.category,
            "max_logit": None if self.max_logit is None else float(f"{self.max_logit:.4g}"),
            "known": self.known,
        } | ({"provisional": True} if self.provisional else {})
        return d | ({"reproducer": self.reproducer(target)} if target else {})

    @classmethod
    def from_dict(cls, d: object, where: str = "a finding") -> Finding:
        """A Finding from its to_dict form; ValueError naming `where` and the field that is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"{where} is a JSON {type(d).__name__}, not an object")
        kind = _field(d, "kind", where, lambda v: v in KINDS, f"one of {', '.join(KINDS)}")
        tensor = _field(d, "tensor", where, lambda v: isinstance(v, str) and TENSOR.match(v), "a tensor or signal name")
        text = _field(d, "case", where, lambda v: isinstance(v, str), "a case's text")
        try:
            case = parse_case(text)
        except ValueError as exc:
            raise ValueError(f"{where}.case is not a case: {exc}") from None
        words = {k: _field(d, k, where, lambda v: isinstance(v, str), "a string") for k in ("where", "message")}
        times = {k: _field(d, k, where, _seconds, "a number of seconds") for k in ("found_after_s", "shrunk_after_s")}
        before = _field(d, "examples_before", where, _count, "a count")
        margin = _field(d, "margin", where, lambda v: v is None or _number(v), "a number or null", None)
        provisional = _field(d, "provisional", where, lambda v: isinstance(v, bool), "true or false", False)
        api = _field(d, "api", where, lambda v: isinstance(v, str) and len(v) < 200, "a string", "public")
        category = _field(d, "category", where, lambda v: v in ("", *CATEGORIES), "a category", "")
        logit = _field(d, "max_logit", where, lambda v: v is None or _number(v), "a number or null", None)
        known = _field(d, "known", where, lambda v: isinstance(v, str) and len(v) < 400, "a string", "")
        return cls(
            kind, tensor, case, **words, **times, examples_before=before, margin=math.inf if margin is None else margin,
            provisional=provisional, api=api, category=category, max_logit=logit, known=known,
        )  # fmt: skip


_MISSING = object()


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _seconds(v: object) -> bool:
    return _number(v) and v >= 0


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _field(d: dict, key: str, where: str, ok, what: str, default=_MISSING):
    """d[key] when ok(it); the default when absent (if any); ValueError naming where, the key and what is allowed."""
    if key not in d:
        if default is _MISSING:
            raise ValueError(f"{where} has no field {key!r}")
        return default
    value = d[key]
    if not ok(value):
        raise ValueError(f"{where}.{key} = {_short(value)} is not {what}")
    return value


def _short(value: object) -> str:
    text = repr(value)  # repr escapes control characters: nothing of the file reaches the terminal raw
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class HuntState:
    """What a hunt has done so far (the findings store's content). `first_error`: the first refused case and its
    error (what a target that fails every case is reported with)."""

    target: str
    elapsed_s: float = 0.0
    examples: int = 0
    refusals: int = 0
    crashes: int = 0  # cases that killed the target's process (isolated targets)
    rounds: int = 0
    refusal_examples: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    first_error: list[str] = field(default_factory=list)  # [case text, error] of the first refused case

    def save(self, out: Path, target: Target) -> None:
        keys = ("target", "elapsed_s", "examples", "refusals", "crashes", "rounds", "refusal_examples", "first_error")
        d = {k: getattr(self, k) for k in keys}
        d["findings"] = [f.to_dict(target) for f in self.findings]
        write_atomic(out / STORE, json.dumps(d, indent=1) + "\n")

    @classmethod
    def load(cls, out: Path, target: Target) -> HuntState:
        """The stored state of a hunt of `target` in `out` (a fresh one when none); ValueError (one line naming the
        file and the field) for another target's store or one that is not a findings store."""
        path = out / STORE
        if not path.exists() and not path.is_symlink():
            return cls(target.name)
        try:
            d = read_json(path, "a hunt's findings", follow=False)  # bounded nesting, never through a link
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} is not a findings store ({exc}); give another --out") from None
        try:
            return cls._checked(d, target)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}; give another --out, or delete the file to start afresh") from None

    @classmethod
    def _checked(cls, d: object, target: Target) -> HuntState:
        if not isinstance(d, dict):
            raise ValueError(f"not a findings store (a JSON {type(d).__name__})")
        if d.get("target") != target.name:
            raise ValueError(f"it holds a hunt of {_short(d.get('target'))}, not {target.name!r}")
        out = {"elapsed_s": _field(d, "elapsed_s", "the store", _seconds, "a number of seconds", 0.0)}
        for key in ("examples", "refusals", "crashes", "rounds"):
            out[key] = _field(d, key, "the store", _count, "a count", 0)
        strings = lambda v: isinstance(v, list) and len(v) <= 10 and all(isinstance(x, str) for x in v)  # noqa: E731
        out["refusal_examples"] = list(_field(d, "refusal_examples", "the store", strings, "a list of strings", []))
        out["first_error"] = list(_field(d, "first_error", "the store", strings, "a list of strings", []))
        found = _field(d, "findings", "the store", lambda v: isinstance(v, list), "a list", [])
        findings = [Finding.from_dict(f, f"findings[{i}]") for i, f in enumerate(found)]
        return cls(target.name, findings=findings, **out)
