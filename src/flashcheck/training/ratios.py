"""The paper's weight-deviation ratios from the seed groups of a train-study, with intervals and verdicts.

Per pair and seed, the deviation curve (Wasserstein-1 between the two runs' weights at every saved step) is
fitted in its growth phase only: from step 0 to the first saved step where it reaches GROWTH_END of its
largest value (past that it has saturated), at least 3 points. A ratio Flash / low-precision is formed per
seed (the runs of one seed share initialisation and batch order) and summarised by
`reporting.verdicts.ratio_interval`; verdicts come from `compare` (against 1) and `band` (the paper's
0.2-0.5) separately."""

from __future__ import annotations

import math
import statistics

from flashcheck.reporting.verdicts import Estimate, band, compare, ratio_interval
from flashcheck.training.drift import slope

GROWTH_END = 0.9  # a curve's growth phase ends where it first reaches this share of its largest value
PAPER_BAND = (0.2, 0.5)  # arXiv 2405.02803: Flash's weight deviation is 2-5x below FP16-vs-FP32's
LOWPREC = ("bf16", "fp16")


def growth_fit(steps: list[int], values: list[float]) -> dict:
    """Least-squares slope over the growth phase: points 0..e where e is the first index whose value reaches
    GROWTH_END x max (at least 3 points when there are). growing: False when the curve is largest at its
    first point (it falls from the start: a deviation set at initialisation, not a growth)."""
    finite = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return {"window": [steps[0], steps[-1]] if steps else [0, 0], "slope": math.nan, "points": 0, "growing": False}
    xs, ys = zip(*finite, strict=True)
    top = max(ys)
    end = next(i for i, y in enumerate(ys) if y >= GROWTH_END * top)
    end = min(len(ys) - 1, max(end, 2))
    growing = ys.index(top) > 0 and ys[end] > ys[0]
    return {
        "window": [xs[0], xs[end]],
        "slope": slope(list(xs[: end + 1]), list(ys[: end + 1])),
        "points": end + 1,
        "growing": growing,
    }


def _per_seed(pairs: dict, num: str, den: str, key) -> tuple[list[float], list[float], list[str]]:
    """Paired values (numerator pair, denominator pair) per seed, and notes on seeds a ratio cannot use."""
    a, b, notes = [], [], []
    for seed, ca in pairs[num]["seeds"].items():
        cb = pairs[den]["seeds"].get(seed)
        if cb is None:
            continue
        x, y = key(ca), key(cb)
        a.append(x)
        b.append(y)
        if not (x > 0 and y > 0):
            notes.append(f"seed {seed}: {num} {x:.3g}, {den} {y:.3g} (not both > 0, left out)")
    return a, b, notes


def _slope(c: dict) -> float:
    return c["fit"]["slope"]


def _final(metric: str):
    return lambda c: c[metric][-1]


def _mean_w1(c: dict) -> float:
    """The W1 curve's mean over the saved steps past 0 (its area over the run's length): the whole curve in one
    number, steadier than a slope over a window that each seed ends elsewhere."""
    ys = [y for s, y in zip(c["steps"], c["wasserstein"], strict=True) if s > 0]
    return sum(ys) / len(ys) if ys else math.nan


def ratios(pairs: dict) -> dict:
    """{name: Estimate dict + values + notes}: Flash over bf16 / fp16 (growth-phase W1 slopes, final W1, final
    max-abs, W1 curve's mean over training) and over the re-seeded pair (final W1 and max-abs, the curve's mean:
    a seed pair has no growth phase)."""
    plan = [(f"slope_flash_over_{f}", f"{f}_vs_fp32", _slope) for f in LOWPREC]
    plan += [(f"final_w1_flash_over_{f}", f"{f}_vs_fp32", _final("wasserstein")) for f in LOWPREC]
    plan += [(f"final_max_abs_flash_over_{f}", f"{f}_vs_fp32", _final("max_abs")) for f in LOWPREC]
    plan += [(f"mean_w1_flash_over_{f}", f"{f}_vs_fp32", _mean_w1) for f in LOWPREC]
    plan += [("mean_w1_flash_over_seed", "seed_vs_seed", _mean_w1)]
    plan += [("final_w1_flash_over_seed", "seed_vs_seed", _final("wasserstein"))]
    plan += [("final_max_abs_flash_over_seed", "seed_vs_seed", _final("max_abs"))]
    out = {}
    for name, den, key in plan:
        num_v, den_v, notes = _per_seed(pairs, "flash_vs_baseline", den, key)
        est = ratio_interval(num_v, den_v)
        out[name] = {**est.to_dict(), "numerator": num_v, "denominator": den_v, "notes": notes}
    return out


BY_STEP = {"flash_over_bf16": "bf16_vs_fp32", "flash_over_fp16": "fp16_vs_fp32", "flash_over_seed": "seed_vs_seed"}


def ratio_by_step(pairs: dict) -> dict:
    """{flash_over_bf16 / flash_over_fp16 / flash_over_seed: [{step, estimate}]}: the W1 ratio of the
    Flash-vs-Baseline curve over the other pair's at every saved step past 0 (the ratio of the curves over
    training), geometric mean over seeds with its interval."""
    out = {}
    for name, den in BY_STEP.items():
        if den not in pairs:
            continue
        fl, lp = pairs["flash_vs_baseline"]["seeds"], pairs[den]["seeds"]
        seeds = [s for s in fl if s in lp]
        steps = fl[seeds[0]]["steps"] if seeds else []
        rows = []
        for i, step in enumerate(steps):
            if step == 0:
                continue
            est = ratio_interval([fl[s]["wasserstein"][i] for s in seeds], [lp[s]["wasserstein"][i] for s in seeds])
            rows.append({"step": step, **est.to_dict()})
        out[name] = rows
    return out


MAX_SEEDS_NEEDED = 10_000  # beyond this a power statement says "more than"


def seeds_needed(num: list[float], den: list[float], edges: tuple[float, ...] = (1.0,)) -> dict:
    """A power statement for a paired ratio: {n, sd_log, mean, distance, seeds}: the smallest number of seeds whose
    95% t interval on the log ratios (ratio_interval's) would end on one side of every edge, were the mean and the
    standard deviation of the log ratios what these seeds measured: t(0.975, n - 1) * sd / sqrt(n) < distance,
    distance the log distance from the mean to the nearest edge. seeds None: too few values (under 2), or the
    mean lies on an edge or needs more than MAX_SEEDS_NEEDED."""
    from scipy import stats

    logs = [math.log(a / b) for a, b in zip(num, den, strict=True) if a and b and a > 0 and b > 0]
    logs = [x for x in logs if math.isfinite(x)]
    out = {"n": len(logs), "sd_log": math.nan, "mean": math.nan, "distance": math.nan, "seeds": None}
    if len(logs) < 2:
        return out
    m, sd = sum(logs) / len(logs), statistics.stdev(logs)
    d = min(abs(m - math.log(e)) for e in edges)
    out |= {"sd_log": sd, "mean": math.exp(m), "distance": d}
    if d == 0:
        return out
    if sd == 0:
        return out | {"seeds": 3}
    n = max(3, math.ceil((1.96 * sd / d) ** 2))  # the normal approximation, then the t interval's exact count
    while n <= MAX_SEEDS_NEEDED and stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) >= d:
        n += 1
    return out | {"seeds": n if n <= MAX_SEEDS_NEEDED else None}


def power_text(p: dict) -> str:
    """The power statement in words."""
    if p["n"] < 2:
        return f"{p['n']} usable seed(s): no spread to size a study from"
    need = f"about {p['seeds']} seeds" if p["seeds"] else f"more than {MAX_SEEDS_NEEDED} seeds"
    return (
        f"at the measured spread (sd of the log ratio {p['sd_log']:.2g} over {p['n']} seeds, geometric mean "
        f"{p['mean']:.3g}) an interval clear of the nearest edge ({p['distance']:.2g} away in log) needs {need}"
    )


def _estimate(d: dict) -> Estimate:
    return Estimate(d["value"], d["low"], d["high"], d["n"], d["method"])


def findings(r: dict) -> list[dict]:
    """Verdicts: Flash below each low-precision format (growth-phase slope ratio, and the ratio of the whole W1
    curves' means: interval vs 1), each inside the paper's band (interval vs 0.2-0.5), and below the re-seeded
    pair (final W1 ratio vs 1). Each finding carries a power statement (seeds_needed)."""
    out = []
    for f in LOWPREC:
        key = f"slope_flash_over_{f}"
        est = _estimate(r[key])
        measured = f"W1 growth-phase slope ratio Flash / {f} {est.text()}"
        v = compare(est, above=False)
        claim = f"Flash-vs-Baseline weight deviation grows slower than {f}-vs-fp32's"
        out.append(_finding(f"flash_below_{f}", claim, measured, v, "below (ratio < 1)", _power(r[key], (1.0,))))
        v = band(est, *PAPER_BAND)
        claim = f"The Flash / {f} slope ratio lies in the paper's 0.2-0.5"
        out.append(_finding(f"paper_band_{f}", claim, measured, v, "0.2-0.5 (vs fp16)", _power(r[key], PAPER_BAND)))
        key = f"mean_w1_flash_over_{f}"
        est = _estimate(r[key])
        claim = f"Flash-vs-Baseline's W1 curve lies below {f}-vs-fp32's over training"
        measured = f"ratio of the W1 curves' means over the saved steps Flash / {f} {est.text()}"
        v = compare(est, above=False)
        out.append(_finding(f"flash_curve_below_{f}", claim, measured, v, "below (2-5x)", _power(r[key], (1.0,))))
        claim = f"The ratio of the W1 curves Flash / {f} over training lies in the paper's 0.2-0.5"
        v, power = band(est, *PAPER_BAND), _power(r[key], PAPER_BAND)
        out.append(_finding(f"paper_band_curve_{f}", claim, measured, v, "0.2-0.5 (vs fp16)", power))
    est = _estimate(r["final_w1_flash_over_seed"])
    v = compare(est, above=False)
    claim = "Flash-vs-Baseline weight deviation at the last step is below that of a re-seeded run"
    measured = f"final W1 ratio Flash / re-seeded {est.text()}"
    power = _power(r["final_w1_flash_over_seed"], (1.0,))
    out.append(_finding("flash_below_seed", claim, measured, v, "comparable or below", power))
    return out


def _power(ratio: dict, edges: tuple[float, ...]) -> dict:
    return seeds_needed(ratio["numerator"], ratio["denominator"], edges)


def _finding(fid: str, claim: str, measured: str, verdict, paper: str, power: dict) -> dict:
    return {
        "id": fid,
        "claim": claim,
        "measured": measured,
        "status": verdict.status,
        "holds": verdict.holds,
        "verdict": verdict.to_dict(),
        "paper": paper,
        "power": {**power, "text": power_text(power)},
    }


def describe_slope(pname: str, fit: dict) -> str:
    """What a fitted slope means, in words (a falling curve is no growth rate)."""
    lo, hi = fit["window"]
    if not math.isfinite(fit["slope"]):
        return f"{pname}: too few finite points to fit"
    if fit["growing"] and fit["slope"] > 0:
        return f"{pname}: grows {fit['slope']:.3g} per step over steps {lo}-{hi} (growth phase)"
    return (
        f"{pname}: no growth phase — largest at step {lo} and {'falling' if fit['slope'] < 0 else 'flat'} "
        f"({fit['slope']:+.3g} per step over steps {lo}-{hi}); its deviation is set at the start (for the "
        "re-seeded pair: a different initialisation that training partly forgets), so no slope ratio is formed"
    )


def _where(c: dict) -> str:
    m = c["model"]
    return (
        f"{m['layers']} layers x {m['dim']} wide, {c['steps']} steps, learning rate {c['lr']:g}, attention policy "
        f"{c['attention_policy']}, {c['seeds']} seed(s)"
    )


def conclusion(summary: dict) -> list[str]:
    """Plain sentences from the measured ratios: is Flash-vs-Baseline drift below low-precision drift here?"""
    c = summary["conditions"]
    if not summary["verdicts"]:
        return [f"Smoke test at {_where(c)}: no verdicts (a smoke test checks that the pipeline runs)."]
    out = []
    by_id = {f["id"]: f for f in summary["findings"]}
    for f in LOWPREC:
        r = summary["ratios"][f"slope_flash_over_{f}"]
        below, paper = by_id[f"flash_below_{f}"]["status"], by_id[f"paper_band_{f}"]["status"]
        est = _estimate(r)
        answer = {
            "holds": "grows slower than",
            "does not hold": "does not grow slower than",
            "inconclusive": "cannot be told apart (at this n) from",
        }[below]
        out.append(
            f"Flash-vs-Baseline weight drift {answer} {f}-vs-fp32 drift: growth-phase slope ratio {est.text()}; "
            f"the paper's 0.2-0.5 band: {paper}."
        )
    r = summary["ratios"]
    levels = ", ".join(
        f"{what} Flash / {f} {_estimate(r[f'final_{key}_flash_over_{f}']).text()}"
        for key, what in (("w1", "W1"), ("max_abs", "max-abs"))
        for f in LOWPREC
    )
    out.append(f"At the last step (levels, not growth): {levels}.")
    curves = ", ".join(f"Flash / {f} {_estimate(r[f'mean_w1_flash_over_{f}']).text()}" for f in (*LOWPREC, "seed"))
    out.append(f"Over the whole run (the W1 curves' means over the saved steps): {curves}.")
    seed = _estimate(r["final_w1_flash_over_seed"])
    word = {"holds": "below it", "does not hold": "not below it", "inconclusive": "not distinguishable from it"}
    out.append(
        f"At the last step Flash-vs-Baseline W1 drift is {seed.text()} x that of a re-seeded run: "
        f"{word[by_id['flash_below_seed']['status']]}."
    )
    out.append(f"Conditions: {_where(c)}; other conditions can give other answers (see the ratio-by-step figure).")
    return out
