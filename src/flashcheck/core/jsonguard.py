"""JSON from files the tool did not write, or wrote and reads back: bracket nesting bounded before the recursive
parser sees it (a hostile file nested 500,000 levels deep makes json.loads raise RecursionError, a traceback
instead of a clear line). loads_bounded / read_json are the one reader of every JSON file and line the tool reads:
study.json, records and runs lines, a run's config.json / complete.json / losses.json, a model's config.json,
modules.json and sentence_bert_config.json; read_safetensors_header for safetensors headers."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO

from flashcheck.core.fileio import open_plain

MAX_HEADER = 100_000_000  # bytes of a safetensors JSON header (the safetensors library's own limit)

MAX_NESTING = 16  # bracket levels; a header nests 3 ({name: {"shape": [...]}}), an index 2
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_QUOTE, _OPEN, _CLOSE = ord('"'), (ord("["), ord("{")), (ord("]"), ord("}"))
_CHUNK = 1 << 22


def nesting_problem(raw: bytes, limit: int = MAX_NESTING) -> str | None:
    """Why JSON text `raw` must not reach the recursive parser (brackets nested deeper than `limit` outside
    strings: json would raise RecursionError), else None. Exact for the text up to where a parser would
    stop; linear time in numpy chunks (a hostile 100 MB header: a few seconds)."""
    import numpy as np

    # escapes first (an escaped backslash, then an escaped quote), then only quotes and brackets are kept
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    codes = np.frombuffer(text, dtype=np.uint8)
    depth, inside = 0, 0
    for start in range(0, len(codes), _CHUNK):
        c = codes[start : start + _CHUNK]
        in_string = (np.cumsum(c == _QUOTE, dtype=np.int32) + inside) % 2 == 1
        step = (c == _OPEN[0]) | (c == _OPEN[1])
        step = step.astype(np.int32) - ((c == _CLOSE[0]) | (c == _CLOSE[1]))
        step[in_string] = 0
        levels = np.cumsum(step, dtype=np.int64) + depth
        if levels.max() > limit:
            return f"nests brackets more than {limit} levels deep (a safetensors header nests 3)"
        depth, inside = int(levels[-1]), int(in_string[-1])
    return None


def read_safetensors_header(f: BinaryIO, size: int) -> tuple[object, int]:
    """The parsed JSON header of a safetensors file of `size` bytes open at its start, and the header's length n
    (the data follow at 8 + n). ValueError naming the problem: too short, a length past the file or MAX_HEADER,
    brackets nested too deep (checked before json sees them), not JSON."""
    head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER or 8 + n > size:
        raise ValueError(f"header length {n} does not fit the file of {size} bytes (truncated file?)")
    raw = f.read(n)
    if problem := nesting_problem(raw):
        raise ValueError(f"the header {problem}")
    try:
        return json.loads(raw), n
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the header is not JSON ({exc})") from None


MAX_FILE_NESTING = 64  # bracket levels of a JSON file the tool reads back (its own files nest under 10)
MAX_JSON_FILE = 256 * 2**20  # bytes: a larger study.json, losses.json or model config is not one the tool wrote


def loads_bounded(raw: bytes | str, where: str, limit: int = MAX_FILE_NESTING, *, constants: bool = False) -> object:
    """json.loads for text the tool did not necessarily write: ValueError naming `where` (a file, a line) when
    brackets nest deeper than `limit` (checked before the recursive parser sees them) or it is not JSON.
    NaN and Infinity literals (not JSON) are refused unless `constants` (records, whose metrics may be NaN)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if problem := nesting_problem(data, limit):
        raise ValueError(f"{where} {problem.split(' (')[0]}")

    def no_constant(name: str) -> object:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(data) if constants else json.loads(data, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{where} is not JSON ({str(exc).splitlines()[0][:120]})") from None


def read_json(path: str | Path, what: str = "JSON file", *, follow: bool = True, constants: bool = False) -> object:
    """The JSON value in file `path` through loads_bounded: ValueError of one line naming the file (unreadable,
    larger than MAX_JSON_FILE, nested too deep, not JSON). follow=False: the tool's own file, never read
    through a symbolic link (fileio.LinkRefused); `constants`: NaN and Infinity allowed (measurements)."""
    path = Path(path)
    try:
        fd = open_plain(path, os.O_RDONLY, what=what) if not follow else os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{str(path)!r} ({what}) is not a regular file")
            if st.st_size > MAX_JSON_FILE:
                raise ValueError(f"{str(path)!r} ({what}) holds {st.st_size} bytes, more than a {what} can")
            raw = f.read(MAX_JSON_FILE + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r} ({what}): {exc.strerror or exc}") from None
    return loads_bounded(raw, f"{str(path)!r} ({what})", constants=constants)
