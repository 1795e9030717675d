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
  `dead_rows`: null, "zeros", "nan" or "other";
- every finite number at most MAX_VALUE in size (no error or statistic of attention in the tool's formats comes
  near; a larger one would overflow the report's logs, intervals and figure axes); an error (all but cosine
  similarity) is >= 0, a cosine similarity in [-1, 1], a share (f_out, p_collapse) in [0, 1];
- what the readers need (`needs`, given by the study that reads the store): an ok record holds in `errors` every
  metric its study's sweeps report (a record without it is dropped, and measured again, never a KeyError).
"""

from __future__ import annotations

import dataclasses
import math

from flashcheck.study.cases import STATUSES, Case
from flashcheck.study.config import StudyConfig

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


MAX_VALUE = 1e100
SHARES = ("f_out", "p_collapse")  # statistics that are fractions of a whole


def _range_problem(name: str, k: str, v: float) -> str | None:
    if not math.isfinite(v):
        return None  # NaN and +-Infinity: a measurement of an output that overflowed (see above)
    if abs(v) > MAX_VALUE:
        return f"{name}.{k} is {v:.3g}, larger than any value a measurement gives (at most {MAX_VALUE:g})"
    if name == "stats":
        if k in SHARES and not 0.0 <= v <= 1.0:
            return f"stats.{k} is {v:.3g}, not a share in [0, 1]"
        return None
    if k.endswith("cos_sim"):
        return None if -1.0 - 1e-9 <= v <= 1.0 + 1e-9 else f"{name}.{k} is {v:.3g}, not a cosine in [-1, 1]"
    return None if v >= 0 else f"{name}.{k} is {v:.3g}, not an error (>= 0)"


def _numbers_problem(name: str, d: object, *, nullable: bool = False) -> str | None:
    if not isinstance(d, dict):
        return f"{name} is not an object"
    for k, v in d.items():
        if v is None and nullable:
            continue
        if not _is_number(v):
            return f"{name}.{k} is {v!r}, not a number"
        if isinstance(v, int) and abs(v) > MAX_VALUE:  # also no float (10**400): never float() it
            return f"{name}.{k} is an integer of {len(str(abs(v)))} digits, larger than any value a measurement gives"
        if (why := _range_problem(name, k, float(v))) is not None:
            return why
    return None


def record_problem(d: object, needs: frozenset[str] = frozenset()) -> str | None:
    """Why the parsed line `d` is not a record this tool wrote, or one its reader cannot use (`needs`: the metrics
    an ok record's errors must hold), naming the first field that breaks the schema in the module docstring; else
    None."""
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
    if d["status"] == "ok" and (missing := sorted(needs - set(d["errors"]))):
        return f"errors.{missing[0]} is missing (a metric this study reports)"
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


def study_needs(config: StudyConfig) -> frozenset[str]:
    """The metrics an ok record of `config` must hold for its report: each sweep's metric."""
    return frozenset(sw.metric for sw in config.sweeps)
