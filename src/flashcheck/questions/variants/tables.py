"""Tables and figures of the attention-variant questions (questions.variants.findings) and of the error model."""

from __future__ import annotations

import statistics
from pathlib import Path

from flashcheck.questions.variants.errormodel import draw as draw_error_model
from flashcheck.questions.variants.errormodel import evaluate, kinds_table
from flashcheck.questions.variants.errormodel import table as error_model_table
from flashcheck.questions.variants.findings import QUESTIONS, dead_row_table, err, records_of
from flashcheck.study.cases import Case, CaseRecord
from flashcheck.study.config import StudyConfig

NOTES = {
    "causal": "Kernel's own error (rel-L2 vs FP64 of the rounded inputs); causal masks are bottom-right aligned.",
    "gqa": "8 query heads sharing 8, 2 or 1 K/V heads (x axis: K/V heads), causal.",
    "padding": "Batch of 2 sequences padded on the left or right, left:0.25 / right:0.25 (element b of B pads "
    "0.25 (b + 1) / B of its keys: an eighth and a quarter); errors over the rows that see a key. The next table "
    "counts, per implementation, the cases whose rows that see no key hold zeros, NaN or other values.",
    "decoding": "Lq of 1 and 16 queries against a KV cache (x axis: its length), GQA 8:1, causal; splitkv merges "
    "its chunks through their log-sum-exp in the policy's merge format.",
    "backward": "dQ, dK, dV against FP64 autograd through the reference on the rounded inputs (the kernel's own).",
    "captured": "Q, K, V recorded at layers 0 and 5 of the bundled all-MiniLM-L6-v2 on the bundled text (D=32), "
    "against N(0, 1) inputs of the same shape (x axis: layer; N(0, 1) at 0).",
    "error_model": "Prediction by flashcheck.measure.predict (stage unit roundoffs, key tiles per row, D and the "
    "case's input statistics) over the measured kernel error, worst first; real CPU backends through the setting "
    "their kernel is equivalent to (measure.predict.backend_equivalent: derived, nothing fitted). Coefficients "
    "fitted on seed 0's simulated cases outside fp8 ('held out' no); the verdict counts the others. The model "
    "ignores range: where a format underflows it under-predicts (standard:baseline-fp8 rounds the normalised P, "
    "about 1/n_eff, below e4m3's normal range 2^-6, by 4-16x); with outlier inputs the sampled statistic f_p "
    "varies 10x over seeds while fa3-fp8's error varies 1.3x (its misses, both ways); a bf16 accumulator over "
    "hundreds of key tiles stagnates beyond the model's linear growth. Backward cases: the forward output's "
    "error is predicted; dQ, dK, dV errors are outside the model.",
    "error_model_kinds": "Prediction / measured per kind of case (its first unusual dimension) and per "
    "implementation: n, share within 2x, median ratio and 90th percentile of the fold error max(r, 1/r).",
}
X_AXIS = {"gqa": "kv_heads", "decoding": "lk", "production_decoding": "lk", "head_dim": "head_dim", "captured": "layer"}
X_LABEL = {
    "seq_len": "sequence length L [tokens]",
    "lk": "KV cache length Lk [tokens]",
    "kv_heads": "K/V heads (query heads share them)",
    "head_dim": "head dim D",
    "layer": "layer of the captured activations",
}
Y_LABEL = "kernel rel-L2 vs FP64 of the rounded inputs"
CASES = {"padding": "padding side and fraction, causal mask"}  # a crowded figure's categories (study.figures)


def _variant(c: Case, xname: str) -> str:
    """The case's name in a table or legend, without the dimension on the x axis."""
    parts = [c.method]
    if c.causal:
        parts.append("causal")
    if c.kv_heads and c.kv_heads != c.heads and xname != "kv_heads":
        parts.append(f"Hkv={c.kv_heads}")
    if c.padding != "none":
        parts.append(c.padding)
    if c.seq_len_k:
        parts.append(f"Lq={c.seq_len}")
    if c.distribution != "normal":
        parts.append(c.distribution)
    return " ".join(parts)


def _x(c: Case, question: str) -> int:
    name = X_AXIS.get(question, "seq_len")
    if name == "kv_heads":
        return c.kv_heads or c.heads  # 0: as many as the query heads
    return c.lk if name == "lk" else getattr(c, name)


OTHER_DIMS = ("seq_len", "head_dim", "block_q", "block_k", "splits", "layer", "batch", "heads", "algorithm")


def _groups(recs: list[CaseRecord], question: str, key: str) -> dict[tuple[str, int], list[float]]:
    """{(variant, x): one value per seed}: a dimension that varies in the question and is neither the x axis
    nor in the variant's name (a second length of the gqa sweep, the splits of decoding) is named in the
    variant, so that a group pools seeds only."""
    xname = X_AXIS.get(question, "seq_len")
    skip = {xname, "seq_len"} if xname == "lk" else {xname}  # decoding: Lq is in the name, the key length on x
    pooled: dict[tuple[str, int], list[Case]] = {}
    for r in recs:
        pooled.setdefault((_variant(r.case, xname), _x(r.case, question)), []).append(r.case)
    varying = [
        f for f in OTHER_DIMS if f not in skip and any(len({getattr(c, f) for c in cs}) > 1 for cs in pooled.values())
    ]
    out: dict[tuple[str, int], list[float]] = {}
    for r in recs:
        e = err(r, key)
        if e is not None:
            name = " ".join([_variant(r.case, xname), *(f"{f}={getattr(r.case, f)}" for f in varying)])
            out.setdefault((name, _x(r.case, question)), []).append(e)
    return out


def question_table(recs: list[CaseRecord], question: str) -> tuple[list[str], list[list[str]]]:
    """Mean kernel error (rel-L2 vs FP64 of the rounded inputs) per method variant and x over seeds, with its
    95% interval (reporting.verdicts.mean_interval)."""
    from flashcheck.reporting.verdicts import mean_interval

    xname = X_AXIS.get(question, "seq_len")
    grad = any(r.case.backward for r in recs)
    header = ["method", xname, "rel-L2 (kernel)", "95% interval"]
    header += [*(["dQ rel-L2", "dK rel-L2", "dV rel-L2"] if grad else []), "n"]
    rows = []
    for (variant, x), vals in sorted(_groups(recs, question, "rel_l2").items()):
        extra = []
        if grad:
            for g in ("dq", "dk", "dv"):
                gv = _groups(recs, question, f"{g}_rel_l2").get((variant, x), [])
                extra.append(f"{statistics.fmean(gv):.3g}" if gv else "-")
        est = mean_interval(vals)
        interval = f"[{est.low:.3g}, {est.high:.3g}]" if est.n >= 2 else "none (n < 2)"
        rows.append([variant, str(x), f"{est.value:.3g}", interval, *extra, str(len(vals))])
    return header, rows


def _draw(recs: list[CaseRecord], question: str, path: Path) -> Path | None:
    """Each variant's mean kernel error over seeds against the question's x, with its 95% interval."""
    from flashcheck.reporting.figures import matplotlib_available
    from flashcheck.study.figures import draw_groups

    groups = _groups(recs, question, "rel_l2")
    if not groups or not matplotlib_available():
        return None
    xname = X_AXIS.get(question, "seq_len")
    cases = CASES.get(question.removeprefix("production_"), "case")
    draw_groups(groups, path, x=X_LABEL.get(xname, xname), y=Y_LABEL, log_x=xname in ("seq_len", "lk"), cases=cases)
    return path


def dims_sections(
    config: StudyConfig, records: dict[str, CaseRecord], folder: Path
) -> tuple[list[tuple[str, list[str], list[list[str]]]], dict[str, Path], dict]:
    """(tables, figures, summary extras) for the questions of findings_dims.QUESTIONS and the error model."""
    tables, figures = [], {}
    have = {sw.question for sw in config.sweeps}
    for q in (q for q in QUESTIONS if q in have):
        recs = records_of(config, q, records)
        tables.append((q, *question_table(recs, q)))
        if q.endswith("padding"):
            tables.append((f"{q}_dead_rows", ["method", "zeros", "NaN", "other"],
                           dead_row_table(recs)))  # fmt: skip
        fig = _draw(recs, q, folder / "figures" / f"{q}.png")
        if fig is not None:
            figures[q] = fig
    ev = evaluate(records)
    extras = {}
    if ev["n"]:
        tables.append(("error_model", *error_model_table(ev)))
        tables.append(("error_model_kinds", *kinds_table(ev)))
        fig = draw_error_model(ev, folder / "figures")
        if fig is not None:
            figures["error_model"] = fig
        keep = ("n", "median_ratio", "p90_fold", "within_2x", "held_out", "kinds", "not_modelled", "coefficients",
                "training")  # fmt: skip
        extras["error_model"] = {k: ev[k] for k in keep}
    return tables, figures, extras
