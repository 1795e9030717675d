"""The production guide's claims, each turned into a verdict (reporting.verdicts) from a guide folder's stored
measurements: cost exponents, speed, latency spread, fp16 overflow, the error range and its slope, and the
claims that need a GPU. Computes nothing but statistics over the records."""

from __future__ import annotations

import math
from collections.abc import Iterable

from flashcheck.core.load import BUSY_FRACTION, busy
from flashcheck.questions.guide.measure import OCTAVE_STEPS, twin
from flashcheck.questions.guide.presets import GuideSettings
from flashcheck.reporting.verdicts import (
    Estimate,
    Verdict,
    band,
    compare,
    mean_interval,
    median_interval,
    ratio_interval,
    structural,
    trend,
)

GPU_COMMAND = "flashcheck study --preset guide --out guide-gpu   # on a machine with a CUDA GPU and flash-attn"
# The nearest integer exponent: an exponent is "2" when nearer to 2 than to 1 or 3.
EXPONENT_BANDS = {1: (0.5, 1.5), 2: (1.5, 2.5)}
SQRT_HALF = math.sqrt(0.5)
SPEEDUP_FROM = 512  # the guide's "use Flash beyond 512 tokens"


def claim(text: str, verdict: Verdict, measured: str, conditions: str, cid: str) -> dict:
    """One row of the claims table (and of summary.json's findings): README's keys (id, claim, measured, status,
    holds, rule, interval [low, high] or None, n or None) with the full verdict and the conditions beside them."""
    est = verdict.estimate
    interval = [est.low, est.high] if est is not None and est.n >= 2 and math.isfinite(est.low) else None
    return {
        "id": cid,
        "claim": text,
        "measured": measured,
        "status": verdict.status,
        "holds": verdict.holds if verdict.status != "inconclusive" else None,
        "rule": verdict.rule,
        "interval": interval,
        "n": est.n if est is not None else None,
        "verdict": verdict.to_dict(),
        "conditions": conditions,
    }


def cost_series(results: dict[str, dict], method: str, backward: bool, what: str) -> tuple[list[int], list[float]]:
    """(lengths, values) over every repeat of the ok cost tasks: what = "time" (seconds) or "memory" (bytes)."""
    xs, ys = [], []
    for r in results.values():
        pr = r["params"]
        if r["status"] != "ok" or pr["kind"] != "cost" or pr["method"] != method or pr["backward"] != backward:
            continue
        vals = r["result"]["times"] if what == "time" else [r["result"]["peak_bytes"]]
        xs += [pr["seq_len"]] * len(vals)
        ys += vals
    return xs, ys


def exponent(results: dict[str, dict], method: str, backward: bool, what: str) -> Verdict:
    """Kendall + Theil-Sen on log value vs log L over every repeat (verdicts.trend); its estimate is the
    exponent with its interval."""
    xs, ys = cost_series(results, method, backward, what)
    return trend(xs, ys, increasing=True)


def _exponent_claim(results, method: str, backward: bool, what: str, power: int, text: str, cid: str) -> dict:
    t = exponent(results, method, backward, what)
    p = "forward+backward" if backward else "forward"
    lengths = sorted(set(cost_series(results, method, backward, what)[0]))
    cond = f"{method}, {p}, L = {', '.join(map(str, lengths))}, CPU"
    if t.estimate is None:
        return claim(text, t, "too few lengths measured", cond, cid)
    if what == "time" and lengths[-1] < SPEEDUP_FROM:  # a smoke preset's short lengths: per-call costs dominate
        why = f"not measured: this preset's lengths stop at {lengths[-1]} (< {SPEEDUP_FROM}: per-call costs hide n^2)"
        v = Verdict("inconclusive", f"measured up to L >= {SPEEDUP_FROM} only", why, t.estimate)
        return claim(text, v, f"exponent {t.estimate.text()}; {why}", cond, cid)
    v = band(t.estimate, *EXPONENT_BANDS[power])
    v = Verdict(v.status, f"{v.rule} (nearest integer exponent {power})", f"{v.reason}; {t.reason}", t.estimate)
    if what == "time":
        v = unless_busy(v, _tasks(results, "cost", lambda p: p["method"] == method and p["backward"] == backward))
    return claim(text, v, f"exponent {t.estimate.text()}", cond, cid)


def _tasks(results: dict[str, dict], kind: str, pick=lambda p: True) -> list[dict]:
    """The ok tasks of one kind whose parameters `pick` accepts."""
    return [r for r in results.values() if r["status"] == "ok" and r["params"]["kind"] == kind and pick(r["params"])]


def unless_busy(v: Verdict, timed: list[dict]) -> Verdict:
    """A timing verdict, made inconclusive when any of the timings it rests on ran on a busy machine (the load
    recorded beside each timing, core.load.busy), its reason saying so first; an inconclusive one too (its own
    reason after it: an interval across a band edge measured under load is the load's doing as likely)."""
    why = [(r["id"], b) for r in timed if (b := busy(r.get("load")))]
    if not why:
        return v
    rule = f"{v.rule}; inconclusive when a timing ran on a busy machine (load > {BUSY_FRACTION:g} x cores)"
    reason = f"{len(why)} of {len(timed)} timings ran on a busy machine ({why[0][0]}: {why[0][1]}); {v.reason}"
    return Verdict("inconclusive", rule, reason, v.estimate)


def cost_claims(results: dict[str, dict], s: GuideSettings) -> list[dict]:
    """O(n^2) time for every method, O(n) memory for flash, O(n^2) memory for math; the speedup."""
    out = []
    for m in s.cost_methods:
        for bwd in (False, True):
            tag = f"{m}/{'fwd+bwd' if bwd else 'fwd'}"
            out.append(_exponent_claim(results, m, bwd, "time", 2, "Time is O(n^2) in the length", f"time/{tag}"))
            flash = "flash" in m
            text = "Flash Attention is O(n) in memory" if flash else "Standard attention is O(n^2) in memory"
            out.append(_exponent_claim(results, m, bwd, "memory", 1 if flash else 2, text, f"memory/{tag}"))
    out += _speed_claims(results, s)
    return out


def _medians(results: dict[str, dict], method: str, backward: bool) -> dict[int, float]:
    xs, ys = cost_series(results, method, backward, "time")
    by: dict[int, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        by.setdefault(x, []).append(y)
    return {n: median_interval(v).value for n, v in by.items()}


def _speed_claims(results: dict[str, dict], s: GuideSettings) -> list[dict]:
    """'Use Flash beyond 512 tokens (benefits scale with length)': the math/flash time ratio of the medians
    at L >= 512 (paired by length) above 1, and its growth with the length."""
    out = []
    for bwd in (False, True):
        math_t, flash_t = _medians(results, "sdpa-math:bf16", bwd), _medians(results, "sdpa-flash:bf16", bwd)
        ls = sorted(n for n in math_t if n in flash_t and n >= SPEEDUP_FROM)
        p = "forward+backward" if bwd else "forward"
        if not ls:
            out += _speed_unmeasured(sorted(set(math_t) & set(flash_t)), p)
            continue
        est = ratio_interval([math_t[n] for n in ls], [flash_t[n] for n in ls])
        cond = f"sdpa-math vs sdpa-flash at bf16, {p}, median times at L = {', '.join(map(str, ls))}, CPU"
        timed = _tasks(results, "cost", lambda q, bwd=bwd, ls=ls: q["backward"] == bwd and q["seq_len"] in ls)
        v = unless_busy(compare(est, above=True), timed)
        text = "Flash Attention is faster than standard attention beyond 512 tokens"
        out.append(claim(text, v, f"math / flash time {est.text()}", cond, f"speedup/{p}"))
        g = _with_floor(trend(ls, [math_t[n] / flash_t[n] for n in ls], increasing=True), ls, "speed-up")
        g = unless_busy(g, timed)
        out.append(claim("Its benefits scale with length", g, g.reason, cond, f"speedup_grows/{p}"))
    return out


def _speed_unmeasured(lengths: list[int], p: str) -> list[dict]:
    """The two speed-up rows when no length reaches SPEEDUP_FROM: inconclusive, saying where the lengths stop."""
    stop = f"stop at {lengths[-1]}" if lengths else "are none"
    why = f"not measured: this preset's lengths {stop} (< {SPEEDUP_FROM})"
    cond = f"sdpa-math vs sdpa-flash at bf16, {p}, needs L >= {SPEEDUP_FROM}, CPU"
    rule = f"measured at L >= {SPEEDUP_FROM} only"
    v = Verdict("inconclusive", rule, why)
    return [
        claim("Flash Attention is faster than standard attention beyond 512 tokens", v, why, cond, f"speedup/{p}"),
        claim("Its benefits scale with length", v, why, cond, f"speedup_grows/{p}"),
    ]


def cv(times: Iterable[float]) -> float:
    """Coefficient of variation (sample std / mean) of one block of call latencies."""
    v = list(times)
    mean = sum(v) / len(v)
    return math.sqrt(sum((t - mean) ** 2 for t in v) / (len(v) - 1)) / mean if len(v) > 1 and mean > 0 else math.nan


def latency_claim(results: dict[str, dict], s: GuideSettings) -> dict:
    """CV of flash / CV of math paired by block (same time window), over every block at every length."""
    flash, base = [], []
    for r in results.values():
        if r["status"] == "ok" and r["params"]["kind"] == "latency":
            blocks = r["result"]["blocks"]
            flash += [cv(b) for b in blocks["sdpa-flash:bf16"]]
            base += [cv(b) for b in blocks["sdpa-math:bf16"]]
    est = ratio_interval(flash, base)
    v = unless_busy(compare(est, above=False), _tasks(results, "latency"))
    calls = s.latency_calls
    cond = (
        f"sdpa-flash vs sdpa-math at bf16, forward, L = {', '.join(map(str, s.latency_lengths))}, "
        f"{calls} calls each in {s.latency_blocks} interleaved blocks, {s.threads} thread(s), shared CPU"
    )
    measured = f"CV(flash) / CV(math) {est.text()}"
    return claim("Flash Attention reduces latency variance", v, measured, cond, "latency_variance")


def latency_rows(results: dict[str, dict], s: GuideSettings) -> list[list[str]]:
    """(method, L, CV over blocks: geometric mean with a t interval on logs, so never below 0, median latency)."""
    rows = []
    for r in sorted(results.values(), key=lambda r: r["id"]):
        if r["status"] != "ok" or r["params"]["kind"] != "latency":
            continue
        for m, blocks in r["result"]["blocks"].items():
            e = log_mean([cv(b) for b in blocks])
            med = median_interval([t for b in blocks for t in b])
            rows.append([m, str(r["params"]["seq_len"]), e.text(), f"{med.value * 1e3:.3g} ms", str(med.n)])
    return rows


def boundary_claims(results: dict[str, dict], s: GuideSettings) -> list[dict]:
    """fp16 NaN where bf16 is fine: structural where the search found a setting at which the fp16 method fails
    and its bf16 twin does not (pinned by tests/test_guide.py); an fp16 failure where bf16 fails too (e.g. an
    all-bf16 sum that is wrong at the same number of keys) is named and not counted."""
    out = []
    for m in s.boundary_methods:
        scales, _ = _scale_text(results, m)
        sums = _sum_text(results, m)
        bf = f"{_scale_text(results, twin(m))[0]}; {_sum_text(results, twin(m))}"
        counted, not_counted = _fp16_only(results, m)
        measured = f"{m}: {scales}; {sums}. bf16 at the same settings: {bf}"
        if counted:
            measured += f". fp16 fails where bf16 does not: {'; '.join(counted)}"
        if not_counted:
            measured += f". Not counted (bf16 fails there too): {'; '.join(not_counted)}"
        if counted:
            v = structural(
                "fp16's largest finite value is 65504; the search found where a stage kept in fp16 passes it "
                "before the inputs overflow, at a setting where bf16 stays right",
                "tests/test_guide.py",
            )
        elif not_counted:
            rule = "an fp16 failure counts where the bf16 twin is right at the same setting"
            v = Verdict("does not hold", rule, "wherever fp16 failed, bf16 failed too")
        else:
            rule = f"search over sigma <= 2^16 and Lk <= {s.sum_keys[1]} keys at the maximum"
            why = "no Inf/NaN before the fp16 inputs themselves overflow, and no wrong output with keys at the max"
            searched = any(_searched(r, m) for r in results.values())  # none yet: a study still writing
            v = Verdict("does not hold", rule, why) if searched else Verdict("inconclusive", rule, "not measured yet")
        cond = "Q, K, V = sigma x N(0,1), D = 64; keys all at the row maximum for the sum; CPU"
        out.append(
            claim("FP16 produced NaN at very long sequences where BF16 was fine", v, measured, cond, f"fp16/{m}")
        )
    return out


def _searched(r: dict, method: str) -> bool:
    """Whether guide result `r` is a finished fp16 search (scale or sum) of `method`."""
    p = r["params"]
    return r["status"] == "ok" and p["kind"] in ("scale", "sum", "sum_points") and p["method"] == method


def _fp16_only(results: dict[str, dict], method: str) -> tuple[list[str], list[str]]:
    """The settings where `method` (fp16) fails: (those where its bf16 twin is right, those where it is not)."""
    counted, not_counted = [], []
    for r in results.values():
        p = r["params"]
        if r["status"] != "ok" or p["kind"] != "scale" or p["method"] != method:
            continue
        i, top = r["result"]["boundary_i"], r["result"].get("inputs_overflow_i")
        if i is None or (top is not None and i >= top):
            continue  # finite, or only where the fp16 inputs overflow themselves
        other = results.get(f"scale/{twin(method)}/L={p['seq_len']}")
        j = other["result"]["boundary_i"] if other and other["status"] == "ok" else i
        where = f"L={p['seq_len']} sigma 2^{i / OCTAVE_STEPS:.4g}"
        (counted if j is None or j > i else not_counted).append(where)
    r, t = results.get(f"sum/{method}"), results.get(f"sum/{twin(method)}")
    if r is None or r["status"] != "ok" or r["result"]["boundary_keys"] is None:
        return counted, not_counted
    n = r["result"]["boundary_keys"]
    pinned = r["result"].get("searched", True) or r["result"]["points"].get(str(n - 1)) == "ok"
    if pinned:
        bf = _outcome_at(t, n)
        where = f"Lk = {n} keys at the maximum ({r['result']['outcome']}; bf16 {bf})"
        (counted if bf == "ok" else not_counted).append(where)
    return counted, not_counted


def _outcome_at(r: dict | None, n: int) -> str:
    """A sum task's outcome with n keys at the maximum: tried there, or implied by its searched boundary."""
    if r is None or r["status"] != "ok":
        return "not measured"
    res = r["result"]
    if str(n) in res["points"]:
        return res["points"][str(n)]
    if not res.get("searched", True):
        return "not tried"
    if res["boundary_keys"] is None:
        return "ok" if n <= max(map(int, res["points"])) else "not tried"
    return "ok" if n < res["boundary_keys"] else res["outcome"]


def _scale_text(results: dict[str, dict], method: str) -> tuple[str, bool]:
    """The scale boundaries at each length in words, and whether any lies below the inputs' own overflow."""
    parts, inside = [], False
    for r in sorted(results.values(), key=lambda r: r["params"].get("seq_len", 0)):
        p = r["params"]
        if r["status"] == "ok" and p["kind"] == "scale" and p["method"] == method:
            i, top = r["result"]["boundary_i"], r["result"].get("inputs_overflow_i")
            where = "finite up to sigma 2^16" if i is None else f"non-finite from sigma 2^{i / OCTAVE_STEPS:.4g}"
            if i is not None and top is not None and i >= top:
                where += " (the fp16 inputs overflow there)"
            inside = inside or (i is not None and (top is None or i < top))
            parts.append(f"L={p['seq_len']}: {where}")
    return ", ".join(parts) or "not measured", inside


def _sum_text(results: dict[str, dict], method: str) -> str:
    r = results.get(f"sum/{method}")
    if r is None or r["status"] != "ok":
        return "keys at the maximum: not measured"
    res = r["result"]
    if not res.get("searched", True):
        tried = ", ".join(f"{o} at Lk = {n}" for n, o in res["points"].items())
        n = res["boundary_keys"]
        if n is not None and res["points"].get(str(n - 1)) == "ok":  # two points one key apart pin it
            return f"keys at the maximum: {res['outcome']} from Lk = {n} ({tried})"
        return f"keys at the maximum: {tried}"
    if res["boundary_keys"] is None:
        return f"keys at the maximum: ok up to Lk = {max(map(int, res['points']))}"
    return f"keys at the maximum: {res['outcome']} from Lk = {res['boundary_keys']}"


GPU_CLAIMS = {
    "gpu_same": "The PyTorch native backend and the flash-attn library share CUDA kernels: identical numerics",
    "gpu_deterministic": "torch.backends.cudnn.deterministic = True may cost Flash Attention speed",
    "gpu_arch": "Flash Attention needs an Ampere or newer GPU (flash-attn wheels)",
}


def gpu_claims(results: dict[str, dict] | None = None) -> list[dict]:
    """The guide's claims that only a GPU can test: measured where the guide ran on one (gpu/* tasks), else
    listed as not measured with the command that measures them."""
    results = results or {}
    why = "not measured here: needs a GPU"
    out = []
    for cid, text in GPU_CLAIMS.items():
        r = results.get(cid.replace("_", "/", 1))
        if r is not None and r["status"] == "ok" and r["result"].get("available", True):
            out.append(_gpu_measured(cid, text, r))
        else:
            reason = r["result"].get("reason", why) if r is not None and r["status"] == "ok" else why
            out.append(
                claim(text, Verdict("inconclusive", "measured on a CUDA GPU only", reason), reason, GPU_COMMAND, cid)
            )
    return out


def _gpu_measured(cid: str, text: str, task: dict) -> dict:
    res = task["result"]
    if cid == "gpu_same":
        same = res["identical"]
        v = Verdict(
            "holds" if same else "does not hold",
            "bit-identical outputs (torch.equal)",
            f"max |sdpa-flash - flash-attn| = {res['max_abs']:.3g}",
        )
        cond = f"fp16, L = {res['seq_len']}, H = 8, D = 64, CUDA"
        return claim(text, v, v.reason, cond, cid)
    on = [median_interval(b).value for b in res["blocks"]["on"]]
    off = [median_interval(b).value for b in res["blocks"]["off"]]
    est = ratio_interval(on, off)
    cond = f"SDPA default backend, bf16, L = {res['seq_len']}, H = 16, blocks interleaved, CUDA"
    v = unless_busy(compare(est, above=True), [task])
    return claim(text, v, f"time on / off {est.text()}", cond, cid)


def log_mean(values: list[float]) -> Estimate:
    """Geometric mean of positive values with the t interval of their logs."""
    e = mean_interval([math.log10(x) for x in values if x > 0])
    if e.n == 0:
        return e
    lo, hi = (10**e.low, 10**e.high) if e.n >= 2 else (math.nan, math.nan)
    return Estimate(10**e.value, lo, hi, e.n, "geometric mean, t interval on logs")


def error_series(records: Iterable, method: str, view: str = "errors") -> tuple[list[int], list[float]]:
    """(lengths, relative L2 errors) of a method's ok study records: view "errors" (vs FP64 of the original
    inputs) or "errors_rounded" (vs FP64 of the inputs as the method rounded them: its own error)."""
    xs, ys = [], []
    for r in records:
        if r.status == "ok" and r.case.method == method:
            xs.append(r.case.seq_len)
            ys.append(getattr(r, view)["rel_l2"])
    return xs, ys


def error_claims(records: list, methods: Iterable[str]) -> list[dict]:
    """'1e-3 to 1e-2 relative error for FP16/BF16': per method, the geometric mean of its relative L2 errors
    (all lengths and seeds) against the band, and how much of it is the kernel's own error."""
    out = []
    for m in methods:
        xs, total = error_series(records, m)
        _, own = error_series(records, m, "errors_rounded")
        if not total:
            continue
        est = log_mean(total)
        share = ratio_interval(own, total)
        # independent errors add in quadrature: the kernel's own part is the smaller one below 1/sqrt(2)
        dom = "input rounding dominates" if share.high < SQRT_HALF else "kernel's own error dominates"
        dom = dom if share.high < SQRT_HALF or share.low > SQRT_HALF else "comparable parts"
        measured = f"rel L2 {est.text()}; own / total {share.text('.2f')} ({dom})"
        cond = f"{m}, L = {', '.join(map(str, sorted(set(xs))))}, N(0,1) inputs, vs FP64, CPU"
        text = "Relative error is 1e-3 to 1e-2 for FP16/BF16"
        v = band(est, 1e-3, 1e-2)
        c = claim(text, v, measured, cond, f"error_range/{m}")
        if v.status == "does not hold":  # say which side: an error below the range is not a failure of the format
            fmt = m.split(":")[-1]
            below = est.high < 1e-3
            c["side"] = (
                f"below the stated range: {fmt} is more accurate than the guide says"
                if below
                else f"above the stated range: {fmt} is less accurate than the guide says"
            )
            c["measured"] += f"; {c['side']}"
        out.append(c)
    return out


def slope_claims(records: list, explains: dict[int, dict], methods: Iterable[str]) -> list[dict]:
    """'Deviation grows with sequence length (more tiles)': the trend of each method's error against L, the
    reason from the stage attribution of the kernel-realistic policy (which stage removes the most)."""
    out = []
    reason = attribution_reason(explains)
    for m in methods:
        xs, ys = error_series(records, m)
        if not xs:
            continue
        t = _with_floor(trend(xs, ys, increasing=True), xs)
        _, own = error_series(records, m, "errors_rounded")
        t_own = trend(xs, own, increasing=True)
        measured = f"{t.reason}; own error {t_own.reason}"
        if m == "flash:bf16-mixed":
            measured += f". Attribution: {reason}"
        cond = f"{m}, L = {', '.join(map(str, sorted(set(xs))))}, log rel L2 vs log L over seeds, CPU"
        out.append(claim("Deviation grows with sequence length", t, measured, cond, f"slope/{m}"))
    return out


def best_trend_p(xs: Iterable[float]) -> float:
    """The smallest Kendall tau p-value these x values allow: that of a perfectly monotone y (strictly rising
    in sorted order; y = x too, which ties where x ties), so the trend rule's p < 0.05 is out of reach above 0.05."""
    from scipy import stats

    sx = sorted(xs)
    if len(set(sx)) < 2:
        return 1.0
    ranks = list(range(len(sx)))
    return float(min(stats.kendalltau(sx, ranks).pvalue, stats.kendalltau(sx, sx).pvalue))


def _with_floor(t: Verdict, xs: list[int], what: str = "error") -> Verdict:
    """t with "too few lengths for the trend rule" in its reason where even a perfect trend gives p >= 0.05."""
    best = best_trend_p(xs)
    if best < 0.05:
        return t
    why = f"{t.reason}; too few lengths for the trend rule ({len(set(xs))} lengths: even a perfectly monotone "
    why += f"{what} gives p = {best:.2g} >= 0.05)"
    return Verdict(t.status, t.rule, why, t.estimate)


def attribution_reason(explains: dict[int, dict]) -> str:
    """The dominant stage at each length and how each stage's own error moves from the first to the last."""
    if not explains:
        return "not measured"
    ls = sorted(explains)
    parts = []
    for n in ls:
        a = explains[n]
        dom = a["dominant_stage"]
        left = a["raised"][dom] / a["full"] if a["full"] > 0 else math.nan
        parts.append(f"L={n}: raising {dom} to FP64 leaves {left:.0%} of the error")
    first, last = explains[ls[0]], explains[ls[-1]]
    moves = ", ".join(
        f"{st} alone {first['alone'][st]:.2g} -> {last['alone'][st]:.2g}"
        for st in ("output", "p", "accum", "stats")
        if st in first["alone"]
    )
    tiles = max(last["alone"].get(st, 0.0) for st in ("accum", "stats"))
    per_element = max(last["alone"].get(st, 0.0) for st in ("input", "p", "output"))
    why = (
        f"the stages that accumulate over tiles (accum, stats) alone give at most {tiles:.2g} at L={ls[-1]}, "
        f"the per-element roundings (input, p, output) up to {per_element:.2g}"
    )
    return "; ".join(parts) + f"; {moves}; {why}"


def answer(records: list, results: dict[str, dict]) -> str:
    """The user's question in one paragraph: what the CPU flash kernel's extra deviation is (its error over
    math's on the same inputs) beside the time and memory it saves, all at bf16."""
    errs = {}
    for r in records:
        if r.status == "ok" and r.case.method in ("sdpa-flash:bf16", "sdpa-math:bf16"):
            errs.setdefault(r.case.method, {})[(r.case.seq_len, r.case.seed)] = r.errors["rel_l2"]
    pairs = sorted(set(errs.get("sdpa-flash:bf16", {})) & set(errs.get("sdpa-math:bf16", {})))
    if not pairs:
        return "Not enough measurements to weigh the deviation against the cost."
    dev = ratio_interval([errs["sdpa-flash:bf16"][p] for p in pairs], [errs["sdpa-math:bf16"][p] for p in pairs])
    lens, seeds = len({p[0] for p in pairs}), len({p[1] for p in pairs})
    what = f"(n={dev.n} (length, seed) pairs: {lens} length{'s' * (lens != 1)} x {seeds} seed{'s' * (seeds != 1)}"
    dev_text = dev.text(".3g").replace(f"(n={dev.n}", what, 1)
    flash_t, math_t = _medians(results, "sdpa-flash:bf16", False), _medians(results, "sdpa-math:bf16", False)
    both = sorted(set(flash_t) & set(math_t))
    top = both[-1] if both else None
    mem = {
        m: max(cost_series(results, m, False, "memory")[1] or [math.nan]) for m in ("sdpa-flash:bf16", "sdpa-math:bf16")
    }
    cost = (
        f" and at L={top} its forward takes {flash_t[top]:.3g} s against {math_t[top]:.3g} s, with a peak of "
        f"{mem['sdpa-flash:bf16'] / 2**20:.3g} MiB against {mem['sdpa-math:bf16'] / 2**20:.3g} MiB"
        if top
        else ""
    )
    return (
        f"Is the deviation worth it? At bf16 on this CPU, the flash kernel's relative error against FP64 is "
        f"{dev_text} times the math kernel's on the same inputs{_input_share(records)}{cost}."
    )


def _input_share(records: list) -> str:
    """A clause saying that input rounding is most of both kernels' error, when the two error views say so."""
    shares = []
    for m in ("sdpa-flash:bf16", "sdpa-math:bf16"):
        _, total = error_series(records, m)
        _, own = error_series(records, m, "errors_rounded")
        shares.append(ratio_interval(own, total).high)
    return " (most of both is the rounding of the inputs to bf16)" if max(shares) < SQRT_HALF else ""
