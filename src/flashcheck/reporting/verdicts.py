"""Verdicts a statistician would sign: an estimate with n and a 95% interval, and a stated rule that turns it
into `holds`, `does not hold` or `inconclusive` (or `structural`: fixed by the algorithm, not measured).

Every report (study, train-study, guide) uses these rules, never end points or hand-picked bands:
- comparison: a ratio's interval (t interval on log ratios) against 1 (or another threshold);
- band: an interval against a published band (e.g. the paper's 0.2-0.5);
- share: an exact binomial (Clopper-Pearson) interval of a share of cases against a target;
- trend: Kendall's tau over all points plus a Theil-Sen slope interval, both on log-log axes.
scipy is imported inside the functions (study reports install it with the `plots` extra).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

LEVEL = 0.95
MIN_N = 3  # below this, every rule answers "inconclusive"
STATUSES = ("holds", "does not hold", "inconclusive", "structural")


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its 95% interval over n independent values (low = high = value when n == 1)."""

    value: float
    low: float
    high: float
    n: int
    method: str

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self, fmt: str = ".3g") -> str:
        if self.n < 2 or not math.isfinite(self.low):
            return f"{self.value:{fmt}} (n={self.n}, no interval)"
        return f"{self.value:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}] (n={self.n})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """status: one of STATUSES; rule: the rule in words; estimate: what it was applied to; reason: why."""

    status: str
    rule: str
    reason: str
    estimate: Estimate | None = None

    def to_dict(self) -> dict:
        out = {"status": self.status, "rule": self.rule, "reason": self.reason}
        if self.estimate is not None:
            out |= {"estimate": self.estimate.to_dict(), "n": self.estimate.n}
        return out

    @property
    def holds(self) -> bool | None:
        """True / False / None (inconclusive); structural findings hold by construction."""
        return {"holds": True, "does not hold": False, "structural": True}.get(self.status)


def _finite(xs: Sequence[float]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def mean_interval(xs: Sequence[float]) -> Estimate:
    """Mean and Student-t 95% interval of independent values (e.g. one per seed)."""
    from scipy import stats

    v = _finite(xs)
    n = len(v)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "mean, t interval")
    mean = sum(v) / n
    if not math.isfinite(mean):  # finite values near the largest float: their sum overflowed, their mean does not
        mean = math.fsum(x / n for x in v)
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n, "mean, t interval")
    try:
        sd = statistics.stdev(v)  # exact for identical values, where scipy's tstd warns of precision loss
    except OverflowError:  # values near the largest float: the spread is no number
        return Estimate(mean, math.nan, math.nan, n, "mean, t interval")
    half = stats.t.ppf(0.5 + LEVEL / 2, n - 1) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, "mean, t interval")


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> Estimate:
    """Geometric-mean ratio num/den of paired positive values (same seed, same inputs) with a t interval on
    the log ratios; pairs with a non-positive or non-finite side are dropped."""
    pairs = [(a, b) for a, b in zip(num, den, strict=True) if a is not None and b is not None]
    # the difference of logs, not the log of a / b: a tiny over a huge value underflows to 0 (log: a domain error)
    logs = [math.log(a) - math.log(b) for a, b in pairs if 0 < a < math.inf and 0 < b < math.inf]
    e = mean_interval(logs)
    if e.n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "geometric mean of paired ratios, t interval")
    low, high = (exp_or_inf(e.low), exp_or_inf(e.high)) if e.n >= 2 else (math.nan, math.nan)
    return Estimate(exp_or_inf(e.value), low, high, e.n, "geometric mean of paired ratios, t interval on logs")


def exp_or_inf(x: float) -> float:
    """math.exp that gives inf past the largest float instead of OverflowError (the mean of logs of huge values)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def share_interval(successes: int, n: int) -> Estimate:
    """A share successes/n of independent cases with its exact (Clopper-Pearson) 95% binomial interval:
    19 of 19 gives [0.824, 1], never the degenerate [1, 1] a t interval on 0/1 values gives."""
    from scipy import stats

    if n <= 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "share, Clopper-Pearson interval")
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes!r} must lie in [0, n={n}]")
    a = (1 - LEVEL) / 2
    low = float(stats.beta.ppf(a, successes, n - successes + 1)) if successes > 0 else 0.0
    high = float(stats.beta.ppf(1 - a, successes + 1, n - successes)) if successes < n else 1.0
    return Estimate(successes / n, low, high, n, "share, Clopper-Pearson interval")


def median_interval(xs: Sequence[float]) -> Estimate:
    """Median with a distribution-free interval: the order statistics x_(j) and x_(n+1-j) with the largest j
    whose coverage 1 - 2 P(Binomial(n, 1/2) < j) is still >= 95% ([min, max] below n = 6, which covers less:
    the method names the coverage). For timings, whose noise is skewed and heavy-tailed."""
    from scipy import stats

    v = sorted(_finite(xs))
    n = len(v)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "median")
    med = float(statistics.median(v))
    if n < 2:
        return Estimate(med, math.nan, math.nan, n, "median")
    j = 1
    while j < n // 2 and 1 - 2 * stats.binom.cdf(j, n, 0.5) >= LEVEL:
        j += 1
    cover = 1 - 2 * stats.binom.cdf(j - 1, n, 0.5)
    return Estimate(med, v[j - 1], v[n - j], n, f"median, order-statistic interval ({cover:.1%})")


def _too_few(rule: str, est: Estimate | None, n: int) -> Verdict | None:
    if n < MIN_N:
        return Verdict("inconclusive", rule, f"n={n} < {MIN_N} independent values", est)
    return None


def compare(est: Estimate, *, above: bool = True, threshold: float = 1.0, margin: float = 0.0) -> Verdict:
    """Claim "value > threshold" (above) or "< threshold": holds when the interval excludes the threshold on
    the claimed side, does not hold when it excludes it on the other side or lies inside the equivalence
    margin threshold*(1 +- margin), else inconclusive."""
    side = ">" if above else "<"
    rule = f"95% interval of the {est.method} entirely {side} {threshold:g}"
    if margin:
        rule += f"; inside {threshold:g} x (1 +- {margin:g}) counts as no effect"
    bad = _too_few(rule, est, est.n)
    if bad:
        return bad
    lo, hi = est.low, est.high
    claimed = lo > threshold if above else hi < threshold
    opposite = hi < threshold if above else lo > threshold
    equal = margin > 0 and threshold * (1 - margin) <= lo and hi <= threshold * (1 + margin)
    if claimed:
        return Verdict("holds", rule, f"interval [{lo:.3g}, {hi:.3g}] is {side} {threshold:g}", est)
    if opposite or equal:
        why = "on the other side of" if opposite else "within the no-effect margin of"
        return Verdict("does not hold", rule, f"interval [{lo:.3g}, {hi:.3g}] is {why} {threshold:g}", est)
    return Verdict("inconclusive", rule, f"interval [{lo:.3g}, {hi:.3g}] contains {threshold:g}", est)


EQUIVALENCE_MARGIN = 0.10  # "no measurable difference": the whole 95% interval of a ratio within 1 +- 10%, the
# margin the modern study's FA4-vs-FA2 verdict allows (study.modern); a wider interval that holds 1 settles nothing


def difference_words(est: Estimate | None, margin: float = EQUIVALENCE_MARGIN) -> str:
    """A ratio's interval in words: 'no measurable difference (within 10% either way)' only where the whole
    interval lies within 1 +- margin; 'inconclusive: between 3% less and 57% more' where it holds 1 but is wider;
    '57% more' / '30% less' where it excludes 1; 'too few values to say' without an interval."""
    if est is None or est.n < 2 or not (math.isfinite(est.low) and math.isfinite(est.high)):
        return "too few values to say"
    lo, hi = est.low, est.high
    if lo > 1:
        return f"{est.value - 1:.0%} more"
    if hi < 1:
        return f"{1 - est.value:.0%} less"
    if 1 - margin <= lo and hi <= 1 + margin:
        return f"no measurable difference (within {margin:.0%} either way)"
    return f"inconclusive: between {1 - lo:.0%} less and {hi - 1:.0%} more"


def band(est: Estimate, low: float, high: float) -> Verdict:
    """Claim "the value lies in [low, high]" (a published band): holds when the interval lies inside it,
    does not hold when the interval misses it entirely, else inconclusive."""
    rule = f"95% interval of the {est.method} inside [{low:g}, {high:g}]"
    bad = _too_few(rule, est, est.n)
    if bad:
        return bad
    iv, bnd = f"interval [{est.low:.3g}, {est.high:.3g}]", f"the band [{low:g}, {high:g}]"
    if low <= est.low and est.high <= high:
        return Verdict("holds", rule, f"{iv} is inside {bnd}", est)
    if est.high < low or est.low > high:
        side = "below" if est.high < low else "above"
        return Verdict("does not hold", rule, f"{iv} misses {bnd}: it lies {side} it", est)
    return Verdict("inconclusive", rule, f"{iv} overlaps an edge of {bnd}", est)


def trend(xs: Sequence[float], ys: Sequence[float], *, increasing: bool = True, log: bool = True) -> Verdict:
    """Claim "y grows (or falls) with x" over every point (all seeds): Kendall's tau (p < 0.05) and a Theil-Sen
    slope whose 95% interval excludes 0 on the claimed side; on log-log axes the slope is an exponent."""
    from scipy import stats

    pts = [
        (float(x), float(y)) for x, y in zip(xs, ys, strict=True) if math.isfinite(float(x)) and math.isfinite(float(y))
    ]
    if log:
        pts = [(math.log(x), math.log(y)) for x, y in pts if x > 0 and y > 0]
    word = "grows" if increasing else "falls"
    axes = "log y vs log x" if log else "y vs x"
    rule = f"{word}: Kendall tau p < 0.05 and Theil-Sen slope ({axes}) 95% interval excluding 0"
    distinct = len({x for x, _ in pts})
    if len(pts) < MIN_N or distinct < 2:
        return Verdict("inconclusive", rule, f"n={len(pts)} points at {distinct} x values: too few")
    x, y = zip(*pts, strict=True)
    tau = stats.kendalltau(x, y)
    slope, _, lo, hi = stats.theilslopes(y, x, alpha=LEVEL)
    est = Estimate(float(slope), float(lo), float(hi), len(pts), f"Theil-Sen slope ({axes})")
    why = f"tau={tau.statistic:+.2f} (p={tau.pvalue:.2g}), slope {est.text()}"
    sig = bool(tau.pvalue < 0.05)  # a numpy bool is never `is False`
    up, down = sig and tau.statistic > 0 and lo > 0, sig and tau.statistic < 0 and hi < 0
    if (up and increasing) or (down and not increasing):
        return Verdict("holds", rule, why, est)
    if up or down or (sig is False and lo <= 0 <= hi and hi - lo < 0.05):
        return Verdict("does not hold", rule, why, est)
    return Verdict("inconclusive", rule, why, est)


def every(outcomes: Sequence[bool], claim: str) -> Verdict:
    """Claim "every case shows `claim`" (a deterministic outcome, e.g. zeros on a row with no visible key): one
    counterexample settles it (does not hold); holds when all of n >= 3 cases show it; else inconclusive."""
    rule = f"all of n >= {MIN_N} cases: {claim}"
    n, bad = len(outcomes), sum(1 for o in outcomes if not o)
    est = Estimate(float(n - bad), math.nan, math.nan, n, "cases showing it")
    if bad:
        return Verdict("does not hold", rule, f"{bad} of {n} cases do not", est)
    return _too_few(rule, est, n) or Verdict("holds", rule, f"all {n} cases do", est)


def structural(reason: str, test: str) -> Verdict:
    """An outcome fixed by the algorithm itself (not a measurement): the reason and the test that checks it."""
    return Verdict("structural", f"fixed by the algorithm; checked by {test}", reason)
