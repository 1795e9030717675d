"""The schema of the serving study's unit files (FOLDER/serving/NAME.json, written by tasks._run_units): each
file read back is checked against what its unit writes before the report reads a field of it, so that a damaged
or hand-made file is one line naming the file and the field, never a KeyError or TypeError traceback."""

from __future__ import annotations

import re

from flashcheck.measure.longcontext import VARIANTS

SDPA_TARGETS = ("sdpa-math", "sdpa-flash")  # the real backends certified (units cert-NAME)
SPLIT_TARGETS = ("sim-fa3", "sim-fa3-fixed", "sim-flashinfer", "sim-flashinfer-fixed")  # units fa1897-NAME
NUMBER, INT, TEXT, FLAG = "a number", "an integer", "a string", "true or false"
_KIND = {
    NUMBER: lambda x: isinstance(x, int | float) and not isinstance(x, bool),
    INT: lambda x: isinstance(x, int) and not isinstance(x, bool),
    TEXT: lambda x: isinstance(x, str),
    FLAG: lambda x: isinstance(x, bool),
}
# measure.consistency.Certificate.to_dict (first: None where the check holds)
CERTIFICATE = {"check": TEXT, "target": TEXT, "holds": FLAG, "unit": TEXT, "max_abs": NUMBER, "compared": INT}
# measure.longcontext.LongContextRow.to_dict (cache_err: optional)
ROW = {"variant": TEXT, "kv_len": INT, "values": TEXT, "needle": TEXT, "rel_err": NUMBER, "rel_err_max": NUMBER,
       "cos_needle": NUMBER, "cos_needle_exact": NUMBER, "heads": INT, "seconds": NUMBER}  # fmt: skip
_LONGCTX = re.compile(r"^(longctx|captured)-(.+)-(\d+)$")


def check_unit(name: str, data: object, where: str) -> dict:
    """`data` (the JSON of unit `name`, read from `where`) when it has the fields its unit writes; ValueError
    naming `where` and the first field that is missing or of the wrong type otherwise."""
    _need(data, {}, where)
    if "seconds" in data:
        _need(data, {"seconds": NUMBER}, where)
    if (m := _LONGCTX.match(name)) and m[2] in VARIANTS:
        _longctx(data, where)
    elif name in {f"vllm54035-{kv}" for kv in ("fp8", "bf16")} | {f"fa1897-{n}" for n in SPLIT_TARGETS}:
        _certificate(data, where)
        if "launch" in data:
            launch = data["launch"]
            ok = isinstance(launch, list) and len(launch) == 2 and isinstance(launch[0], str)
            if not ok or not isinstance(launch[1], list) or not all(_KIND[INT](x) for x in launch[1]):
                raise ValueError(f"{where}: field 'launch' must be [a string, a list of integers]")
    elif name in {f"cert-{n}" for n in SDPA_TARGETS}:
        certs = data.get("certificates")
        if not isinstance(certs, list):
            raise ValueError(f"{where}: field 'certificates' must be a list")
        for i, c in enumerate(certs):
            _certificate(c, f"{where} certificates[{i}]")
    else:
        raise ValueError(f"{where}: {name!r} is not a unit the serving study writes; remove the file")
    return data


def _longctx(data: dict, where: str) -> None:
    if data.get("status") not in ("ok", "skipped"):
        raise ValueError(f"{where}: field 'status' must be 'ok' or 'skipped'")
    if data["status"] == "skipped":
        _need(data, {"reason": TEXT}, where)
        return
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: field 'rows' must be a list of the measured cells")
    for i, row in enumerate(rows):
        _need(row, ROW | ({"cache_err": NUMBER} if isinstance(row, dict) and "cache_err" in row else {}),
              f"{where} rows[{i}]")  # fmt: skip


def _certificate(data: object, where: str) -> None:
    _need(data, CERTIFICATE, where)
    first = data.get("first")
    if first is not None and not _KIND[INT](first):
        raise ValueError(f"{where}: field 'first' must be an integer or null")


def _need(data: object, fields: dict[str, str], where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got a JSON {type(data).__name__}")
    for key, kind in fields.items():
        if key not in data or not _KIND[kind](data[key]):
            raise ValueError(f"{where}: field {key!r} must be {kind}")
