"""The `modern` study: FlashAttention-4, FP8/FP4 attention and SageAttention 1/2/3 measured against FP64, each
question a verdict with a 95% interval and the published figure beside ours (issue 23's questions).

Sweeps: modern_fa4 (FA4 bf16 against FA2, its emulated exp2 and rescale threshold alone and together),
modern_lowp and modern_sage (FP8/FP4 kernels and SageAttention at their own tiles, beside FA2 bf16 and
FA3's FP8 path, on Gaussian, outlier and captured MiniLM inputs), modern_sink (arXiv 2606.06521's P-cast
with an attention sink: KV order and the static scale S = 2^8)."""

from __future__ import annotations

import math

from flashcheck.core.inputs import as_adjective
from flashcheck.questions.modern.presets import (
    FA2,
    FA3_FP8,
    FA4,
    FA4_EMU,
    FA4_THR,
    FP22,
    LOWP,
    QUESTIONS,
    RAISED,
    SAGE,
    STAGE_PRESETS,
    sub_raised,
)
from flashcheck.questions.modern.sink import PUBLISHED as SINK_PUBLISHED
from flashcheck.questions.modern.sink import SINK_IDS, sink_findings
from flashcheck.questions.paper.presets import FA3_TABLE3_SOURCE, FA3_TABLE3_UNSTATED
from flashcheck.reporting.verdicts import Estimate, ratio_interval
from flashcheck.study.points import NOT_MEASURED, Point, finding, paired, ratio_text

# What the papers publish beside each question (quoted, not measured here).
PUBLISHED = {
    "fa4": "FlashAttention-4 (flash_attn/cute) ships the emulated exp2 and rescale_threshold 8 as speed "
    "features; no accuracy figure is published for them",
    "sink": SINK_PUBLISHED,
    "fp8": "no accuracy figure is published for FA4's FP8/FP4 path; FA3 (arXiv 2407.08608, Table 3) reports "
    "FP8 RMSE 9.1e-03 with block quantisation + Hadamard against 2.4e-02 per tensor (outlier inputs)",
    "fp22": "SageAttention2 (arXiv 2411.10958): the FP8 MMA accumulator on Ada/Hopper keeps 13 mantissa bits "
    "(FP22); DeepSeek-V3 (arXiv 2412.19437): promotion every 128 elements repairs it",
    "sage": "SageAttention 1/2/2++/3 (arXiv 2410.02367, 2411.10958, 2505.21136, 2505.11594) report cosine "
    "similarity and relative L1 per layer of real models, against FA2 or full precision; SageAttention2++ "
    "reports the same accuracy as SageAttention2",
}


def stage_findings(pts: dict[str, list[Point]]) -> list[dict]:
    """Per preset of the stage sweeps: the dominant stage, the one whose raising to FP64 lowers the error most
    (explain's rule), named by its dominant sub-stage in words where the preset has sub-stages in it (Q/K or V
    quantisation, an MMA accumulator: measure.substages), with the paired ratio raised / full and its interval (and
    the sub-stage's, removed alone / full)."""
    from flashcheck.core.numerics import parse_policy
    from flashcheck.measure.substages import BY_NAME
    from flashcheck.reporting.verdicts import compare

    out = []
    for q, names in STAGE_PRESETS.items():
        points = pts.get(q, [])
        for n in names:
            full = f"flash:{n}"
            ests = {s: _ratio(points, f"{full},{s}=fp64", full) for s in RAISED}
            ests = {s: e for s, e in ests.items() if e is not None and e.n}
            claim = f"{n}: raising its dominant stage to FP64 lowers its error (explain's attribution)"
            if not ests:
                out.append(finding(f"modern_{n}_dominant_stage", claim, NOT_MEASURED, None, section=q))
                continue
            top = min(ests, key=lambda s: ests[s].value)
            subs = {s: _ratio(points, f"{full},{t}", full) for s, t in sub_raised(n).items() if BY_NAME[s].stage == top}
            subs = {s: e for s, e in subs.items() if e is not None and e.n}
            est = ests[top]
            measured = f"dominant stage {top}: error with {top} in FP64 / the preset's: {ratio_text(est)}"
            if subs:  # named by its dominant sub-stage; the words before the first colon (modern_sentences quotes them)
                sub = min(subs, key=lambda s: subs[s].value)
                words = BY_NAME[sub].label(parse_policy(n))
                measured = (f"dominant stage {words}, in {top}: error with {top} in FP64 / the preset's: "
                            f"{ratio_text(est)}; with {sub} alone removed: {ratio_text(subs[sub])}")  # fmt: skip
            out.append(finding(f"modern_{n}_dominant_stage", claim, measured, compare(est, above=False), section=q))
    return out


def _ratio(points: list[Point], a: str, b: str, *, square: bool = False) -> Estimate | None:
    num, den = paired(points, a, b)
    if not num:
        return None
    if square:  # a ratio of MSEs from relative L2 errors on the same inputs
        num, den = [x * x for x in num], [x * x for x in den]
    return ratio_interval(num, den)


def _judged(fid: str, claim: str, est: Estimate | None, what: str, verdict, paper: str, section: str) -> dict:
    if est is None or est.n == 0:
        return finding(fid, claim, NOT_MEASURED, None, paper=paper, section=section)
    return finding(fid, claim, f"{what}: {ratio_text(est)}", verdict(est), paper=paper, section=section)


# SageAttention's published accuracy (cos-sim and relative L1 of the attention output against full precision),
# at the condition closest to each preset; None where no figure was found in the stored copies of the papers.
# 2411.10958 v1's Table 4 was read from a transcription of its tables (its INT4 + FP16 row, 99.45% / 0.0649 /
# 0.0335, equals Table 2's per-token row, as it should); later versions renumber the tables.
SAGE_PUBLISHED: dict[str, tuple[float, float, str] | None] = {
    "flash:sage2-4b": (
        0.9944,
        0.0683,
        "SageAttention2 (arXiv 2411.10958 v1, Table 4): INT4 per-thread Q, K (smoothed), E4M3 P and V; average "
        "over all layers of CogvideoX (RMSE 0.0347)",
    ),
}
SAGE_UNPUBLISHED = {
    "flash:sage1": "SageAttention (arXiv 2410.02367) reports cos-sim, relative L1 and RMSE for its data-type "
    "choices averaged over layers; its figure for this kernel was not found in the stored copies",
    "flash:sage2-hopper": "SageAttention2 (arXiv 2411.10958) reports its 8-bit kernel (SageAttn2-8b) by end-to-end "
    "metrics; no cos-sim for it was found",
    "flash:sage2-ada": "SageAttention2++ (arXiv 2505.21136; its fp16 accumulator is what sageattn runs on Ada): 'the "
    "same attention accuracy as SageAttention2', no figure of its own",
    "flash:sage3-fp4": "SageAttention3 (arXiv 2505.11594): no cos-sim or relative-L1 figure found in the stored copies",
}
SAGE_ROWS = (*SAGE, "flash:sage3-fp4")
THEIRS_VS_OURS = (
    "Theirs: real model layers (CogvideoX video tokens, head dim 64, GPU kernels, against full-precision "
    "attention); ours: simulated kernels on Gaussian, outlier and captured MiniLM inputs (L=1024, D=32) against FP64."
)


def _geo(xs: list[float]) -> Estimate:
    from flashcheck.study.points import geometric

    return geometric(tuple(xs))


def sage_published_rows(records: dict | None) -> tuple[list[str], list[list[str]]]:
    """SageAttention's published accuracy beside ours: per Sage preset and input distribution, our cos-sim and
    relative L1 of the output against FP64 (geometric mean over seeds of 1 - cos and of L1, 95% interval) and
    the published figure at the closest condition (or which paper reports what instead). Empty without records."""
    header = ["method", "inputs", "ours: cos-sim [95%]", "ours: relative L1 [95%]", "published (their conditions)"]
    groups: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for r in (records or {}).values():
        if r.case.method in SAGE_ROWS and "cos_sim" in r.errors and "rel_l1" in r.errors:
            groups.setdefault((r.case.method, r.case.distribution), {})[r.case.seed] = (
                r.errors["cos_sim"], r.errors["rel_l1"])  # fmt: skip
    rows = []
    for (method, dist), by_seed in sorted(groups.items(), key=lambda kv: (SAGE_ROWS.index(kv[0][0]), kv[0][1])):
        cos = _geo([1.0 - c for c, _ in by_seed.values()])
        l1 = _geo([x for _, x in by_seed.values()])
        pub = SAGE_PUBLISHED.get(method)
        theirs = f"cos-sim {pub[0]:.2%}, relative L1 {pub[1]:.4f}: {pub[2]}" if pub else SAGE_UNPUBLISHED[method]
        rows.append([method, dist, _cos_text(cos), _l1_text(l1), theirs])
    return (header, rows) if rows else (header, [])


def _cos_text(e: Estimate) -> str:
    """1 - cos as a cos-sim in percent: '99.987% [99.985, 99.989]' (the interval flips with 1 -)."""
    if e.n == 0:
        return "not measured"
    if e.n < 2 or not math.isfinite(e.low):
        return f"{1 - e.value:.4%} (n={e.n})"
    return f"{1 - e.value:.4%} [{100 * (1 - e.high):.4f}, {100 * (1 - e.low):.4f}] (n={e.n})"


def _l1_text(e: Estimate) -> str:
    if e.n == 0:
        return "not measured"
    if e.n < 2 or not math.isfinite(e.low):
        return f"{e.value:.3g} (n={e.n})"
    return f"{e.value:.3g} [{e.low:.3g}, {e.high:.3g}] (n={e.n})"


FA3_PUBLISHED = (
    9.1e-3,
    "FlashAttention-3 (arXiv 2407.08608, Table 3): RMSE of its FP8 path (block quantisation + Hadamard) on "
    "inputs N(0, 1) + N(0, 100) x Bernoulli(0.001) against full precision",
)


UNLIKE = "unlike conditions"  # a published figure whose conditions ours do not match: no verdict
# The conditions each published figure was measured under, as its paper states them (None: not stated), and the
# input distribution of ours that draws the same inputs (None: none of ours does).
PUBLISHED_CONDITIONS: dict[str, dict[str, object]] = {
    "flash:sage2-4b": {"inputs": "CogvideoX's attention layers (video tokens)", "ours_inputs": None, "head_dim": 64,
                       "seq_len": None, "metric": "relative L1 against full precision, GPU kernel"},
    FA3_FP8: {"inputs": "N(0, 1) + N(0, 100) x Bernoulli(0.001) in every entry of Q, K, V",
              "ours_inputs": "outliers", "head_dim": None, "seq_len": None,
              "metric": "RMSE (absolute) against an FP64 reference",
              "also_unstated": tuple(x for x in FA3_TABLE3_UNSTATED if x not in ("sequence length", "head dim")),
              "source": FA3_TABLE3_SOURCE},
}  # fmt: skip


def conditions_text(cond: dict) -> str:
    """The paper's conditions in words, 'not stated' where it gives none (and what else it leaves unstated)."""
    size = ", ".join(f"{k.replace('_', ' ')} {cond[k] if cond[k] is not None else 'not stated'}"
                     for k in ("seq_len", "head_dim"))  # fmt: skip
    more = f"; also not stated: {', '.join(cond['also_unstated'])}" if cond.get("also_unstated") else ""
    where = f" ({cond['source']})" if cond.get("source") else ""
    return f"{cond['inputs']}; {size}; {cond['metric']}{more}{where}"


def matched(cond: dict, dist: str, seq_lens: set[int], head_dims: set[int]) -> bool:
    """Ours match the paper's conditions: the same inputs, and every size the figure depends on stated by the
    paper and equal to ours (an absolute error moves with the head dim and the length: an unstated one is unlike)."""
    if cond["ours_inputs"] is None or dist != cond["ours_inputs"]:
        return False
    sizes = (("seq_len", seq_lens), ("head_dim", head_dims))
    return all(cond[k] is not None and {cond[k]} == ours for k, ours in sizes)


def _by_dist(records: dict | None, method: str, metric: str) -> dict[str, list[float]]:
    """A method's per-seed values of one metric, by input distribution (one value per seed)."""
    by: dict[str, dict[int, float]] = {}
    for r in (records or {}).values():
        if r.case.method == method and metric in r.errors:
            by.setdefault(r.case.distribution, {})[r.case.seed] = r.errors[metric]
    return {d: list(v.values()) for d, v in by.items()}


def _sizes(records: dict | None, method: str, dist: str) -> tuple[set[int], set[int]]:
    cases = [r.case for r in (records or {}).values() if r.case.method == method and r.case.distribution == dist]
    return {c.seq_len for c in cases}, {c.head_dim for c in cases}


def _published(fid: str, method: str, dist: str, vals: list[float], theirs: float, what: str, records, paper: str):
    """Ours beside a published figure: both conditions in the claim; a verdict (ours no larger than theirs)
    only where ours match the paper's conditions, else status "unlike conditions" and no verdict."""
    from flashcheck.reporting.verdicts import Verdict, compare

    cond = PUBLISHED_CONDITIONS[method]
    lens, dims = _sizes(records, method, dist)
    sizes = f"seq len {'/'.join(map(str, sorted(lens)))}, head dim {'/'.join(map(str, sorted(dims)))}"
    ours = f"{as_adjective(dist)} inputs, {sizes}"
    est = ratio_interval(vals, [theirs] * len(vals))
    measured = f"our {what} {_l1_text(_geo(vals))}; ours / the published: {ratio_text(est)}"
    claim = (
        f"{method.split(':', 1)[1]} deviates no more than its paper publishes ({what} {theirs:.3g}); theirs: "
        f"{conditions_text(cond)}; ours: {ours}"
    )
    if matched(cond, dist, lens, dims):
        return finding(fid, claim, measured, compare(est, above=False), paper=paper, section=SECTION[method])
    why = "the paper's conditions and ours differ (or the paper does not state them): no verdict"
    verdict = Verdict(UNLIKE, "a verdict only at matched conditions", why, est)
    return finding(fid, claim, measured, verdict, paper=paper, section=SECTION[method])


SECTION = {"flash:sage2-4b": "modern_sage", FA3_FP8: "modern_lowp"}


def published_finding(records: dict | None) -> list[dict]:
    """Ours beside a published figure, per seed ours / theirs, each with the paper's conditions and ours: sage2-4b's
    relative L1 against SageAttention2's (on the captured MiniLM inputs when measured, else Gaussian ones) and
    FA3-FP8's RMSE on outlier inputs against FlashAttention-3's Table 3. A verdict only at matched conditions."""
    out = []
    _, l1_pub, src = SAGE_PUBLISHED["flash:sage2-4b"]
    by = _by_dist(records, "flash:sage2-4b", "rel_l1")
    if by:
        dist = next((d for d in ("captured:minilm", "normal") if d in by), sorted(by)[0])
        out.append(_published("modern_sage2-4b_published", "flash:sage2-4b", dist, by[dist], l1_pub, "relative L1",
                              records, src))  # fmt: skip
    rmse_pub, src = FA3_PUBLISHED
    vals = _by_dist(records, FA3_FP8, "rmse").get("outliers", [])
    if vals:
        out.append(_published("modern_fa3-fp8_published", FA3_FP8, "outliers", vals, rmse_pub, "RMSE", records, src))
    return out


def modern_findings(pts: dict[str, list[Point]], records: dict | None = None) -> list[dict]:
    """The modern questions' verdicts from whatever the study measured (none when it ran no modern sweep);
    `records` (the study's ok records by case id) give the P-collapse fractions and the cos-sim/relative L1."""
    from flashcheck.reporting.verdicts import compare

    if not any(pts.get(q) for q in QUESTIONS):
        return []
    fa4, low, sage, sink = (pts.get(q, []) for q in QUESTIONS[:4])
    within = lambda e: compare(e, above=False, threshold=1.1)  # noqa: E731  at most 10% above FA2
    out = []
    for fid, method, what in (
        ("modern_fa4_bf16", FA4, "FA4 bf16"),
        ("modern_fa4_exp2_emulation", FA4_EMU, "FA4's emulated exp2 alone"),
        ("modern_fa4_rescale_threshold", FA4_THR, "FA4's rescale threshold 8 alone"),
    ):
        claim = f"{what} is as stable as FA2 bf16 (rel-L2 ratio below 1.1)"
        est = _ratio(fa4, method, FA2)
        out.append(_judged(fid, claim, est, f"{method} / {FA2}", within, PUBLISHED["fa4"], "modern_fa4"))
    both = low + sage
    for method in (*LOWP[:3], *SAGE):
        name = method.split(":", 1)[1]
        claim = f"{name} deviates less than FA3's FP8 path (rel-L2 ratio below 1)"
        est = _ratio(both, method, FA3_FP8)
        section = "modern_sage" if method in SAGE else "modern_lowp"
        paper = PUBLISHED["sage"] if "sage" in name else PUBLISHED["fp8"]
        verdict = lambda e: compare(e, above=False)  # noqa: E731
        out.append(_judged(f"modern_{name}_vs_fa3_fp8", claim, est, f"{method} / {FA3_FP8}", verdict, paper, section))
    out += published_finding(records)
    est = _ratio(low, FP22, FA3_FP8)
    claim = "the FP22 accumulator adds less than 5% to FA3-FP8's error"
    verdict = lambda e: compare(e, above=False, threshold=1.05)  # noqa: E731
    out.append(
        _judged("modern_fp22_share", claim, est, f"{FP22} / {FA3_FP8}", verdict, PUBLISHED["fp22"], "modern_lowp")
    )
    out += sink_findings(sink, records)
    return out + stage_findings(pts)


def _cause(dominant: str) -> str:
    """The dominant stages' clause, where explain's attribution was measured ('' where not: issue 34)."""
    if dominant == "not measured":
        return ""
    how = "raising it to FP64 lowers the error most, as `flashcheck explain --preset NAME` finds"
    return f" The stage that causes it ({how}): {dominant}."


def modern_sentences(found: list[dict]) -> list[tuple[str, str]]:
    """The conclusion's sentences over the modern questions (after the Answer), published figures beside; a
    question the study did not measure (quick measures two of them) has no sentence."""
    by = {f["id"]: f for f in found if f["id"].startswith("modern_")}
    if not by or all(f["status"] == "not measured" for f in by.values()):
        return []

    def said(fid: str) -> str:
        f = by.get(fid)
        return "not measured" if f is None or f["status"] == "not measured" else f"{f['measured']} ({f['status']})"

    def dominant() -> str:
        rows = [f for k, f in by.items() if k.endswith("_dominant_stage") and f["status"] != "not measured"]
        return "; ".join(f["claim"].split(":")[0] + " " + f["measured"].split(":")[0] for f in rows) or "not measured"

    def each(methods) -> str:  # the measured ones only: the report lists what this preset did not ask, once
        names = [m.split(":", 1)[1] for m in methods]
        done = [f"{n} {said(f'modern_{n}_vs_fa3_fp8')}" for n in names]
        return "; ".join(d for d in done if not d.endswith(" not measured")) or "not measured"

    sink = [f for k, f in by.items() if k.startswith(SINK_IDS) and f["status"] != "not measured"]
    sink_text = "; ".join(f"{f['claim']}: {f['measured']} ({f['status']})" for f in sink) or "not measured"

    def vs(methods) -> list[str]:
        return [f"modern_{m.split(':', 1)[1]}_vs_fa3_fp8" for m in methods]

    dominants = [k for k in by if k.endswith("_dominant_stage")]
    # (text, section, the findings it rests on): a sentence none of whose findings was measured is left out
    sentences = [
        (
            f"FA4 bf16 against FA2 bf16: {said('modern_fa4_bf16')}; the emulated exp2 alone "
            f"{said('modern_fa4_exp2_emulation')}; the rescale threshold alone {said('modern_fa4_rescale_threshold')}."
            f" Published: {PUBLISHED['fa4']}.",
            "modern_fa4",
            ["modern_fa4_bf16", "modern_fa4_exp2_emulation", "modern_fa4_rescale_threshold"],
        ),
        (
            f"FP8/FP4 kernels against FA3's FP8 path: {each(LOWP[:3])}.{_cause(dominant())}",
            "modern_lowp",
            vs(LOWP[:3]) + dominants,
        ),
        (
            f"SageAttention against FA3's FP8 path: {each(SAGE)}. Beside the published accuracy: "
            f"{said('modern_sage2-4b_published')}. Published: {PUBLISHED['sage']}.",
            "modern_sage",
            [*vs(SAGE), "modern_sage2-4b_published"],
        ),
        (
            f"The FP22 accumulator's share of FA3-FP8's error: {said('modern_fp22_share')}. "
            f"Published: {PUBLISHED['fp22']}.",
            "modern_lowp",
            ["modern_fp22_share"],
        ),
        (f"P-cast with an attention sink, per sink score: {sink_text}. Published: {PUBLISHED['sink']}.", "modern_sink",
         [f["id"] for f in sink]),
    ]  # fmt: skip
    return [(t, q) for t, q, fids in sentences if any(said(fid) != "not measured" for fid in fids)]


NOTES = {
    "modern_fa4": "Metric rel-L2 vs FP64. FA2 is the flash kernel with bf16 inputs, P and output and fp32 "
    "statistics; fa4-bf16 adds FA4's emulated exp2 (ex2_emu_freq 10), rescale_threshold 8 and rcp.approx.",
    "modern_lowp": "Metric rel-L2 vs FP64 of the original inputs (so FP8/FP4 input rounding counts). Presets: "
    "kernels.sim.presets_modern (each cites its source).",
    "modern_sage": "SageAttention presets at 128 x 64 tiles (SageAttention1's and the Ada kernels' own; the Hopper "
    "kernel's are 64 x 128, run here at Ada's so that one sweep holds all four): INT8/INT4 Q, K with smoothing, FP8 "
    "or fp16 P and V, the FP22 (sage2-hopper, H100) / fp16 (sage2-ada, RTX 4090: SageAttention2++) accumulators.",
    "modern_sink": "Two sink settings. The study's own, sink:DELTA: every row scores key 0 at DELTA and the rest ~ "
    "N(0, |q|^2 / D), a spread that differs by row. The paper's, sink4:DELTA (arXiv 2606.06521): keys 0-3 scored "
    "DELTA + N(0, 1), every other score i.i.d. N(0, 1). Q, K, V in fp32; only P is cast to e4m3 (the paper's "
    "kernel-faithful setting). A sink counts as moderate where the closed form collapses 1-60% of P (the paper gives "
    "no number).",
}
