"""The schema of a stored record (a line of records.jsonl): what a line must hold before it reaches a report.

A line the tool wrote always passes; a forged or mistyped one is named with the first field that breaks the rule:
- `case`: every field of study.cases.Case with its type (str, int, bool; int >= 0, seq_len/batch/heads/head_dim
  >= 1); fields a newer version added are ignored, as CaseRecord.from_dict ignores them;
- `case_id`: the case's own hash (Case.case_id), so a case cannot enter twice under another id;
- `status`: ok, skipped or failed; `error`: a string or null;
- `errors`, `errors_rounded`, `stats`: {name: number} (an ok record has at least one error; a statistic may be
  null). A number there may be NaN or +-Infinity, because the tool writes them for a kernel whose output
  overflowed, or a statistic of rows that see no key (a measurement, not damage);
- `seconds`: a finite number >= 0; `env`: {name: string};
  `dead_rows`: null, "zeros", "nan" or "other".
"""

from __future__ import annotations

import dataclasses
import math

from flashcheck.study.cases import STATUSES, Case

_POSITIVE = ("batch", "heads", "seq_len", "head_dim")
DEAD_ROWS = (None, "zeros", "nan", "other")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _case_problem(d: object) -> str | None:
    if not isinstance(d, dict):
        return "case is not an object"
    for f in dataclasses.fields(Case):
        if f.name not in d:
            if f.default is dataclasses.MISSING:
                return f"case.{f.name} is missing"
            continue
        v, kind = d[f.name], {"str": str, "int": int, "bool": bool}[str(f.type)]
        if type(v) is not kind:
            return f"case.{f.name} is {v!r}, not a{'n' if kind is int else ''} {kind.__name__}"
        if kind is int and (v < 0 or (f.name in _POSITIVE and v < 1)):
            return f"case.{f.name} is {v}, outside the sizes a study measures"
    return None


def _numbers_problem(name: str, d: object, *, nullable: bool = False) -> str | None:
    if not isinstance(d, dict):
        return f"{name} is not an object"
    for k, v in d.items():
        if v is None and nullable:
            continue
        if not _is_number(v):
            return f"{name}.{k} is {v!r}, not a number"
    return None


def record_problem(d: object) -> str | None:
    """Why the parsed line `d` is not a record this tool wrote (the first field that breaks the schema in the
    module docstring), else None."""
    if not isinstance(d, dict):
        return f"a JSON {type(d).__name__}, not a record"
    for key in ("case_id", "case", "status", "errors", "errors_rounded", "seconds"):
        if key not in d:
            return f"{key} is missing"
    if (why := _case_problem(d["case"])) is not None:
        return why
    known = {f.name for f in dataclasses.fields(Case)}
    own = Case(**{k: v for k, v in d["case"].items() if k in known}).case_id
    if d["case_id"] != own:
        return f"case_id {d['case_id']!r} is not the case's own ({own})"
    if d["status"] not in STATUSES:
        return f"status {d['status']!r}; expected one of {', '.join(STATUSES)}"
    for name in ("errors", "errors_rounded"):
        if (why := _numbers_problem(name, d[name])) is not None:
            return why
    if d["status"] == "ok" and not d["errors"]:
        return "an ok record with no errors"
    if not _is_number(d["seconds"]) or not math.isfinite(d["seconds"]) or d["seconds"] < 0:
        return f"seconds is {d['seconds']!r}, not a finite number >= 0"
    if d.get("error") is not None and not isinstance(d["error"], str):
        return f"error is {d['error']!r}, not a string or null"
    if (why := _numbers_problem("stats", d.get("stats") or {}, nullable=True)) is not None:
        return why
    env = d.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "env is not an object of strings"
    if d.get("dead_rows") not in DEAD_ROWS:
        return f"dead_rows is {d['dead_rows']!r}; expected null, zeros, nan or other"
    return None
