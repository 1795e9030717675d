"""Text read from files the tool did not necessarily write (a record's error, its environment, a task's failure),
made safe to print: control characters (ANSI escapes, a bell, a carriage return that overwrites a line) and the
Unicode controls that reorder or hide text are shown as escapes (ESC as \\x1b), never sent raw to a terminal or
into a report. Newlines and tabs stay (an error's traceback lines)."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls; the bidirectional overrides and isolates; zero-width joiners
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: str) -> str:
    """`text` with every control character written as its escape (\\x1b, \\u202e): what a terminal shows as is."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)
