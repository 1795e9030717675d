"""Shrink a numeric finding towards its onset: the smallest logits at which it still holds, so that a precision bug is
reported where it starts (a backward whose error passes the budget at |logit| ~ 1e4), not where it ends in NaN.

The logits scale with the case's `scale` (linearly; an explicit scale only: scale=None stays the default, which a
finding may need) and with its `magnitude` (quadratically): each is lowered in turn by a factor of 4 until the finding
no longer holds, then bisected (in log space) between the last case that holds and the first that does not, to
within a factor of 4 ** (1 / 2 ** STEPS). A budget finding holds on a smaller case while its error keeps at least
half the found case's excess over the budget (hunt.search._least_margin): an error that hovers at 1.01x the budget
over a range of logits is no onset. Values are rounded to 4 significant digits, so that the case's text form
(6 digits) reads back the very case that was judged."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from flashcheck.hunt.case import HuntCase

STEPS = 5  # bisection steps after the factor-of-4 descent: within 4 ** (1/32) ~ 4.4 % of the onset
FLOOR = 1e-4  # the smallest multiplier tried; and never below the plain value (1): a finding that holds there has
# no onset to find
ONSET_KINDS = ("nan", "inf", "budget", "overflow")


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _lowered(case: HuntCase, name: str, factor: float) -> HuntCase | None:
    value = _round(getattr(case, name) * factor)
    if not value > 0:
        return None
    try:
        return dataclasses.replace(case, **{name: value})
    except ValueError:  # a magnitude the dtype cannot hold (never when lowering) or a rounding to 0
        return None


def shrink_onset(case: HuntCase, holds: Callable[[HuntCase], object | None]) -> tuple[HuntCase, object | None]:
    """(the case with the smallest scale and magnitude at which holds(case) still returns something, that
    something). `holds(c)`: the evidence (an Outcome) that the finding still holds on c, or None."""
    last = None
    for name in ("scale", "magnitude"):
        if getattr(case, name) is None or getattr(case, name) <= 1:  # the plain value, or below it: no onset above
            continue
        case, found = _descend(case, name, holds)
        last = found if found is not None else last
    return case, last


def _descend(case: HuntCase, name: str, holds) -> tuple[HuntCase, object | None]:
    good, evidence, factor = case, None, 1.0
    bad_factor, floor = None, max(FLOOR, 1.0 / getattr(case, name))  # never below the plain value 1
    while factor > floor * 1.0001:
        lower = max(factor / 4, floor)
        trial = _lowered(case, name, lower)
        found = None if trial is None else holds(trial)
        if found is None:
            bad_factor = lower
            break
        factor, good, evidence = lower, trial, found
    if bad_factor is None:
        return good, evidence
    lo, hi = math.log(bad_factor), math.log(factor)  # holds at exp(hi), not at exp(lo)
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        trial = _lowered(case, name, math.exp(mid))
        found = None if trial is None else holds(trial)
        if found is None:
            lo = mid
        else:
            hi, good, evidence = mid, trial, found
    return good, evidence
