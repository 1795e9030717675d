"""The schema of a line of guide.jsonl: what a task's line must hold before the guide's claims read it.

A line the tool wrote always passes; a forged or mistyped one is named with the first field that breaks the rule
(tasks.load_results drops it with one warning naming the file and line, and its task is measured again). Each
kind's `result` holds the fields measure.py writes, with their types: a number where the claims compute, a string
where they print; a `params` holds the fields the report looks a task up by. Fields not listed are ignored.
"""

from __future__ import annotations

import math

NUM, INT, STR, BOOL = "number", "integer", "string", "true or false"


def _opt(t: object) -> tuple:
    return ("optional", t)


def _list(t: object) -> tuple:
    return ("list", t)


def _map(t: object) -> tuple:
    return ("map", t)


_BOUNDARY = {"boundary_keys": _opt(INT), "outcome": _opt(STR), "points": _map(STR), "monotone": BOOL}
RESULTS: dict[str, dict] = {
    "scale": {
        "boundary_i": _opt(INT),
        "inputs_overflow_i": _opt(INT),
        "boundary_sigma": _opt(NUM),
        "points": _map(BOOL),
        "monotone": BOOL,
    },
    "sum": _BOUNDARY,
    "sum_points": _BOUNDARY,
    "latency": {"blocks": _map(_list(_list(NUM)))},
    "cost": {"times": _list(NUM), "peak_bytes": _opt(NUM)},
    "explain": {"full": NUM, "alone": _map(NUM), "raised": _map(NUM), "dominant_stage": STR},
    "gpu_same": {"available": BOOL},
    "gpu_deterministic": {},
}
PARAMS: dict[str, dict] = {
    "scale": {"method": STR, "seq_len": INT},
    "sum": {"method": STR},
    "sum_points": {"method": STR},
    "latency": {"seq_len": INT},
    "cost": {"method": STR, "seq_len": INT, "backward": BOOL},
    "explain": {"seq_len": INT},
    "gpu_same": {},
    "gpu_deterministic": {},
}


def _is(value: object, t: str) -> bool:
    if t == NUM:  # finite: a timing, an error or a boundary the claims divide and take logs of
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if t == INT:
        return type(value) is int
    return isinstance(value, {STR: str, BOOL: bool}[t])


def _problem(value: object, t: object, name: str) -> str | None:
    """Why `value` (at field `name`) is not of type `t`, else None."""
    if isinstance(t, dict):
        if not isinstance(value, dict):
            return f"{name} is not an object"
        for key, sub in t.items():
            if key not in value:
                if isinstance(sub, tuple) and sub[0] == "optional":
                    continue
                return f"{name}.{key} is missing"
            if (why := _problem(value[key], sub, f"{name}.{key}")) is not None:
                return why
        return None
    if isinstance(t, tuple):
        kind, sub = t
        if kind == "optional":
            return None if value is None else _problem(value, sub, name)
        if kind == "list" and isinstance(value, list):
            return next((w for i, x in enumerate(value) if (w := _problem(x, sub, f"{name}[{i}]")) is not None), None)
        if kind == "map" and isinstance(value, dict):
            return next((w for k, x in value.items() if (w := _problem(x, sub, f"{name}.{k}")) is not None), None)
        return f"{name} is not a{'n object' if kind == 'map' else ' list'}"
    if not _is(value, t):
        return f"{name} is {str(value)[:40]!r}, not a{'n' if t == INT else ''} {t}"
    return None


def result_problem(obj: dict) -> str | None:
    """Why the parsed guide.jsonl line `obj` is not a task's line the tool wrote (the first field that breaks the
    schema in the module docstring), else None."""
    params = obj.get("params")
    kind = params.get("kind") if isinstance(params, dict) else None
    if kind not in RESULTS:
        return f"params.kind is {str(kind)[:40]!r}; expected one of {', '.join(RESULTS)}"
    if (why := _problem(params, PARAMS[kind], "params")) is not None:
        return why
    if obj.get("status") != "ok":
        return None
    if (why := _problem(obj.get("result"), RESULTS[kind], "result")) is not None:
        return why
    r = obj["result"]
    if kind == "explain" and r["dominant_stage"] not in r["raised"]:
        return f"result.dominant_stage {r['dominant_stage'][:40]!r} is not a stage of result.raised"
    return None
