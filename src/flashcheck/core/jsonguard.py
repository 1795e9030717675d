"""JSON from files the tool did not write: bracket nesting bounded before the recursive parser sees it (a hostile
file nested 500,000 levels deep makes json.loads raise RecursionError, a traceback instead of a clear line)."""

from __future__ import annotations

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
