"""reporting.verdicts: each rule on synthetic data whose answer is known."""

from __future__ import annotations

import math
import random

from scipy import stats

from flashcheck.reporting.verdicts import (
    band,
    compare,
    every,
    mean_interval,
    ratio_interval,
    share_interval,
    structural,
    trend,
)


def test_mean_interval_is_the_t_interval():
    xs = [1.0, 2.0, 4.0, 3.5]
    e = mean_interval(xs)
    lo, hi = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 4, scale=stats.sem(xs))
    assert math.isclose(e.low, lo) and math.isclose(e.high, hi) and e.n == 4
    assert math.isnan(mean_interval([2.0]).low) and "no interval" in mean_interval([2.0]).text()


def test_ratio_of_paired_values_with_a_clear_effect_holds():
    rng = random.Random(0)
    den = [rng.uniform(1, 2) for _ in range(5)]
    num = [3 * d * rng.uniform(0.95, 1.05) for d in den]
    v = compare(ratio_interval(num, den))
    assert v.status == "holds" and 2.8 < v.estimate.value < 3.2 and v.to_dict()["n"] == 5


def test_no_effect_with_noise_is_inconclusive_and_a_tight_no_effect_does_not_hold():
    rng = random.Random(1)
    den = [1.0] * 5
    noisy = [rng.uniform(0.5, 1.5) for _ in range(5)]
    assert compare(ratio_interval(noisy, den)).status == "inconclusive"
    tight = [1 + rng.uniform(-0.01, 0.01) for _ in range(5)]
    assert compare(ratio_interval(tight, den), margin=0.05).status == "does not hold"
    assert compare(ratio_interval([0.5, 0.52, 0.49], [1, 1, 1])).status == "does not hold"


def test_two_seeds_are_never_enough():
    v = compare(ratio_interval([10, 11], [1, 1]))
    assert v.status == "inconclusive" and "n=2" in v.reason


def test_band():
    assert band(ratio_interval([0.3, 0.32, 0.31], [1, 1, 1]), 0.2, 0.5).status == "holds"
    assert band(ratio_interval([0.9, 0.92, 0.88], [1, 1, 1]), 0.2, 0.5).status == "does not hold"
    assert band(ratio_interval([0.3, 0.7, 0.45], [1, 1, 1]), 0.2, 0.5).status == "inconclusive"


def test_trend_clear_flat_and_reversed():
    rng = random.Random(2)
    xs = [512, 1024, 2048, 4096, 8192] * 3
    growing = [x**0.5 * rng.uniform(0.9, 1.1) for x in xs]
    assert trend(xs, growing).status == "holds"
    assert trend(xs, growing, increasing=False).status == "does not hold"
    flat = [rng.uniform(0.5, 1.5) for _ in xs]
    assert trend(xs, flat).status in ("inconclusive", "does not hold")
    assert trend(xs[:2], growing[:2]).status == "inconclusive"
    assert trend([4, 4, 4], [1, 2, 3]).status == "inconclusive"


def test_structural_says_why_and_how_it_is_checked():
    v = structural("rows are independent: Br changes no row's arithmetic", "tests/test_kernels.py::test_br")
    assert v.status == "structural" and v.holds is True and "test_kernels" in v.rule


def test_median_interval_order_statistics_match_the_binomial_table():
    """n = 20: the 95% interval of the median is x_(6), x_(15) (coverage 95.9%, the textbook table); n = 7:
    [min, max] (98.4%); below 6 values [min, max] covers less than 95% and the method says how much."""
    from flashcheck.reporting.verdicts import median_interval

    e = median_interval(list(range(20)))
    assert (e.value, e.low, e.high, e.n) == (9.5, 5, 14, 20) and "95.9%" in e.method
    e7 = median_interval([7, 1, 6, 2, 5, 3, 4])
    assert (e7.value, e7.low, e7.high) == (4, 1, 7) and "98.4%" in e7.method
    assert "93.8%" in median_interval([1, 2, 3, 4, 5]).method
    assert median_interval([2.0]).n == 1 and median_interval([]).n == 0


def test_median_interval_covers_the_true_median_as_stated():
    """Exponential samples (skewed, like timings) of n = 15: the interval holds the true median ln 2 in
    about its stated coverage of 2000 draws (binomial sampling error ~0.5%)."""
    from flashcheck.reporting.verdicts import median_interval

    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        e = median_interval([rng.expovariate(1.0) for _ in range(15)])
        hits += e.low <= math.log(2) <= e.high
    stated = float(median_interval(list(range(15))).method.split("(")[1].rstrip("%)")) / 100
    assert stated >= 0.95 and abs(hits / 2000 - stated) < 0.02


def test_every_needs_three_cases_and_falls_to_one_counterexample():
    assert every([True, True, True], "zeros").status == "holds"
    assert every([True, True], "zeros").status == "inconclusive"
    v = every([True, False], "zeros")
    assert v.status == "does not hold" and "1 of 2" in v.reason
    assert every([], "zeros").status == "inconclusive"


def test_trend_on_flat_data_with_a_narrow_slope_interval_does_not_hold():
    """1% noise around a constant at 4 lengths x 3 seeds: tau not significant and the exponent's interval
    inside +-0.025 around 0, so "grows" does not hold (scipy's p-value comparison is a numpy bool)."""
    rng = random.Random(0)
    xs = [2**k for k in range(9, 13) for _ in range(3)]
    v = trend(xs, [1e-3 * (1 + 0.01 * rng.gauss(0, 1)) for _ in xs])
    assert v.status == "does not hold" and v.estimate.high - v.estimate.low < 0.05


def test_identical_values_give_a_zero_width_interval_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = ratio_interval([1.1, 1.1, 1.1], [1.0, 1.0, 1.0])
    assert math.isclose(e.low, 1.1) and math.isclose(e.high, 1.1) and e.n == 3


def test_share_interval_is_the_exact_binomial_interval():
    """Clopper-Pearson against closed forms (k = n: low = 0.025^(1/n); k = 0: high = 1 - 0.025^(1/n)) and, in
    between, against binomial tail sums: P(X >= k | low) = P(X <= k | high) = 2.5%. 19 of 19 is not > 0.9."""
    e = share_interval(19, 19)
    assert e.value == 1 and e.high == 1 and math.isclose(e.low, 0.025 ** (1 / 19)) and 0.82 < e.low < 0.83
    v = compare(e, threshold=0.9)
    assert v.status == "inconclusive" and "contains 0.9" in v.reason
    assert compare(share_interval(60, 60), threshold=0.9).status == "holds"  # 0.025^(1/60) = 0.94
    z = share_interval(0, 7)
    assert z.low == 0 and math.isclose(z.high, 1 - 0.025 ** (1 / 7))

    def tail(k: int, n: int, p: float, upper: bool) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in (range(k, n + 1) if upper else range(k + 1)))

    m = share_interval(13, 20)
    assert m.low < 0.65 < m.high and m.n == 20
    assert math.isclose(tail(13, 20, m.low, True), 0.025, rel_tol=1e-6)
    assert math.isclose(tail(13, 20, m.high, False), 0.025, rel_tol=1e-6)
