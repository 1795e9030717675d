"""The P-cast with an attention sink (arXiv 2606.06521) as the modern study judges it, at two settings: the study's
own ("sink:DELTA": one sink key scored DELTA, each row's other scores N(0, |q|^2 / D)) and the paper's ("sink4:DELTA":
4 sink tokens scored DELTA + N(0, 1), the other scores i.i.d. N(0, 1)). Per setting and sink score: each fix's MSE
gain against the paper's 3-10x, and the collapsed fraction we measure against the paper's closed form."""

from __future__ import annotations

from flashcheck.core.inputs import sink_delta, sink_tokens
from flashcheck.measure.collapse import expected_max, paper_form
from flashcheck.questions.modern.presets import P_FP8, SINK_METHODS
from flashcheck.reporting.verdicts import Estimate, Verdict, band, compare, ratio_interval
from flashcheck.study.points import NOT_MEASURED, Point, finding, paired, ratio_text

PUBLISHED = (
    "arXiv 2606.06521: 3-10x lower MSE at moderate sink strengths from reverse KV order or S = 2^8, the two fixes "
    "saturating to the same floor"
)
PAPER_FORM = "arXiv 2606.06521: a fraction Phi(Delta + delta_k - 6.93 - ln S) of non-sink P values underflows e4m3"
MODERATE = (0.01, 0.6)  # a "moderate" sink (the paper gives no number): the closed form collapses 1% to 60% of P
COLLAPSE_BAND = (0.9, 1.1)  # "predicts": measured / closed form within 10%
SINK_FIXES = (("reverse", SINK_METHODS[1], "reverse KV order"), ("static_scale", SINK_METHODS[2], "S = 2^8"))
# sink tokens -> (the findings' id prefix, the setting in words before and after the score, what refines the paper's
# closed form there)
SETTINGS = {
    1: ("modern_sink", ("", ""), "averaged over the rows' score spreads"),
    4: ("modern_sink4", (" of 4 tokens at the paper's setting", " + N(0, 1), i.i.d. scores"),
        "averaged over the 4 sinks' maximum, 3 of them counted as non-sink"),
}  # fmt: skip
SINK_IDS = tuple(f"{prefix}_" for prefix, _, _ in SETTINGS.values())  # every sink finding's id starts with one


def mse_ratio(points: list[Point], a: str, b: str) -> Estimate | None:
    """MSE of a / MSE of b from their relative L2 errors on the same inputs."""
    num, den = paired(points, a, b)
    return ratio_interval([x * x for x in num], [x * x for x in den]) if num else None


def _strength(delta: float, n_sinks: int) -> tuple[float, str]:
    phi = paper_form(delta, n_sinks)
    return phi, "moderate" if MODERATE[0] <= phi <= MODERATE[1] else "weak" if phi < MODERATE[0] else "strong"


def sink_findings(points: list[Point], records: dict | None = None) -> list[dict]:
    """Per setting (one sink key, four sink tokens) and sink score: each fix's MSE gain (judged against the paper's
    3-10x at moderate scores, else only "it lowers the MSE") and the collapsed fraction (record stats p_collapse)
    against the paper's closed form."""
    out = []
    for n_sinks, (prefix, (where, spread), _) in SETTINGS.items():
        mine = [p for p in points if sink_tokens(p.distribution) == n_sinks]
        for delta in sorted({d for p in mine if (d := sink_delta(p.distribution)) is not None}):
            at = [p for p in mine if sink_delta(p.distribution) == delta]
            phi, kind = _strength(delta, n_sinks)
            said = f"a {kind} sink{where} (score {delta:g}{spread}: the closed form collapses {phi:.1%} of P)"
            for key, method, what in SINK_FIXES:
                fid = f"{prefix}_{key}_d{delta:g}"
                out.append(_fix_finding(fid, said, kind, what, mse_ratio(at, P_FP8, method)))
            out.append(_collapse_finding(delta, n_sinks, records or {}))
    return out


def _fix_finding(fid: str, said: str, kind: str, what: str, est: Estimate | None) -> dict:
    if kind == "moderate":
        claim = f"with {said}, {what} lowers the P-cast MSE by the paper's 3-10x"
    else:
        claim = f"with {said}, outside the paper's moderate range, {what} lowers the P-cast MSE"
    if est is None or est.n == 0:
        return finding(fid, claim, NOT_MEASURED, None, paper=PUBLISHED, section="modern_sink")
    verdict = band(est, 3.0, 10.0) if kind == "moderate" else compare(est, above=True)
    measured = f"MSE of forward S=1 / {what}: {ratio_text(est)}"
    return finding(fid, claim, measured, verdict, paper=PUBLISHED, section="modern_sink")


def _collapse_finding(delta: float, n_sinks: int, records: dict) -> dict:
    """The measured collapsed fraction against the paper's closed form at this setting (delta_k = 0 for one sink key
    scored Delta exactly; E[max of 4 normals] = 1.03 for the paper's four), and against the form refined for these
    inputs (record stats p_collapse_form, where the records have it) in the measured text."""
    prefix, _, refined = SETTINGS[n_sinks]
    by_input = {  # one per input set
        r.case.input_key: r.stats for r in sorted(records.values(), key=lambda r: r.case.seed)
        if r.case.method == P_FP8 and sink_delta(r.case.distribution) == delta
        and sink_tokens(r.case.distribution) == n_sinks and "p_collapse" in (r.stats or {})
    }  # fmt: skip
    phi = paper_form(delta, n_sinks)
    if n_sinks == 1:
        setting = f"score {delta:g}, forward order, S = 1, delta_k = 0 for one sink key: {phi:.3g}"
    else:
        setting = (
            f"the paper's setting: {n_sinks} sink tokens scored {delta:g} + N(0, 1), forward order, S = 1, "
            f"delta_k = {expected_max(n_sinks):.3g}, the expected maximum of the {n_sinks}: {phi:.3g}"
        )
    claim = (
        "2606.06521's closed form Phi(Delta + delta_k - 6.93 - ln S) predicts the collapsed fraction we measure "
        f"within 10% ({setting})"
    )
    fid = f"{prefix}_collapse_d{delta:g}"
    if not by_input or phi <= 0:
        return finding(fid, claim, NOT_MEASURED, None, paper=PAPER_FORM, section="modern_sink")
    vals = [s["p_collapse"] for s in by_input.values()]
    est = ratio_interval(vals, [phi] * len(vals))
    forms = [(s["p_collapse"], s["p_collapse_form"]) for s in by_input.values() if s.get("p_collapse_form", 0) > 0]
    fine = ""
    if forms:
        est2 = ratio_interval([a for a, _ in forms], [b for _, b in forms])
        fine = f"; measured / the form {refined}: {ratio_text(est2)}"
    measured = f"{sum(vals) / len(vals):.3g} of non-sink P flushed{fine}; measured / closed form: {ratio_text(est)}"
    verdict: Verdict = band(est, *COLLAPSE_BAND)
    return finding(fid, claim, measured, verdict, paper=PAPER_FORM, section="modern_sink")
