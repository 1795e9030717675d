"""The conclusion at the top of a study report: plain sentences generated from the measured findings and
points, each paired with the section (anchor) that holds its evidence."""

from __future__ import annotations

import math

from flashcheck.questions.paper.findings import FA3_CONDITIONS, MIXED, PAPER, at_longest
from flashcheck.reporting.verdicts import MIN_N, difference_words, ratio_interval
from flashcheck.study.points import Point, ratio_text

Sentence = tuple[str, str]  # (text, anchor of its section)


def conclusion(found: list[dict], pts: dict[str, list[Point]]) -> list[Sentence]:
    """Sentences answering "is Flash Attention stable?" from this study's numbers (none for a question it did not
    measure; the engine adds the failed and skipped cases, and a line when no set said anything)."""
    by = {f["id"]: f for f in found}
    out: list[Sentence] = []
    for make in (_realistic, _paper, _length, _tiles, _formats, _backends, _fa3, _advice):
        s = make(by, pts)
        if s:
            out.append(s)
    return out


def _verdict(f: dict) -> str:
    return {"holds": "holds", "does not hold": "does not hold"}.get(f["status"], f"is {f['status']}")


def _realistic(by: dict, pts: dict) -> Sentence | None:
    f = by.get("flash_vs_baseline_bf16_mixed")
    p = at_longest(pts.get("seq_len", []), MIXED)
    if f is None or p is None:
        return None
    est, own = p.ratio_estimate(), p.own_ratio_estimate()
    word = {"holds": "lower than it", "does not hold": "higher than it"}.get(f["status"])
    word = f"{word} at 95% confidence" if word else f"with no verdict ({f['reason']})"
    return (
        f"Kernel-realistic policy (bf16 inputs, fp32 softmax statistics and accumulator, as real kernels do): at "
        f"L={p.seq_len} with {p.label} tiles Flash's max-abs error is {ratio_text(est)} that of standard attention "
        f"under the same policy, {word}; on the kernel's own error (relative L2 against FP64 "
        f"of the rounded inputs) the ratio is {ratio_text(own)}.",
        "seq_len",
    )


def _paper(by: dict, pts: dict) -> Sentence | None:
    f = by.get("flash_vs_baseline_bf16")
    p = at_longest(pts.get("seq_len", []), PAPER)
    if f is None or p is None:
        return None
    return (
        f"Paper's policy (every stage in bf16): Flash deviates {ratio_text(p.ratio_estimate())} as much as "
        f"Baseline at L={p.seq_len} with {p.label} tiles (the paper reports about 10x at lengths and tiles it "
        f"does not state); the claim that Flash "
        f"deviates more {_verdict(f)}. Its own error on the rounded inputs is {ratio_text(p.own_ratio_estimate())}.",
        "seq_len",
    )


def _length(by: dict, pts: dict) -> Sentence | None:
    f = by.get("grows_with_seq_len")
    if f is None or f["status"] == "not measured":
        return None
    text = f"With all-bf16 arithmetic the ratio's growth with sequence length {_verdict(f)} ({f['measured']})"
    est = f.get("baseline_trend", {}).get("estimate")
    if est and math.isfinite(est["high"]) and est["high"] < 0:
        text += "; part of that growth is the Baseline's own max-abs falling with L (outputs shrink), not Flash"
    return text + ".", "seq_len"


def _tiles(by: dict, pts: dict) -> Sentence | None:
    area, sw, sq = by.get("shrinks_with_block_area"), by.get("swapped_blocks"), by.get("square_tiles")
    parts = []
    if area and area["status"] != "not measured":
        parts.append(f"the all-bf16 ratio's fall with the key-block size Bc {_verdict(area)} ({area['measured']})")
    if sw and sw["status"] != "not measured":
        parts.append(f"swapped tiles differ by their Bc: {sw['measured']}")
    if sq and sq["status"] != "not measured":
        parts.append(f"at equal area the square tile sits where its Bc puts it (verdict: {sq['status']})")
    if not parts:
        return None
    return (
        "Tile size acts only through Bc, the keys per block (the query block Br changes no row's arithmetic, "
        "a structural fact checked by a test): " + "; ".join(parts) + ".",
        "block_area",
    )


def _formats(by: dict, pts: dict) -> Sentence | None:
    points = [p for p in pts.get("formats", []) if p.baseline]
    if not points:
        return None
    cells = [f"{p.method.partition(':')[2]} {ratio_text(p.ratio_estimate())}" for p in points]
    p0 = points[0]
    return (
        f"By number format (L={p0.seq_len}, {p0.label} tiles), Flash/Baseline max-abs ratios: {'; '.join(cells)}.",
        "formats",
    )


def _backends(by: dict, pts: dict) -> Sentence | None:
    found = [f for f in by.values() if f["id"].startswith("backend_") and "_vs_" not in f["id"]]
    if not found:
        return None
    cells = [f"{f['claim'].split(' deviates')[0]} {f['measured']}" for f in found]
    text = "Real backends on this machine, relative L2 error against their baseline: " + "; ".join(cells) + "."
    for f in (f for f in by.values() if f["id"].startswith("backend_flash_vs_math_")):
        fmt = f["id"].rpartition("_")[2]
        text += (
            f" The CPU flash kernel against SDPA math at {fmt} on the same inputs: {f['measured']}; the claim that "
            f"it deviates more {_verdict(f)}."
        )
    return text, "backends"


def _fa3(by: dict, pts: dict) -> Sentence | None:
    found = [by[k] for k in ("fa3_fp16", "fa3_fp8") if k in by and by[k]["status"] != "not measured"]
    if not found:
        return None
    conditions = f" ({FA3_CONDITIONS})"  # the same in every cell's paper column: said once, at the end
    cells = [
        f"{f['claim'].split(' has')[0]}: {f['measured']} (paper: {f['paper'].replace(conditions, '')}; verdict: "
        f"{f['status']})"
        for f in found
    ]
    text = "FlashAttention-3's Table 3 (outlier inputs, RMSE): " + "; ".join(cells) + "."
    if any(conditions in f["paper"] for f in found):
        text += f" The paper's conditions: {FA3_CONDITIONS}."
    return text, "fa3"


def _advice(by: dict, pts: dict) -> Sentence | None:
    """Advice from the kernel-realistic ratio pooled over every measured length (paired per seed and length)."""
    mixed = [p for p in pts.get("seq_len", []) if p.method == MIXED and p.baseline]
    est = ratio_interval([v for p in mixed for v in p.values], [v for p in mixed for v in p.base_values])
    own = ratio_interval([v for p in mixed for v in p.own], [v for p in mixed for v in p.base_own])
    if est.n < 2 or not math.isfinite(est.high):
        return None
    within = _within(est)
    return (
        f"What to do: keep softmax statistics and accumulation in fp32 (every real kernel does); then Flash's "
        f"max-abs error is {ratio_text(est)} that of standard attention over lengths "
        f"{min(p.seq_len for p in mixed)}-{max(p.seq_len for p in mixed)} ({within}), "
        f"and its own error on the rounded inputs {ratio_text(own)}. The paper's ~10x needs every stage in bf16, "
        "a small key block (Bc=16) and long sequences.",
        "seq_len",
    )


def _within(est) -> str:
    """The pooled ratio's bound in words, as the answer judges it: an interval that holds 1 but is wider than
    the no-effect margin, or one from fewer than MIN_N values, settles nothing and is not cited as a bound."""
    if est.n < MIN_N:
        return f"too few values to settle it: n={est.n}, a verdict needs {MIN_N} or more"
    words = difference_words(est)
    if words.startswith("inconclusive"):
        return f"{words} at 95% confidence"
    return (
        f"at most {100 * (est.high - 1):.0f}% above it at 95% confidence"
        if est.high > 1
        else "below it at 95% confidence"
    )
