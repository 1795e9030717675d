"""arXiv 2510.04212's failure mode: with tied softmax maxima (P entries exactly 1), delta = rowsum(dO * O)
from a bf16-rounded O biases the gradient consistently, so its error accumulates over steps instead of
cancelling. Measured on one attention layer trained along the exact (FP64) trajectory: at every step the
gradient of each variant is compared with the FP64 one at the same parameters.

Trained: Q [B, H, L, D] and V; K is fixed and holds `tied_keys` identical rows that every query favours,
so ties persist. Loss 0.5 * ||O - T||^2 with a fixed target T: dO = O - T is correlated over steps, as in
training. Metrics per variant, from the delta errors e [T steps, B, H, L rows]:
- bias ratio |mean(e)| / rms(e) (0 for errors that cancel, 1 for a constant error);
- sign consistency mean_i |mean_t sign(e_t,i)|: per row i, how often its error keeps one sign over the steps
  (about sqrt(2 / (pi T)) for random signs, 1 always the same sign). Per row, because each row of Q is its own
  parameter here: its error accumulates when that row's error keeps its sign, whatever the other rows do
  (rows of opposite signs would cancel in a mean over rows, yet each still drifts);
- dQ bias growth G = ||sum_t e_t|| / sqrt(sum_t ||e_t||^2) of the dQ error (about 1 for errors that cancel,
  up to sqrt(T) for errors of one sign).
The thresholds of the verdicts are not chosen: they are the 99th percentile over seeds of the same statistic
on the untied control (normal inputs, same variants), and each verdict compares the tied runs' 95% interval
over seeds (geometric mean, t interval on logs) with it (`reporting.verdicts.compare`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from flashcheck.core.fileio import write_atomic
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.numerics import Format, parse_policy, round_to
from flashcheck.kernels import flash_attention, reference_attention
from flashcheck.reporting import Bullets, Heading, Page, Table, Text, write_report
from flashcheck.training.train_report import verdict_bullets

VARIANTS = {
    "bf16-mixed": {"policy": "bf16-mixed"},
    "delta-fp32": {"policy": "bf16-mixed,delta=fp32"},
    "max-adjust": {"policy": "bf16-mixed", "tie_beta": 2.0},
}


def _grads(fn, q, k, v, target):
    """(output, dQ, dV) of 0.5 * ||fn(q, k, v) - target||^2."""
    q, v = q.detach().requires_grad_(True), v.detach().requires_grad_(True)
    out = fn(q, k, v).double()
    (0.5 * ((out - target) ** 2).sum()).backward()
    return out.detach(), q.grad.double(), v.grad.double()


def run_tied_max(
    *,
    steps: int = 40,
    seq_len: int = 128,
    heads: int = 4,
    head_dim: int = 32,
    tied_keys: int = 4,
    lr: float = 0.02,
    distribution: str = "tied",
    seed: int = 0,
    beta: float = 2.0,
    on_step: Callable[[int], None] | None = None,
) -> dict:
    """Train Q and V along the FP64 trajectory; per variant, the error delta's rounding adds at each step.

    One key block (block_k = seq_len), so ties are within the tile the kernel inspects."""
    spec = InputSpec(
        batch=1,
        heads=heads,
        seq_len=seq_len,
        head_dim=head_dim,
        distribution=distribution,
        seed=seed,
        tied_keys=tied_keys,
    )
    q, k, v = make_qkv(spec)
    target = 0.1 * torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 99), dtype=torch.float64)
    variants = {n: {**kw, "tie_beta": beta} if "tie_beta" in kw else dict(kw) for n, kw in VARIANTS.items()}
    rec = _record(q, k, v, target, variants, steps=steps, lr=lr, seq_len=seq_len, on_step=on_step)
    config = {
        "steps": steps,
        "seq_len": seq_len,
        "heads": heads,
        "head_dim": head_dim,
        "tied_keys": tied_keys,
        "lr": lr,
        "distribution": distribution,
        "seed": seed,
        "beta": beta,
    }
    return {"config": config, "variants": {name: _variant_metrics(r) for name, r in rec.items()}}


def _record(q, k, v, target, variants: dict, *, steps: int, lr: float, seq_len: int, on_step=None) -> dict:
    """Per variant, per step: the delta error [B, H, L] and the dQ error that rounding O for delta adds."""
    rec = {n: {"delta": [], "dq": []} for n in variants}
    for step in range(1, steps + 1):
        _, gq, gv = _grads(reference_attention, q, k, v, target)
        for name, kw in variants.items():
            pol = parse_policy(kw["policy"])

            def run(a, b, c, pol=pol, kw=kw):
                return flash_attention(a, b, c, block_q=seq_len, block_k=seq_len, **{**kw, "policy": pol})

            out, dq_low, _ = _grads(run, q, k, v, target)
            fp32_delta = pol.replace(delta=Format.FP32)
            _, dq_fp32, _ = _grads(lambda a, b, c, p=fp32_delta: run(a, b, c, pol=p), q, k, v, target)
            with torch.no_grad():  # the O that delta sees (the accumulator rounded to the delta stage), against
                o_delta = run(q, k, v, pol=pol.replace(output=pol.delta)).double()  # exact O of the same
                exact = reference_attention(*(round_to(t, pol.input) for t in (q, k, v)))  # rounded inputs
            do = out - target
            rec[name]["delta"].append((do * (o_delta - exact)).sum(-1))
            rec[name]["dq"].append(dq_low - dq_fp32)  # what rounding O for delta adds to dQ
        q, v = q - lr * gq, v - lr * gv
        if on_step is not None:
            on_step(step)
    return rec


def sign_consistency(d: torch.Tensor) -> float:
    """d [T, ...rows]: mean over rows of |mean over steps of sign(d_t,row)| (0 random signs, 1 one sign)."""
    return float(torch.sign(d.flatten(1)).mean(0).abs().mean())


def _variant_metrics(r: dict) -> dict:
    d, e = torch.stack(r["delta"]), torch.stack(r["dq"])
    rms = float(d.pow(2).mean().sqrt())
    return {
        "delta_mean_error": float(d.mean()),
        "delta_abs_mean_error": abs(float(d.mean())),
        "delta_bias_ratio": abs(float(d.mean())) / rms if rms > 0 else 0.0,
        "delta_sign_consistency": sign_consistency(d),
        "delta_rms_error": rms,
        **_bias(e),
    }


def _bias(e: torch.Tensor) -> dict:
    """e [T, ...]: the per-step errors of dQ."""
    total = torch.linalg.vector_norm(e.sum(0))
    each = torch.sqrt((e.flatten(1) ** 2).sum())
    return {
        "dq_bias_growth": float(total / each) if each > 0 else 0.0,
        "max_growth": math.sqrt(e.shape[0]),
        "dq_mean_abs_error": float(e.abs().mean()),
    }


PERCENTILE = 99  # a threshold is this percentile of the untied control's values over seeds


def tied_max_report(
    out: str | Path, on_progress: Callable[[int, int, str], None] | None = None, *, seeds: int = 3, **kw
) -> dict:
    """Run the tied-maxima experiment and its untied control for seeds 0..seeds-1 (keyword arguments as
    run_tied_max); write summary.json and the report. on_progress(steps done, steps of all runs, note)."""
    for name, value in (("seeds", seeds), ("steps", kw.get("steps", 40))):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed; it must be a positive integer")
    from flashcheck.core.lock import folder_lock

    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r} is not writable: {exc.strerror or exc}") from None
    with folder_lock(out, "train-study"):  # another run on `out` is refused at once, naming this one
        return _tied_max_locked(out, on_progress, seeds, kw)


def _tied_max_locked(out: Path, on_progress: Callable[[int, int, str], None] | None, seeds: int, kw: dict) -> dict:
    steps = kw.get("steps", 40)
    runs: dict[str, list[dict]] = {"tied": [], "control": []}
    for i, (label, dist) in enumerate(
        (r, d) for r, d in (("tied", "tied"), ("control", "normal")) for _ in range(seeds)
    ):
        seed, done = i % seeds, i * steps
        note = f"{'tied' if label == 'tied' else 'untied control'} seed {seed}"
        step_fn = on_progress and (lambda k, done=done, note=note: on_progress(done + k, 2 * seeds * steps, note))
        runs[label].append(run_tied_max(**{**kw, "distribution": dist, "seed": seed}, on_step=step_fn))
    thresholds = _thresholds(runs["control"])
    summary = {
        "study": "tied-max",
        "seeds": seeds,
        "config": runs["tied"][0]["config"] | {"seed": list(range(seeds))},
        "tied": runs["tied"],
        "control": runs["control"],
        "thresholds": thresholds,
        "findings": _findings(runs, thresholds),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    _write_report(summary, out)
    return summary


def _values(runs: list[dict], variant: str, metric: str) -> list[float]:
    return [r["variants"][variant][metric] for r in runs]


def _thresholds(control: list[dict]) -> dict:
    """{metric: {value, from}}: the PERCENTILE-th percentile over seeds of the untied control's bf16-mixed
    variant (numpy's linear interpolation: with few seeds it is close to the largest value)."""
    import numpy as np

    out = {}
    for metric in ("delta_bias_ratio", "delta_sign_consistency", "delta_abs_mean_error"):
        vals = _values(control, "bf16-mixed", metric)
        out[metric] = {
            "value": float(np.percentile(vals, PERCENTILE)),
            "from": f"{PERCENTILE}th percentile of the untied control (bf16-mixed) over {len(vals)} seeds",
            "control_values": vals,
        }
    return out


# id, variant, metric, claimed side (True: above the control's threshold), claim
CLAIMS = (
    (
        "tied_max_bias",
        "bf16-mixed",
        "delta_bias_ratio",
        True,
        "With tied maxima, rounding O to bf16 biases delta = rowsum(dO * O): |mean|/rms of its error is above the "
        "untied control's",
    ),
    (
        "tied_max_sign",
        "bf16-mixed",
        "delta_sign_consistency",
        True,
        "With tied maxima, each row's delta error keeps its sign over the steps more than without ties",
    ),
    (
        "delta_fp32_fix",
        "delta-fp32",
        "delta_abs_mean_error",
        False,
        "Computing O in fp32 for delta brings the systematic delta error below what bf16 gives without ties",
    ),
    (
        "max_adjust_fix",
        "max-adjust",
        "delta_abs_mean_error",
        False,
        "Subtracting beta * max on tied rows brings the systematic delta error below what bf16 gives without ties",
    ),
)
PAPER = {
    "tied_max_bias": "biased rounding of delta makes the dW error accumulate; loss explodes (arXiv 2510.04212)",
    "tied_max_sign": "the error has one sign, so it accumulates (arXiv 2510.04212)",
    "delta_fp32_fix": "removes the failure",
    "max_adjust_fix": "removes the failure (beta 2-7)",
}


def geometric_interval(values: list[float]):
    """Geometric mean over seeds with a t interval on the logs (every statistic here is positive and spreads
    by factors between seeds), as reporting.verdicts.ratio_interval over a denominator of ones."""
    from flashcheck.reporting.verdicts import ratio_interval

    est = ratio_interval(values, [1.0] * len(values))
    return dataclasses.replace(est, method="geometric mean over seeds, t interval on logs")


def _findings(runs: dict, thresholds: dict) -> list[dict]:
    """Each claim: the tied runs' 95% interval over seeds (geometric) against the control-derived threshold."""
    from flashcheck.reporting.verdicts import compare

    out = []
    for fid, variant, metric, above, claim in CLAIMS:
        thr = thresholds[metric]["value"]
        est = geometric_interval(_values(runs["tied"], variant, metric))
        v = compare(est, above=above, threshold=thr)
        out.append(
            {
                "id": fid,
                "claim": claim,
                "measured": f"{metric} of {variant} on tied inputs {est.text()}; threshold {thr:.3g} "
                f"({thresholds[metric]['from']})",
                "status": v.status,
                "holds": v.holds,
                "verdict": v.to_dict(),
                "threshold": thresholds[metric],
                "paper": PAPER[fid],
            }
        )
    return out


def _rows(summary: dict) -> list[list[str]]:
    """Per inputs and variant: each metric's mean over seeds and its range."""
    rows = []
    for label in ("tied", "control"):
        for name in VARIANTS:
            cells = [label if label == "tied" else "untied control", name]
            for metric, fmt in (
                ("delta_mean_error", "+.2e"),
                ("delta_bias_ratio", ".2f"),
                ("delta_sign_consistency", ".2f"),
                ("dq_bias_growth", ".2f"),
                ("dq_mean_abs_error", ".2e"),
            ):
                vals = _values(summary[label], name, metric)
                cells.append(f"{sum(vals) / len(vals):{fmt}} ({min(vals):{fmt}} .. {max(vals):{fmt}})")
            rows.append(cells)
    return rows


def _write_report(summary: dict, out: Path) -> None:
    """report.md and report.html (reporting.Page): thresholds, verdicts, the per-variant table."""
    page = Page("flashcheck train-study tied-max (arXiv 2510.04212)")
    cfg = summary["config"]
    thr = [
        (metric, None, f"{t['value']:.3g}: {t['from']} (values {', '.join(f'{v:.3g}' for v in t['control_values'])})")
        for metric, t in summary["thresholds"].items()
    ]
    header = ["inputs", "variant", "delta mean error", "delta |mean|/rms", "delta sign consistency (per row)"]
    header += ["dQ error growth", "dQ error from bf16 O in delta"]
    page.add(
        Text(
            f"{summary['seeds']} seeds, {cfg['steps']} steps, L={cfg['seq_len']}, {cfg['heads']} heads of "
            f"{cfg['head_dim']}, {cfg['tied_keys']} tied keys, lr {cfg['lr']:g}, beta {cfg['beta']:g}. Table cells: "
            f"mean over seeds (smallest .. largest); dQ growth at most {math.sqrt(cfg['steps']):.2f} (sqrt of steps)."
        ),
        Heading("Thresholds (from the untied control, not chosen)"),
        Bullets(thr, with_verdict=False),
        Heading("Verdicts"),
        verdict_bullets(summary["findings"]),
        Table(header, _rows(summary)),
    )
    write_report(out, page)
