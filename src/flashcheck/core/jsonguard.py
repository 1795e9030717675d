"""JSON from files the tool did not write: bracket nesting bounded before the recursive parser sees it (a hostile
file nested 500,000 levels deep makes json.loads raise RecursionError, a traceback instead of a clear line)."""

from __future__ import annotations

import json
import struct
from typing import BinaryIO

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
