"""The Answer of a study that measured the modern questions (questions.modern): one plain sentence per question,
the words chosen from the measured verdicts and intervals (a verdict that flips flips its words), the numbers
with their 95% intervals right after the words. Built from summary.json findings only."""

from __future__ import annotations

import math

from flashcheck.questions.modern.findings import FA3_PUBLISHED, SAGE_PUBLISHED, UNLIKE
from flashcheck.questions.modern.presets import LOWP, SAGE, STAGE_PRESETS
from flashcheck.reporting.verdicts import EQUIVALENCE_MARGIN, Estimate, difference_words

# explain's stage names in words (a name not listed is shown as it is)
STAGE_WORDS = {
    "input": "the quantisation of the inputs",
    "score": "the rounding of the scores",
    "stats": "the softmax statistics",
    "p": "the rounding of P",
    "accum": "the P·V accumulator",
    "output": "the rounding of the output",
}

PLAIN = {  # the presets in words (kernels.sim.presets_modern cites each one's source)
    "fa4-fp8": "FA4's FP8 path",
    "fa4-fp4": "FA4's FP4 path",
    "sage3-fp4": "SageAttention3",
    "sage1": "SageAttention",
    "sage2-hopper": "SageAttention2's 8-bit kernel on Hopper (H100, sm90: FP22 accumulator)",
    "sage2-ada": "SageAttention2's 8-bit kernel on Ada (RTX 4090, sm89: SageAttention2++'s fp16 accumulator)",
    "sage2": "SageAttention2's 8-bit kernel (alias of sage2-hopper)",
    "sage2pp": "SageAttention2++ (alias of sage2-ada)",
    "sage2-4b": "SageAttention2's INT4 kernel",
}


def _named(n: str) -> str:
    return f"{PLAIN[n]} ({n})" if n in PLAIN else n


def _num(f: dict) -> str:
    """The finding's estimate with its interval: '1.02x [1.01, 1.03] (n=6)' (the tail of its measured text)."""
    return f["measured"].rpartition(": ")[2]


def _measured(by: dict, fid: str) -> dict | None:
    f = by.get(fid)
    return None if f is None or f.get("status", "not measured") == "not measured" else f


def _change(f: dict) -> str:
    """What a ratio to a reference says in words, from its interval: 'changes nothing measurable' when the
    interval holds 1, else 'adds 2%' / 'removes 30%'."""
    est, iv = f.get("estimate"), f.get("interval")
    if est is None or not math.isfinite(est):
        return "was not measured"
    if iv is None:
        return f"changes the error by {est - 1:+.0%} (too few values for an interval)"
    if iv[0] <= 1.0 <= iv[1]:
        return "changes nothing measurable"
    return f"adds {est - 1:.0%}" if est > 1 else f"removes {1 - est:.0%}"


def _fa4(by: dict) -> str | None:
    f = _measured(by, "modern_fa4_bf16")
    if f is None:
        return None
    head = {
        "holds": "FA4's bf16 kernel is as accurate as FA2",
        "does not hold": "FA4's bf16 kernel deviates more than FA2 allows (over 10% more error)",
    }.get(f["status"], "We cannot yet tell whether FA4's bf16 kernel is as accurate as FA2")
    parts = []
    for fid, what in (("modern_fa4_exp2_emulation", "its emulated exp2"), ("modern_fa4_rescale_threshold",
                      "the rescale threshold")):  # fmt: skip
        g = _measured(by, fid)
        if g is not None:
            parts.append(f"{what} {_change(g)} ({_num(g)})")
    tail = f": {' and '.join(parts)}" if parts else ""
    return f"{head} (error ratio FA4 / FA2 {_num(f)}){tail}."


def _than(f: dict) -> str:
    """Ours against a published figure in words, from the verdict "ours deviates no more than theirs"."""
    words = {"holds": "less than", "does not hold": "more than"}
    return words.get(f["status"], "neither measurably more nor less than")


def _versus(by: dict, methods: tuple[str, ...]) -> list[str]:
    """Clauses grouping the methods by their verdict against FA3's FP8 path: more, less, no difference."""
    groups: dict[str, list[dict]] = {"does not hold": [], "holds": [], "inconclusive": []}
    for m in methods:
        f = _measured(by, f"modern_{m.split(':', 1)[1]}_vs_fa3_fp8")
        if f is not None:
            groups.setdefault(f["status"], []).append(f)
    out = []
    for status, rows in groups.items():
        if not rows:
            continue
        names = [f["id"].removeprefix("modern_").removesuffix("_vs_fa3_fp8") for f in rows]
        nums = "; ".join(f"{n} {_num(f)}" for n, f in zip(names, rows, strict=True))
        ests = sorted(f["estimate"] for f in rows)
        span = f"{ests[0]:.2g}x" if len(ests) == 1 else f"{ests[0]:.2g}-{ests[-1]:.2g}x"
        who = _join([_named(n) for n in names]) + (" deviates" if len(names) == 1 else " deviate")
        if status == "does not hold":
            out.append(f"{who} {span} more ({nums})")
        elif status == "holds":
            out.append(f"{who} less, {span} of its error ({nums})")
        else:  # inconclusive: "no measurable difference" only within the equivalence margin
            for n, f in zip(names, rows, strict=True):
                said = _difference(f)
                verb = "shows" if said.startswith("no measurable difference") else "is"
                out.append(f"{_named(n)} {verb} {said} ({_num(f)})")
    return out


def _difference(f: dict) -> str:
    """A ratio finding's interval in words (reporting.verdicts.difference_words)."""
    iv = f.get("interval")
    est = Estimate(f["estimate"], iv[0], iv[1], f.get("n", 2), "") if iv else None
    return difference_words(est)


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _dominant(by: dict, presets: tuple[str, ...]) -> str | None:
    """'the quantisation of the inputs is the largest single cause for fa4-fp8 and fa4-fp4 (computing that stage
    in FP64 alone leaves 43%, 13% of the error); within it, Q/K quantisation (...) weighs most for fa4-fp8 (removing it
    alone leaves 67%)', grouped by stage and by sub-stage, from the dominant-stage verdicts that hold."""
    import re

    stages: dict[str, list[tuple[str, float]]] = {}
    subs: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for n in presets:
        f = _measured(by, f"modern_{n}_dominant_stage")
        if f is None or f["status"] != "holds" or f.get("estimate") is None:
            continue
        head = f["measured"].partition(":")[0].removeprefix("dominant stage ").strip()
        words, _, stage = head.rpartition(", in ") if ", in " in head else ("", "", head)
        stages.setdefault(stage, []).append((n, f["estimate"]))
        alone = re.match(r"[\d.e+-]+", f["measured"].rpartition("alone removed: ")[2])
        if words and alone:
            subs.setdefault((stage, words), []).append((n, f"{float(alone.group(0)):.0%}"))
    if not stages:
        return None
    parts = []
    for stage, rows in sorted(stages.items(), key=lambda kv: -len(kv[1])):
        left = ", ".join(f"{e:.0%}" for _, e in rows)
        text = (
            f"{STAGE_WORDS.get(stage, stage)} is the largest single cause for {_join([n for n, _ in rows])} "
            f"(computing that stage in FP64 alone leaves {left} of the error)"
        )
        within = [
            f"{words} weighs most for {_join([n for n, _ in r])} (removing it alone leaves "
            f"{', '.join(x for _, x in r)})"
            for (st, words), r in subs.items()
            if st == stage
        ]
        parts.append(text + (f"; within it, {'; '.join(within)}" if within else ""))
    return "; ".join(parts)


def _lowp(by: dict) -> str | None:
    clauses = _versus(by, LOWP[:3])
    if not clauses:
        return None
    cause = _dominant(by, STAGE_PRESETS["modern_stages"])
    out = "Against FA3's FP8 path, " + "; ".join(clauses) + "." + (f" By stage, {cause}." if cause else "")
    f = _measured(by, "modern_fa3-fp8_published")
    if f is not None:
        ours = f["measured"].partition("; ")[0].removeprefix("our ")
        if f["status"] == UNLIKE:
            out += (
                f" FlashAttention-3 publishes {FA3_PUBLISHED[0]:.1e} for its FP8 path on outlier inputs, ours is "
                f"{ours}: unlike conditions, no verdict ({f['claim'].partition('; theirs: ')[2]})."
            )
        else:
            out += (
                f" Beside the published figure, FA3's FP8 path on outlier inputs deviates {_than(f)} FlashAttention-3 "
                f"publishes: {ours} against {FA3_PUBLISHED[0]:.1e} (ours / theirs {_num(f)}, matched conditions)."
            )
    return out


def _sage(by: dict) -> str | None:
    clauses = _versus(by, SAGE)
    if not clauses:
        return None
    out = "SageAttention against FA3's FP8 path: " + "; ".join(clauses) + "."
    f = _measured(by, "modern_sage2-4b_published")
    if f is not None:
        ours = f["measured"].partition("; ")[0].removeprefix("our ")
        theirs = SAGE_PUBLISHED["flash:sage2-4b"][1]
        if f["status"] == UNLIKE:
            out += (
                f" SageAttention2 publishes a relative L1 of {theirs:.4f} for its INT4 kernel, sage2-4b gives {ours}: "
                f"unlike conditions, no verdict ({f['claim'].partition('; theirs: ')[2]}; the table below has every "
                "preset and input)."
            )
        else:
            out += (
                f" Beside the published figure, sage2-4b deviates {_than(f)} SageAttention2 publishes: {ours} "
                f"against {theirs:.4f} (ours / theirs {_num(f)}, matched conditions)."
            )
    cause = _dominant(by, STAGE_PRESETS["modern_sage_stages"])
    return out + (f" By stage, {cause}." if cause else "")


def _fp22(by: dict) -> str | None:
    f = _measured(by, "modern_fp22_share")
    if f is None:
        return None
    bound = {"holds": "less than 5% by the verdict", "does not hold": "5% or more by the verdict"}.get(
        f["status"], "the verdict cannot tell whether under 5%"
    )
    return f"The FP22 accumulator {_change(f)} in FA3-FP8's error ({_num(f)}; {bound})."


def _band_words(f: dict) -> str:
    if f["status"] == "holds":
        return "inside the paper's 3-10x"
    if f["status"] == "does not hold":
        return "above the 3-10x" if f["estimate"] > 10 else "below the 3-10x"
    return "at the edge of the 3-10x"


def _score(f: dict) -> float:
    return float(f["id"].rpartition("_d")[2])


def _sink(by: dict) -> str | None:
    """The sink sentences at the study's own setting (one sink key), then at 2606.06521's (four sink tokens)."""
    own = _sink_at(by, "modern_sink_")
    paper = _sink_at(by, "modern_sink4_")
    if paper:
        paper = f"At 2606.06521's own setting (4 sink tokens, i.i.d. scores): {paper[0].lower()}{paper[1:]}"
    return " ".join(t for t in (own, paper) if t) or None


def _sink_at(by: dict, prefix: str) -> str | None:
    rows = sorted((f for k, f in by.items() if k.startswith(prefix) and f.get("status") != "not measured"),
                  key=_score)  # fmt: skip
    if not rows:
        return None
    fixes = (("reverse", "reverse KV order"), ("static_scale", "S = 2^8"))
    moderate = sorted({_score(f) for f in rows if f["claim"].startswith("with a moderate sink")})
    text = []
    if moderate:
        parts = []
        for key, what in fixes:
            got = [f for f in rows if f["id"].startswith(f"{prefix}{key}_d") and _score(f) in moderate]
            if got:
                parts.append(f"{what} " + ", ".join(f"{_num(f)} at {_score(f):g} ({_band_words(f)})" for f in got))
        scores = _join([f"{d:g}" for d in moderate])
        text.append(f"With an attention sink of moderate strength (scores {scores}), the fixes lower the P-cast MSE: "
                    + "; ".join(parts) + ".")  # fmt: skip
    for kind in ("weak", "strong"):
        got = [f for f in rows if f["claim"].startswith(f"with a {kind} sink") and "_collapse_" not in f["id"]]
        if got:
            said = "; ".join(f"{dict(fixes)[f['id'].split('_d')[0].removeprefix(prefix)]} {_num(f)}"
                             for f in got)  # fmt: skip
            text.append(f"At a {kind} sink (score {_join(sorted({f'{_score(f):g}' for f in got}))}): {said}.")
    coll = [f for f in rows if f["id"].startswith(f"{prefix}collapse_d")]
    if coll:
        text.append(_collapse_sentence(coll))
    return " ".join(text) or None


def _collapse_sentence(coll: list[dict]) -> str:
    """The closed form against the measured collapse, by verdict: within 10% at some scores, missing at others, and
    where the interval crosses the band's edge (inconclusive), each miss with the form refined for the inputs."""
    by: dict[str, list[dict]] = {"holds": [], "does not hold": [], "inconclusive": []}
    for f in coll:
        by.setdefault(f["status"], []).append(f)
    parts = []
    if by["holds"]:
        scores, nums = _join([f"{_score(f):g}" for f in by["holds"]]), ", ".join(map(_num, by["holds"]))
        parts.append(f"holds within 10% at scores {scores} (measured / closed form {nums})")
    for status, words in (
        ("does not hold", "misses by more than 10% at"),
        ("inconclusive", "cannot be told within 10% (the interval crosses the band's edge) at"),
    ):
        if by[status]:
            parts.append(f"{words} {_join([f'{_score(f):g} ({_num(f)}{_refined(f)})' for f in by[status]])}")
    return "2606.06521's closed form of the fraction of P that collapses to zero " + "; it ".join(parts) + "."


def _refined(f: dict) -> str:
    """'; the form averaged over ...: 0.93x [...]' from a collapse finding's measured text ('' where it has none)."""
    refined = f["measured"].partition("; measured / the form ")[2].partition("; measured / closed form")[0]
    return f"; the form {refined}" if refined else ""


def modern_answer(found: list[dict], *, brief: bool = False) -> list[str]:
    """The Answer's sentences for the modern questions, in words first, numbers with intervals after: FA4 bf16
    vs FA2, FP8/FP4 vs FA3's FP8 path and the stage that causes it, Sage (with the published figure), the FP22
    accumulator, the sink fixes and the closed form; [] when the study measured none of them."""
    by = {f["id"]: f for f in found if f["id"].startswith("modern_")}
    if not any(f.get("status") != "not measured" for f in by.values()):
        return []
    if brief:  # one line after a classic study's answer (quick): the verdict rows and the conclusion have the rest
        line = _in_short(by)
        tail = "; the modern verdict rows below give the intervals."
        head = "The 2026 kernels (a small part here; `flashcheck study --preset modern` measures them all): "
        if not line:
            return []
        return [head + line.removeprefix("In short: ").replace(". In detail, with 95% intervals:", tail)]
    return [s for s in (_in_short(by), _fa4(by), _lowp(by), _sage(by), _fp22(by), _sink(by)) if s]


def _in_short(by: dict) -> str | None:
    """One line over the kernels first: FA4 bf16 against FA2, then every FP8/FP4/quantized kernel grouped by its
    verdict against FA3's FP8 path (more / less / no measurable difference); the sentences after give the numbers."""
    parts = []
    f = _measured(by, "modern_fa4_bf16")
    if f is not None:
        fa4 = {"holds": "is as stable as FA2 (within the 10% the verdict allows)", "does not hold": "is less "
               "stable than FA2 (over 10% more error)"}  # fmt: skip
        parts.append(f"FA4's bf16 kernel {fa4.get(f['status'], 'against FA2 is not settled')}")
    groups: dict[str, list[tuple[str, float]]] = {"holds": [], "same": [], "inconclusive": [], "does not hold": []}
    wide = []  # inconclusive and wider than the equivalence margin: each with its range in words
    for m in (*LOWP[:3], *SAGE):
        name = m.split(":", 1)[1]
        g = _measured(by, f"modern_{name}_vs_fa3_fp8")
        if g is None or g["status"] not in groups:
            continue
        if g["status"] == "inconclusive":
            said = _difference(g)
            if not said.startswith("no measurable difference"):
                wide.append(f"{name} against FA3's FP8 path is {said}")
                continue
            groups["same"].append((name, g["estimate"]))
        else:
            groups[g["status"]].append((name, g["estimate"]))
    words = {
        "holds": "deviate{s} less than FA3's FP8 path",
        "same": f"show{{s}} no measurable difference from FA3's FP8 path (within {EQUIVALENCE_MARGIN:.0%})",
        "does not hold": "deviate{s} more than FA3's FP8 path ({span})",
    }
    for status, rows in groups.items():
        if rows:
            ests = sorted(e for _, e in rows)
            span = f"{ests[0]:.2g}x" if len(ests) == 1 else f"{ests[0]:.2g}-{ests[-1]:.2g}x"
            verb = words[status].format(s="s" if len(rows) == 1 else "", span=span)
            parts.append(f"{_join([n for n, _ in rows])} {verb}")
    parts += wide
    if not parts:
        return None
    return "In short: " + "; ".join(parts) + ". In detail, with 95% intervals:"
