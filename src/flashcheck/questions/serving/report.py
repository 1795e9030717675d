"""The serving study's report: the answer in words first (is an FP8 / FP4 KV cache safe at long context, are
outputs batch invariant, do prefill and decode agree), then the evidence, with published figures beside ours
at matched conditions only. Reads the stored units (tasks.load_units); computes nothing."""

from __future__ import annotations

from pathlib import Path

from flashcheck.measure.longcontext import VARIANTS
from flashcheck.questions.serving.tasks import SDPA_TARGETS, SPLIT_TARGETS, load_units
from flashcheck.reporting.page import Heading, Page, Table, Text, cell, write_report

SAFE, COLLAPSE = 1e-2, 5e-2  # relative L2 error of O: "safe" under 1%, "collapsed" over 5% (the rule, stated)
NOT_MEASURED = "not measured"
CAVEAT = (
    "What a kernel-level error can and cannot say about a model-level score: the relative error of one attention "
    "output against the exact attention of the same cache says how far the kernel moves that output; it does not say "
    "whether a model still retrieves a needle, since a model's answer depends on every layer and head, on what its "
    "values hold and on how its later layers read the output. A large error with shared-mean values predicts that "
    "long-context retrieval *can* fail (the output is pulled toward the needle's value and loses the haystack's "
    "common component); a small one rules out this accumulation as the cause. The percentages of a needle-in-a-"
    "haystack score are not comparable to an error, only the pattern (which variants fail, at which lengths) is."
)


def _longctx(units: dict) -> dict[tuple[str, int], list[dict]]:
    out = {}
    for name, u in units.items():
        if name.startswith(("longctx-", "captured-")) and u.get("status") == "ok":
            var, n = name.split("-", 1)[1].rsplit("-", 1)
            out.setdefault((var, int(n)), []).extend(u["rows"])
    return out


def _err(rows: list[dict], values: str, needle: str) -> float | None:
    return next((r["rel_err"] for r in rows if r["values"] == values and r["needle"] == needle), None)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def _word(err: float) -> str:
    return "safe" if err < SAFE else "collapses" if err > COLLAPSE else "degraded"


def _keys(n: int) -> str:
    """A KV length as printed: '8k' for whole thousands of 1024 keys, else exactly ('512 keys')."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n} keys"


def _cache_clause(cache: float) -> str:
    """What the cache format itself does to the exact output, apart from the kernel's accumulation."""
    if not cache:
        return ""
    if cache < SAFE:
        return f"; the cache format itself moves the exact output by up to {cache:.2g} from the bf16 cache's"
    return (f"; the cache format itself is not safe: it moves the exact output by up to {cache:.2g} from the bf16 "
            "cache's, whatever the accumulation")  # fmt: skip


def long_context_answer(lc: dict) -> str:
    """One sentence per variant measured: its shared-mean error against length, its zero-mean range, the word."""
    parts = []
    for var in [v for v in VARIANTS if any(k[0] == v for k in lc)]:
        lens = sorted(n for v, n in lc if v == var and _err(lc[var, n], "shared-mean", "late") is not None)
        if not lens:
            continue
        shared = [max(_err(lc[var, n], "shared-mean", nd) for nd in ("early", "late", "absent")) for n in lens]
        zero = [_err(lc[var, n], "zero-mean", nd) for n in lens for nd in ("early", "late")]
        flat = max(_err(lc[var, n], "zero-mean", "absent") for n in lens)
        at = " / ".join(f"{_fmt(e)} at {_keys(n)}" for e, n in zip(shared, lens, strict=True))
        own = _cache_clause(max(r.get("cache_err", 0.0) for n in lens for r in lc[var, n]))
        caps = sorted(n for v, n in lc if v == var and _err(lc[var, n], "captured", "late") is not None)
        cap = [max(_err(lc[var, n], "captured", nd) for nd in ("early", "late", "absent")) for n in caps]
        real = "; captured values (MiniLM): " + " / ".join(f"{e:.2g} at {_keys(n)}" for e, n in zip(cap, caps,
               strict=True)) if caps else ""  # fmt: skip
        parts.append(f"{var}: the kernel's accumulation is {_word(max(shared))} (worst shared-mean error {at}; "
                     f"zero-mean values with a needle "
                     f"{min(zero):.2g}..{max(zero):.2g}, without one {flat:.2g} (the relative error of a near-zero "
                     f"average){real}{own})")  # fmt: skip
    return "; ".join(parts)


def _cert_line(u: dict | None, check: str) -> str:
    if u is None:
        return NOT_MEASURED
    c = next(c for c in u["certificates"] if c["check"] == check)
    return "bit-identical" if c["holds"] else f"differs from {c['unit']} {c['first']} (max |diff| {c['max_abs']:.2g})"


def _varies(u: dict) -> str:
    """'varies from batch size N' or 'invariant', with the kernel's split choice per batch size where stored."""
    word = "invariant" if u["holds"] else f"varies from batch size {u['first']}"
    if "launch" in u:
        what, per = u["launch"]
        word += f" ({what} at batch 1..{len(per)}: {', '.join(map(str, per))})"
    return word


def answer(units: dict) -> list[str]:
    """The Answer's sentences."""
    lc = _longctx(units)
    out = []
    if lc:
        out.append(
            "Is an FP8 / FP4 KV cache safe at long context? Decoding one query against the cache, relative error of "
            f"the output against the exact attention of the same cache (safe < {SAFE:g}, collapsed > {COLLAPSE:g}): "
            + long_context_answer(lc) + ". One-level FP8 accumulation (Hopper FA3 before two-level) loses the "
            "haystack once the output holds a large value; two-level accumulation, or B200-like accumulation that "
            "adds c in fp32, removes it."
        )  # fmt: skip
    sdpa = [f"{n} batch {_cert_line(units.get(f'cert-{n}'), 'batch')}" for n in SDPA_TARGETS]
    splits = {n: units.get(f"fa1897-{n}") for n in SPLIT_TARGETS}
    sim = [f"{n} {_varies(u)}" for n, u in splits.items() if u]
    sims = ", ".join(sim) or NOT_MEASURED
    out.append(f"Batch invariance (one request's bits across batch sizes and compositions): {'; '.join(sdpa)}; in "
               f"simulation, {sims} (variable num_splits / chunking vs a fixed split; a split change that moves the "
               f"fp32 result by less than the bf16 output's rounding leaves the output's bits unchanged).")  # fmt: skip
    pd = {kv: units.get(f"vllm54035-{kv}") for kv in ("fp8", "bf16")}
    sim_pd = ", ".join(f"{kv} " + ("bit-identical" if u["holds"] else f"differs from KV length {u['first']} on")
                       for kv, u in pd.items() if u)  # fmt: skip
    real_pd = "; ".join(f"{n} {_cert_line(units.get(f'cert-{n}'), 'prefill-decode')}" for n in SDPA_TARGETS)
    out.append(f"Prefill vs decode: FA3 in simulation (decode kBlockN 96, prefill 192 at head dim 128 in FP8): "
               f"{sim_pd or NOT_MEASURED}; {real_pd}.")  # fmt: skip
    return out


PUBLISHED_KEYS = 128 * 1024  # the vLLM blog's needle-in-a-haystack length


def _verdict(matched: bool, agrees: bool) -> str:
    """A verdict only where our conditions match the published ones."""
    if not matched:
        return "unlike conditions: no verdict"
    return "agrees" if agrees else "disagrees"


def _published(units: dict) -> list[list[str]]:
    lc = _longctx(units)
    longest = max((n for _, n in lc), default=None)

    def err(var: str) -> float | None:
        rows = lc.get((var, longest)) if longest else None
        return _err(rows, "shared-mean", "late") if rows else None

    def at(var: str) -> str:
        return NOT_MEASURED if err(var) is None else _fmt(err(var))

    pd, pb = units.get("vllm54035-fp8"), units.get("vllm54035-bf16")
    fa = units.get("fa1897-sim-fa3")
    fx = units.get("fa1897-sim-fa3-fixed")
    kk = _keys(longest) if longest else ""
    cond = f"{kk if kk.endswith('keys') else kk + ' keys'}, shared-mean values, needle late (visited first)"
    same = longest == PUBLISHED_KEYS
    errs = {v: err(v) for v in ("bf16", "fp8-1level", "fp8-2level", "b200")}
    blog = None not in errs.values() and errs["fp8-1level"] > COLLAPSE and max(
        errs["bf16"], errs["fp8-2level"]) < SAFE  # fmt: skip
    return [
        ["128k needle-in-a-haystack, Hopper: bf16 / FA3 FP8 / FP8 two-level (vLLM blog, 2026-04-22)",
         "91% / 13% / 89%", f"relative error of O at {cond}: {at('bf16')} / {at('fp8-1level')} / {at('fp8-2level')}",
         _verdict(same and None not in errs.values(), blog)],
        ["B200 with FlashInfer did not need the fix (same blog)", "no drop", f"b200 model at {cond}: {at('b200')}",
         _verdict(same and errs["b200"] is not None, (errs["b200"] or 1.0) < SAFE)],
        ["vllm#54035: decode vs prefill logprobs differ from position 97 with FP8 KV (Qwen3-4B, H100); bf16 "
         "identical", "97; bf16 none",
         f"first divergent KV length {pd['first'] if pd and not pd['holds'] else 'none'} (FP8 sim, D=128)"
         if pd else NOT_MEASURED,
         _verdict(pd is not None and pb is not None, bool(pd and pb and pd["first"] == 97 and pb["holds"]))],
        ["FA#1897: FA3 not batch-invariant unless the split size is fixed", "varies; fixed: invariant",
         (f"varies from batch size {fa['first']}" if fa and not fa["holds"] else "invariant") + "; fixed: "
         + ("invariant" if fx and fx["holds"] else "varies") if fa and fx else NOT_MEASURED,
         _verdict(fa is not None and fx is not None, bool(fa and fx and not fa["holds"] and fx["holds"]))],
    ]  # fmt: skip


def _longctx_table(lc: dict) -> Table:
    kinds = ("shared-mean", "zero-mean", "captured")
    header = ["variant", "keys", *(f"{v} / {n}" for v in kinds for n in ("early", "late", "absent")),
              "cos(O, needle v) / exact", "cache vs bf16 cache", "s per cell"]  # fmt: skip
    rows = []
    for (var, n), cells in sorted(lc.items(), key=lambda kv: (list(VARIANTS).index(kv[0][0]), kv[0][1])):
        errs = [_fmt(_err(cells, v, nd)) for v in kinds for nd in ("early", "late", "absent")]
        late = next((r for r in cells if r["values"] == "shared-mean" and r["needle"] == "late"), cells[0])
        secs = sum(r["seconds"] for r in cells)
        cache = max((r.get("cache_err", 0.0) for r in cells if r["values"] == "shared-mean"), default=None)
        rows.append([var, str(n), *errs, f"{late['cos_needle']:.3f} / {late['cos_needle_exact']:.3f}", _fmt(cache),
                     f"{secs:.0f}"])  # fmt: skip
    return Table(header, rows)


def build_serving_report(folder: str | Path) -> dict:
    """Write report.md, report.html and summary.json of a serving study folder; returns the summary."""
    units = load_units(folder)
    lc = _longctx(units)
    page = Page("flashcheck study: serving numerics (KV caches, batch invariance, prefill vs decode)")
    page.add(Heading("Answer"), *(Text(s) for s in answer(units)))
    page.add(Heading("Published figures beside ours (a verdict at matched conditions only)"),
             Table(["published claim", "published", "ours", "verdict"], _published(units)), Text(CAVEAT))  # fmt: skip
    if lc:
        page.add(Heading("Long context: relative error of O against the exact attention of the same cache"),
                 Text("One query row per head (D and heads in serving.json), FA3 decode tiles, one split (one "
                      "accumulator across the cache). The needle's score is the haystack's largest + 6; FA3 visits "
                      "tiles from the last, so a late needle is accumulated first."), _longctx_table(lc))  # fmt: skip
    skipped = [f"{k}: {u['reason']}" for k, u in units.items() if u.get("status") == "skipped"]
    if skipped:
        page.add(Heading("Not measured"), Text("; ".join(skipped)))
    certs = [c for n in SDPA_TARGETS for c in units.get(f"cert-{n}", {}).get("certificates", [])]
    if certs:
        page.add(Heading("Consistency certificates of the SDPA CPU kernels"),
                 Table(["target", "check", "holds", "first", "max |diff|", "compared"],
                       [[c["target"], c["check"], "holds" if c["holds"] else "does not hold", cell(c["first"]),
                         f"{c['max_abs']:.3g}", cell(c["compared"])] for c in certs]))  # fmt: skip
    summary = {"answer": answer(units), "published": _published(units), "units": units,
               "seconds": sum(u.get("seconds", 0.0) for u in units.values())}  # fmt: skip
    write_report(folder, page, summary)
    return summary
