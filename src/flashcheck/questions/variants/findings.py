"""Verdicts on the attention users run: causal masks, GQA, padding, decoding, head dims, the backward pass and
captured activations (the quick/full questions, and the production preset's), each from reporting.verdicts.

Errors here are the kernel's own: relative L2 against FP64 of the method's rounded inputs (errors_rounded),
over the rows that see a key. Paired values share inputs (same seed and shape), so ratios are paired."""

from __future__ import annotations

import math
from collections.abc import Callable

from flashcheck.reporting.verdicts import Verdict, compare, every, ratio_interval, trend
from flashcheck.study.cases import Case, CaseRecord, expand_sweep
from flashcheck.study.config import StudyConfig

MIXED, PAPER = "flash:bf16-mixed", "flash:bf16"
OUTCOMES = ("zeros", "nan", "other")


def _finding(fid: str, claim: str, measured: str, v: Verdict, section: str) -> dict:
    """The summary.json form of a finding (as questions.paper.findings writes them)."""
    est = v.estimate
    finite = est is not None and est.n >= 2 and math.isfinite(est.low)
    return {
        "id": fid,
        "claim": claim,
        "measured": measured,
        "status": v.status,
        "holds": v.holds,
        "rule": v.rule,
        "reason": v.reason,
        "estimate": est.value if est is not None else None,
        "interval": [est.low, est.high] if finite else None,
        "n": est.n if est is not None else 0,
        "paper": None,
        "section": section,
    }


def records_of(config: StudyConfig, question: str, records: dict[str, CaseRecord]) -> list[CaseRecord]:
    """The ok records of the sweep named `question` (none when the config has no such sweep)."""
    out = []
    for sw in config.sweeps:
        if sw.question == question:
            out += [records[c.case_id] for c in expand_sweep(sw) if c.case_id in records]
    return [r for r in out if r.status == "ok"]


def err(r: CaseRecord, key: str = "rel_l2") -> float | None:
    return r.errors_rounded.get(key)


def paired(
    recs: list[CaseRecord], num: Callable[[Case], bool], den: Callable[[Case], bool], key: Callable[[Case], tuple]
) -> tuple[list[float], list[float]]:
    """Errors of the `num` cases and of the `den` case with the same key(case), pair by pair."""
    by = {key(r.case): r for r in recs if den(r.case)}
    a, b = [], []
    for r in recs:
        other = by.get(key(r.case)) if num(r.case) else None
        if other is not None and err(r) is not None and err(other) is not None:
            a.append(err(r))
            b.append(err(other))
    return a, b


def _inputs(c: Case) -> tuple:
    return (c.input_key, c.block_k)


def _method_is(method: str) -> Callable[[Case], bool]:
    return lambda c: c.method == method


def _ratio_finding(fid, claim, recs, num, den, key, section, *, above=True, margin=0.0) -> dict:
    a, b = paired(recs, num, den, key)
    est = ratio_interval(a, b)
    v = compare(est, above=above, margin=margin)
    return _finding(fid, claim, f"{est.text()} (paired ratio of kernel errors)", v, section)


def _baseline_of(method: str) -> str:
    from flashcheck.measure.method import baseline_name

    return baseline_name(method)


def flash_vs_baseline(fid: str, recs: list[CaseRecord], method: str, section: str, where: str) -> dict:
    """`method` / its baseline on the same inputs: claim > 1."""
    claim = f"{where}: {method} deviates more than its baseline {_baseline_of(method)}"
    base = _baseline_of(method)
    return _ratio_finding(fid, claim, recs, _method_is(method), _method_is(base), lambda c: c.input_key, section)


def causal_findings(recs: list[CaseRecord], section: str = "causal") -> list[dict]:
    """A causal row sees fewer keys (L/2 on average): fewer tiles, so less of Flash's accumulated error."""

    def key(c):
        return (c.method, c.seq_len, c.seed, c.block_k)

    causal = [r for r in recs if r.case.causal]
    return [
        _ratio_finding(
            f"{section}_less_error",
            "A causal mask lowers flash:bf16's kernel error (each row accumulates over fewer key tiles)",
            recs,
            lambda c: c.causal and c.method == PAPER,
            lambda c: not c.causal and c.method == PAPER,
            key,
            section,
            above=False,
        ),
        flash_vs_baseline(f"{section}_flash_vs_baseline", causal, PAPER, section, "Causal"),
    ]


def gqa_findings(recs: list[CaseRecord], section: str = "gqa") -> list[dict]:
    """Sharing K/V heads changes which keys a head sees, not the arithmetic of a row."""
    heads = max((r.case.heads for r in recs), default=0)
    mha = [h for h in (0, heads)]
    return [
        _ratio_finding(
            f"{section}_mqa_more_error",
            "MQA (one K/V head) gives Flash (bf16-mixed) more kernel error than multi-head attention",
            recs,
            lambda c: c.kv_heads == 1 and c.method == MIXED,
            lambda c: c.kv_heads in mha and c.method == MIXED,
            lambda c: (c.seq_len, c.seed, c.causal),
            section,
            margin=0.1,
        ),
        flash_vs_baseline(f"{section}_flash_vs_baseline", [r for r in recs if r.case.kv_heads == 1], MIXED, section,
                          "MQA"),
    ]  # fmt: skip


def dead_row_table(recs: list[CaseRecord]) -> list[list[str]]:
    """Per method: how many padded cases gave zeros / NaN / other values on rows with no visible key."""
    by: dict[str, dict[str, int]] = {}
    for r in recs:
        if r.dead_rows is not None:
            by.setdefault(r.case.method, dict.fromkeys(OUTCOMES, 0))[r.dead_rows] += 1
    return [[m, *(str(c[o]) for o in OUTCOMES)] for m, c in sorted(by.items())]


def padding_findings(recs: list[CaseRecord], section: str = "padding") -> list[dict]:
    """What each implementation returns on rows with no visible key, and the error on the other rows."""
    outs = [r.dead_rows for r in recs if r.dead_rows is not None]
    nan_methods = sorted({r.case.method for r in recs if r.dead_rows == "nan"})
    counts = "; ".join(f"{m}: {z} zeros, {n} NaN, {o} other" for m, z, n, o in dead_row_table(recs))
    v = every([o == "zeros" for o in outs], "zeros on every row with no visible key")
    measured = f"{counts or 'no padded case'}" + (f"; NaN from {', '.join(nan_methods)}" if nan_methods else "")
    return [
        _finding(
            f"{section}_dead_rows_zero",
            "Every implementation returns zeros (not NaN) on a padded row with no visible key",
            measured,
            v,
            section,
        ),
        flash_vs_baseline(f"{section}_flash_vs_baseline", recs, MIXED, section, "Padded batches (real rows only)"),
    ]


def decoding_findings(recs: list[CaseRecord], section: str = "decoding") -> list[dict]:
    """Split-KV's merge vs one flash pass, and the error's growth with the KV cache."""
    split = next((r.case.method for r in recs if r.case.kernel == "splitkv"), None)
    out = []
    if split is not None:
        out.append(
            _ratio_finding(
                f"{section}_splitkv_more_error",
                f"Split-KV decoding ({split}, merge in its own format) deviates more than one flash pass",
                recs,
                _method_is(split),
                _method_is(MIXED),
                lambda c: c.input_key,
                section,
            )
        )
    pts = [(r.case.lk, err(r)) for r in recs if r.case.method == MIXED and err(r)]
    v = trend([x for x, _ in pts], [y for _, y in pts])
    lks = sorted({x for x, _ in pts})
    measured = f"Lk {lks[0]}..{lks[-1]}: {v.reason}" if lks else "not measured"
    claim = "Decoding (Lq 1 or 16): Flash's kernel error grows with the KV-cache length"
    out.append(_finding(f"{section}_grows_with_kv", claim, measured, v, section))
    return out


def head_dim_findings(recs: list[CaseRecord], section: str = "head_dim") -> list[dict]:
    """The Flash/Baseline ratio and the error across head dims."""
    pts = [(r.case.head_dim, err(r)) for r in recs if r.case.method == PAPER and err(r)]
    v = trend([x for x, _ in pts], [y for _, y in pts])
    return [
        _finding(
            f"{section}_grows",
            "flash:bf16's kernel error grows with the head dim",
            f"D {sorted({x for x, _ in pts})}: {v.reason}",
            v,
            section,
        ),
        flash_vs_baseline(
            f"{section}_flash_vs_baseline_d128", [r for r in recs if r.case.head_dim == 128], PAPER, section, "D=128"
        ),
    ]


def backward_findings(recs: list[CaseRecord], section: str = "backward") -> list[dict]:
    """dQ against the forward output, and Flash's dQ against the standard backward."""
    out = []
    fwd, dq = [], []
    for r in recs:
        if r.case.method == MIXED and err(r) and err(r, "dq_rel_l2"):
            fwd.append(err(r))
            dq.append(err(r, "dq_rel_l2"))
    est = ratio_interval(dq, fwd)
    out.append(
        _finding(
            f"{section}_dq_exceeds_forward",
            "Flash (bf16-mixed): the dQ error exceeds the forward output's error (relative L2, kernel's own)",
            f"dQ / O {est.text()}",
            compare(est),
            section,
        )
    )
    base = _baseline_of(MIXED)
    a, b = [], []
    by = {r.case.input_key: r for r in recs if r.case.method == base}
    for r in recs:
        o = by.get(r.case.input_key) if r.case.method == MIXED else None
        if o is not None and err(r, "dq_rel_l2") and err(o, "dq_rel_l2"):
            a.append(err(r, "dq_rel_l2"))
            b.append(err(o, "dq_rel_l2"))
    est2 = ratio_interval(a, b)
    claim = f"Flash's dQ (FA2 backward, {MIXED}) deviates more than the standard backward's ({base})"
    out.append(_finding(f"{section}_flash_vs_baseline_dq", claim, f"{est2.text()}", compare(est2), section))
    return out


def captured_findings(recs: list[CaseRecord], section: str = "captured") -> list[dict]:
    """Real activations against N(0, 1) inputs: the Flash/Baseline ratio, per layer and overall."""
    from flashcheck.core.inputs import is_captured

    method = PAPER if any(r.case.method == PAPER for r in recs) else MIXED
    base = _baseline_of(method)

    def ratios(pick):
        a, b = paired([r for r in recs if pick(r.case)], _method_is(method), _method_is(base), lambda c: c.input_key)
        return a, b

    real = ratios(lambda c: is_captured(c.distribution))
    gauss = ratios(lambda c: c.distribution == "normal")
    est_real, est_gauss = ratio_interval(*real), ratio_interval(*gauss)
    per_layer = []
    for layer in sorted({r.case.layer for r in recs if is_captured(r.case.distribution)}):
        e = ratio_interval(*ratios(lambda c, la=layer: is_captured(c.distribution) and c.layer == la))
        per_layer.append(f"layer {layer} {e.value:.3g}x")
    # the ratio of ratios: each captured Flash/Baseline ratio over the N(0, 1) one of the same seed
    gauss_by_seed = {}
    for r in recs:
        o = next((x for x in recs if x.case.input_key == r.case.input_key and x.case.method == base), None)
        if r.case.distribution == "normal" and r.case.method == method and o is not None and err(o):
            gauss_by_seed[r.case.seed] = err(r) / err(o)
    num, den = [], []
    for r in recs:
        o = next((x for x in recs if x.case.input_key == r.case.input_key and x.case.method == base), None)
        g = gauss_by_seed.get(r.case.seed)
        if is_captured(r.case.distribution) and r.case.method == method and o is not None and g and err(o):
            num.append(err(r) / err(o))
            den.append(g)
    est = ratio_interval(num, den)
    measured = (
        f"{method}/{base}: real {est_real.text()}, N(0,1) {est_gauss.text()}; {', '.join(per_layer)}; "
        f"real over Gaussian {est.text()}"
    )
    claim = f"Real activations (captured) raise the {method}/{base} ratio above that of N(0, 1) inputs"
    return [_finding(f"{section}_deviates_more", claim, measured, compare(est, margin=0.1), section)]


def prefill_findings(recs: list[CaseRecord], section: str = "production_prefill") -> list[dict]:
    """Production prefill: Flash vs its baseline, SDPA's flash kernel vs its math path, growth with L."""
    out = [flash_vs_baseline(f"{section}_flash_vs_baseline", recs, MIXED, section, "Causal GQA 8:1, D=128")]
    if any(r.case.method == "sdpa-flash:bf16" for r in recs):
        out.append(
            _ratio_finding(
                f"{section}_sdpa_flash_vs_math",
                "SDPA's CPU flash kernel (bf16) deviates more than SDPA's math path (bf16)",
                recs,
                _method_is("sdpa-flash:bf16"),
                _method_is("sdpa-math:bf16"),
                lambda c: c.input_key,
                section,
            )
        )
    pts = [(r.case.seq_len, err(r)) for r in recs if r.case.method == MIXED and err(r)]
    v = trend([x for x, _ in pts], [y for _, y in pts])
    out.append(_finding(f"{section}_grows", "Flash's kernel error grows with L", v.reason, v, section))
    return out


QUESTIONS: dict[str, Callable[..., list[dict]]] = {
    "production_prefill": prefill_findings,
    "production_decoding": decoding_findings,
    "production_backward": backward_findings,
    "production_captured": captured_findings,
    "causal": causal_findings,
    "gqa": gqa_findings,
    "padding": padding_findings,
    "decoding": decoding_findings,
    "head_dim": head_dim_findings,
    "backward": backward_findings,
    "captured": captured_findings,
}


def dims_findings(config: StudyConfig, records: dict[str, CaseRecord]) -> list[dict]:
    """The verdicts of every question of QUESTIONS the config has (production's first), then the error model's."""
    from flashcheck.questions.variants.errormodel import evaluate, measured_text

    have = {sw.question for sw in config.sweeps}
    out = []
    for q, fn in QUESTIONS.items():
        if q in have:
            out += fn(records_of(config, q, records), section=q)
    ev = evaluate(records)
    if ev["n"]:
        measured = measured_text(ev)
        claim = (
            "The error model (measure.predict) predicts the kernel's error within 2x for at least 90% of the cases "
            "it was not fitted on (simulators and real CPU backends)"
        )
        out.append(_finding("error_model_within_2x", claim, measured, ev["verdict"], "error_model"))
    return out
