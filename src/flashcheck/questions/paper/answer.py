"""The top of a study report: two or three plain sentences answering "is Flash Attention stable?" for real
kernels (fp32 statistics, bf16-mixed) and for the paper's all-bf16 policy, derived from the computed verdicts
and ratios; the headline figure (the Flash/Baseline ratio against the length for both policies, the paper's
value marked at its own conditions); and the verdicts as one table."""

from __future__ import annotations

import math
from pathlib import Path

from flashcheck.core.fileio import make_folder
from flashcheck.questions.paper.findings import MIXED, PAPER, at_longest
from flashcheck.reporting.verdicts import (
    EQUIVALENCE_MARGIN,
    MIN_N,
    Estimate,
    compare,
    difference_words,
    ratio_interval,
)
from flashcheck.study.config import StudyConfig
from flashcheck.study.points import Point, ratio_text

# arXiv 2405.02803 gives figures only: about 10x at BF16 under the all-bf16 policy, with no length or tile size
# stated beside it (tiles from FlashAttention-1's Bc = ceil(M / 4d) on its GPU), so it is matched on the policy
# and drawn across every length, never at one length of ours.
PAPER_RATIO = 10.0
PAPER_CONDITIONS = "all bf16, FA1 tiles on its GPU; no length or tile size stated"
PAPER_CELL = f"about {PAPER_RATIO:g}x ({PAPER_CONDITIONS})"
SMOKE_PRESETS = ("tiny", "guide-tiny")  # toy sizes, one seed: they check the pipeline, not the numerics


def pooled_mixed(points: list[Point]) -> tuple[Estimate, list[int]]:
    """The kernel-realistic ratio to Baseline pooled over every measured length (paired per seed and length)
    and the lengths it pools."""
    mixed = [p for p in points if p.method == MIXED and p.baseline]
    est = ratio_interval([v for p in mixed for v in p.values], [v for p in mixed for v in p.base_values])
    return est, sorted({p.seq_len for p in mixed})


def smoke_sentence(config: StudyConfig | None) -> str | None:
    """For a smoke-test preset (SMOKE_PRESETS): the sentence saying so, with its lengths; else None."""
    if config is None or config.name not in SMOKE_PRESETS:
        return None
    ls = sorted({n for sw in config.sweeps for n in sw.seq_lens})
    seeds = max((len(sw.seeds) for sw in config.sweeps), default=0)
    at = f"L={ls[0]}-{ls[-1]}" if ls else "toy sizes"
    return (
        f"This is a smoke test (preset {config.name}) at {at} with {seeds} seed{'s' * (seeds != 1)}: it checks "
        "that the pipeline runs, and its verdicts say little; run the quick or full preset for an answer."
    )


def answer(found: list[dict], points: list[Point], config: StudyConfig | None = None) -> list[str]:
    """The first sentence (first_sentence: the answer in at most 30 words), then two or three sentences from the
    seq_len question's points and the verdicts (findings) with their intervals; one saying so when the study
    did not measure Flash against Baseline over the length; for a smoke-test preset (tiny, guide-tiny), a
    sentence saying that it is one, before those."""
    smoke = smoke_sentence(config)
    first = first_sentence(found, points)
    rest = _answer(found, points)
    asks = config is not None and any(sw.question == "seq_len" for sw in config.sweeps)
    if asks and rest and rest[0].startswith("This study did not measure"):  # asked, not stored yet: a partial study
        rest[0] = ("Flash against standard attention over the sequence length (the seq_len question) is not measured "
                   "yet; rerun the same command to finish.")  # fmt: skip
    return ([first] if first else []) + ([smoke] if smoke else []) + rest


FIRST_WORDS = 30  # the first sentence's most words: a reader asked "is Flash Attention stable?" reads one line
NEAR = 0.25  # an interval holding 1 within 1 +- NEAR reads "about the same"; wider, "not settled"


def first_sentence(found: list[dict], points: list[Point]) -> str | None:
    """The answer in one sentence of at most FIRST_WORDS words: with fp32 statistics (real kernels) Flash's
    error matches / is about the same as / is larger or smaller than standard attention's, with the pooled ratio
    and its 95% interval as a margin; with every stage in bf16, the verdict row's ratio at its length. Derived
    from the same estimates as the sentences and verdict rows after it (which keep the rules and intervals);
    None when the study measured neither."""
    real = _real_clause(points)
    paper = _paper_clause({f["id"]: f for f in found}, points)
    if real is None and paper is None:
        return None
    if real is None:
        return f"With all stages in bf16, Flash's error {paper.removeprefix('it ')}."
    head = f"With fp32 statistics (real kernels), Flash's error {real}"
    both = f"{head}; with all stages in bf16 {paper}."
    return both if paper and len(both.split()) <= FIRST_WORDS else f"{head}."


def _x(v: float) -> str:
    return f"{v:.2g}x"


def _real_clause(points: list[Point]) -> str | None:
    """'matches standard attention's (0.99x, within ±8%)' from the pooled bf16-mixed ratio (pooled_mixed)."""
    est, _ = pooled_mixed(points)
    if est.n < 1 or not math.isfinite(est.value):
        return None
    if est.n < MIN_N or not (math.isfinite(est.low) and math.isfinite(est.high)):
        return f"is not settled against standard attention's ({_x(est.value)}, n={est.n})"
    if est.low > 1:
        return f"is larger than standard attention's ({_x(est.value)}, {est.low:.2g}-{est.high:.2g}x)"
    if est.high < 1:
        return f"is smaller than standard attention's ({_x(est.value)}, {est.low:.2g}-{est.high:.2g}x)"
    spread = max(1 - est.low, est.high - 1)
    within = f"within ±{spread:.0%}"
    if spread <= EQUIVALENCE_MARGIN:
        return f"matches standard attention's ({_x(est.value)}, {within})"
    if spread <= NEAR:
        return f"is about the same as standard attention's ({_x(est.value)}, {within})"
    return f"is not settled against standard attention's ({_x(est.value)}, {est.low:.2g}-{est.high:.2g}x)"


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _paper_clause(by: dict, points: list[Point]) -> str | None:
    """'it is 27x at 8k tokens': the all-bf16 verdict row's ratio (flash_vs_baseline_bf16) at its length."""
    f, p = by.get("flash_vs_baseline_bf16"), at_longest(points, PAPER)
    value = (f or {}).get("estimate")
    if p is None or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return f"it is {_x(value)} at {_tokens(p.seq_len)} tokens"


def _answer(found: list[dict], points: list[Point]) -> list[str]:
    by = {f["id"]: f for f in found}
    real, paper = _real(points, by), _paper(by, points)
    if real is None and paper is None:
        return [
            "This study did not measure Flash against standard attention over the sequence length (the seq_len "
            "question); its verdicts follow."
        ]
    out = [s for s in (real, paper) if s]
    est, _ = pooled_mixed(points)
    bf16 = by.get("flash_vs_baseline_bf16", {}).get("status")
    if (
        real is not None
        and paper is not None
        and bf16 == "holds"
        and compare(est, above=True).status == "does not hold"
    ):
        out.append(
            "So the tiling is not what makes Flash Attention deviate: low-precision softmax statistics are. Keep "
            "them and the accumulator in fp32, as every real kernel does."
        )
    return out


def _real(points: list[Point], by: dict) -> str | None:
    """The sentence on real kernels (bf16-mixed): the ratio pooled over every length, and where the verdict row
    it names judges the longest length alone, that row's number and why the two differ (issue 34: one claim, one
    number). 'No measurable difference' only where the pooled interval lies within the equivalence margin."""
    est, lengths = pooled_mixed(points)
    if est.n < 2 or not math.isfinite(est.high):
        return None
    v = compare(est, above=True)  # the claim "Flash deviates more than Baseline"
    status = v.status
    finding = by.get("flash_vs_baseline_bf16_mixed", {}).get("status", "not measured")
    pooled = f"{ratio_text(est)} that of standard attention pooled over lengths {lengths[0]}-{lengths[-1]}"
    row = _row_words(points, lengths, finding, est.n)
    if status == "inconclusive" and est.n >= MIN_N and finding == "inconclusive":
        words = difference_words(est)
        if words.startswith("no measurable difference"):
            head, how = "No measurable difference", f"within {EQUIVALENCE_MARGIN:.0%} either way at 95% confidence"
        else:  # the interval holds 1 but is too wide to call the two the same
            head, how = "Inconclusive", f"{words.removeprefix('inconclusive: ')} at 95% confidence"
        return (
            f"{head} for real kernels: with fp32 softmax statistics and accumulator (bf16-mixed) Flash's max-abs "
            f"error is {pooled}, {how}{row}."
        )
    if status == "inconclusive" and (est.n < MIN_N or finding in ("inconclusive", "not measured")):
        return (  # follow the verdict: too little data is not "indistinguishable"
            f"Too few seeds/lengths to say for real kernels: with fp32 softmax statistics and accumulator "
            f"(bf16-mixed) Flash's max-abs error is {pooled}, which settles nothing ({v.reason}); the verdict on it "
            f"below is {finding}{_row_words(points, lengths, finding, est.n, stated=True)}."
        )
    word = "Not entirely" if status == "holds" else "Yes"
    how = {
        "holds": "larger than standard attention's at 95% confidence",
        "does not hold": "no larger than standard attention's at 95% confidence",
        "inconclusive": "indistinguishable from standard attention's (the 95% interval contains 1)",
    }[status]
    return (
        f"{word}, for real kernels: with fp32 softmax statistics and accumulator (bf16-mixed, as real kernels "
        f"keep them) Flash's max-abs error is {pooled}, {how}{row}."
    )


def _row_words(points: list[Point], lengths: list[int], finding: str, pooled_n: int, *, stated: bool = False) -> str:
    """'; the verdict row below judges the longest length alone, L=8192 (its 3 values, not the 15 pooled): 1.05x
    [0.93, 1.18] (n=3), inconclusive' where the row's number is not the pooled one (several lengths); with
    `stated` (the sentence names the verdict already) ', judging ...' without it; else ''."""
    row = at_longest(points, MIXED)
    if row is None or len(lengths) < 2 or finding == "not measured":
        return ""
    est = row.ratio_estimate()
    values = f"{est.n} value{'s' * (est.n != 1)}"
    what = f"the longest length alone, L={row.seq_len} (its {values}, not the {pooled_n} pooled): {ratio_text(est)}"
    return f", judging {what}" if stated else f"; the verdict row below judges {what}, {finding}"


def _paper(by: dict, points: list[Point]) -> str | None:
    f, p = by.get("flash_vs_baseline_bf16"), at_longest(points, PAPER)
    if f is None or p is None:
        return None
    more = {
        "holds": "deviates more",
        "does not hold": "does not deviate more",
        "inconclusive": "may deviate more (inconclusive)",
    }.get(f["status"], "was not compared")
    grows = by.get("grows_with_seq_len", {}).get("status")
    trend = {
        "holds": ", and the ratio grows with the length",
        "does not hold": ", and the ratio does not grow with the length",
        "inconclusive": "; whether the ratio grows with the length is not settled here",
    }.get(grows or "", "")
    return (
        f"With every stage in bf16 (the paper's policy) Flash {more}: {ratio_text(p.ratio_estimate())} that of "
        f"standard attention at L={p.seq_len} with {p.label} tiles{trend}. The paper reports {PAPER_CELL}."
    )


def draw_headline(points: list[Point], path: Path) -> Path | None:
    """Flash / Baseline (max-abs vs FP64 of the original inputs) against the length for the all-bf16 and the
    bf16-mixed policy, with 95% intervals, a line at 1 and the paper's value across every length (its own
    conditions, not one of our lengths). None without matplotlib or without both policies' ratios."""
    from flashcheck.reporting import Styler, figure, label_axes, matplotlib_available

    series = {
        m: sorted((p for p in points if p.method == m and p.baseline), key=lambda p: p.seq_len) for m in (PAPER, MIXED)
    }
    if not matplotlib_available() or not all(series.values()):
        return None
    words = {PAPER: "all bf16 (the paper's policy)", MIXED: "bf16-mixed: fp32 statistics (real kernels)"}
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    make_folder(path.parent, "the study's figures folder")
    style = Styler()
    spread = [p.ratio_estimate().n >= 2 for ps in series.values() for p in ps]
    with figure(path, size=(7.0, 4.6)) as (_, ax):  # atomic, never over a link
        for m, ps in series.items():
            ests = [p.ratio_estimate() for p in ps]
            ys = [e.value for e in ests]
            lo = [e.value - e.low if e.n >= 2 and math.isfinite(e.low) else 0.0 for e in ests]
            hi = [e.high - e.value if e.n >= 2 and math.isfinite(e.high) else 0.0 for e in ests]
            tiles = ps[0].label
            st = style(f"{words[m]}, tiles {tiles}")
            ax.errorbar([p.seq_len for p in ps], ys, yerr=[lo, hi], capsize=3, **st)
        paper = f"paper: about {PAPER_RATIO:g}x (all bf16; no L given)"
        ax.axhline(PAPER_RATIO, color="0.3", ls="--", lw=1.2, label=paper)
        ax.axhline(1.0, color="0.6", lw=0.8)  # no difference: no legend entry
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ls = sorted({p.seq_len for ps in series.values() for p in ps})
        ax.set_xticks(ls, [str(n) for n in ls])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))  # 0.2, 0.5, 2, 5, 20: more than 10^k
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 1 and 10, as plain as 2 and 5
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        label_axes(ax, x="sequence length L", y="Flash / standard attention, max-abs error", x_unit="tokens")
        title = "Flash's error over standard attention's, same policy and inputs: "
        if all(spread):
            title += "mean and 95% interval"
        elif any(spread):
            title += "mean and 95% interval (none where n=1)"
        else:
            title += "mean (n=1 per point: no interval)"
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return path
