"""How busy the machine was while something was timed: the 1-minute load average read before and after a
timing, the core count and this process's own busy threads, and the rule that calls a timing "busy".

Busy: the larger of the two 1-minute load averages, less this process's own threads (they are part of the
load), above BUSY_FRACTION x the cores; other processes then compete for the cores the timing used and its
times say more about them than about the kernels. The 1-minute average lags: read after a timing shorter than
a minute it covers that timing and what ran just before; a longer timing is covered by both readings only at
its ends. Where the platform has no load average (Windows), a timing is never called busy.
"""

from __future__ import annotations

import os

BUSY_FRACTION = 0.75


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 3)
    except (AttributeError, OSError):
        return None


def load_record(before: float | None, own_threads: int) -> dict:
    """What to store beside a timing: {"load1_before", "load1_after", "cpus", "own_threads"}; `before` is
    load_average() read before the timing began."""
    return {
        "load1_before": before,
        "load1_after": load_average(),
        "cpus": os.cpu_count() or 1,
        "own_threads": own_threads,
    }


def busy(load: dict | None) -> str | None:
    """Why a timing's machine was busy (one phrase), None when it was not or nothing was recorded."""
    if not load:
        return None
    seen = [x for x in (load.get("load1_before"), load.get("load1_after")) if x is not None]
    if not seen:
        return None
    cpus, own = int(load.get("cpus") or 1), int(load.get("own_threads") or 0)
    others = max(seen) - own
    if others > BUSY_FRACTION * cpus:
        return f"load average {max(seen):.2f} on {cpus} core(s), {others:.2f} beyond this process's {own} thread(s)"
    return None
