"""The loss gap of train-study's 8-bit attention runs (sage8: from step 1, "pretraining"; sage8ft: the second half
only, "fine-tuning") to the base run of the same seed, judged against the seed-to-seed spread of the base runs.

Per run, the loss level is the mean training loss over its last TAIL of steps (one step's batch loss is noisy).
Per seed s, gap_s = level(variant-s) - level(base-s) (same initialisation, same batches). The spread is the sample
standard deviation over seeds of level(base-s): how much the loss moves when only the seed changes. Verdicts:
  slower        the mean gap over seeds exceeds the spread (or the variant's loss is not finite: it diverged)
  lossless      the mean gap is at most the spread (a negative gap, 8-bit below the base, is lossless too)
  inconclusive  fewer than MIN_SEEDS seeds (no spread to judge against), or the base runs do not leave the
                plateau: some seed's level is not below the loss of predicting each token from the current one
                alone (the data's bigram conditional entropy; a model reaches it without attention, so there the
                attention's numerics cannot show in the loss) by more than the spread.
Where the study has attention-free runs (NAME "noattn": each position sees only itself), their levels are the
measured loss without attention, beside the computed plateau.
The paper's claim (arXiv 2505.11594, abstract: "lossless performance in fine-tuning tasks but ... slower
convergence in pretraining tasks") holds here when sage8ft is lossless and sage8 slower."""

from __future__ import annotations

import math
import statistics

import torch

TAIL = 0.1  # the loss level: mean over the last 10% of the steps (at least one step)
MIN_SEEDS = 3  # as the train-study's ratios: fewer seeds give no usable spread
CLAIM = "8-bit attention (SageBwd) gives lossless fine-tuning but slower pretraining"
CLAIM_SOURCE = "arXiv 2505.11594 (SageAttention3), abstract"
LABELS = {
    "sage8": "8-bit attention from step 1 (pretraining)",
    "sage8ft": "8-bit attention from half-way (fine-tuning)",
}


def context_free_loss(tokens: torch.Tensor, vocab: int) -> float:
    """H(x_{t+1} | x_t) of a token sequence [N] in nats: the loss of the best predictor that sees the current token
    only (what the small GPT reaches without attention), from the sequence's bigram counts."""
    t = tokens.long().flatten()
    if t.numel() < 2:
        raise ValueError(f"context_free_loss needs at least 2 tokens; got {t.numel()}")
    counts = torch.bincount(t[:-1] * vocab + t[1:], minlength=vocab * vocab).double().view(vocab, vocab)
    joint = counts / counts.sum()
    cond = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    seen = counts > 0
    return float(-(joint[seen] * cond[seen].log()).sum())


def level(losses: list[float]) -> float:
    """Mean of the last TAIL of a run's per-step losses (at least one)."""
    if not losses:
        raise ValueError("a run with no losses has no loss level")
    n = max(1, round(len(losses) * TAIL))
    return sum(losses[-n:]) / n


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def loss_gaps(
    losses: dict[str, list[float]],
    seeds: list[int],
    *,
    plateau: float,
    variants: tuple[str, ...] = ("sage8", "sage8ft"),
    base: str = "base",
    control: str = "noattn",
) -> dict:
    """{tail_steps, seeds, base_level [per seed], spread, plateau, base_left_plateau (every seed's level below
    plateau - spread), attention_free (levels of the control runs per seed, or None without them), variants:
    {name: {level, gaps (per seed), gap (mean), verdict, reason}}, claim: {claim, source, status, text}} from
    the runs' per-step losses ({"NAME-sS": [...]}) and the plateau loss (context_free_loss). Undefined numbers
    are None."""
    steps = len(losses[f"{base}-s{seeds[0]}"])
    base_lv = [level(losses[f"{base}-s{s}"]) for s in seeds]
    spread = statistics.stdev(base_lv) if len(seeds) >= 2 and all(map(math.isfinite, base_lv)) else math.nan
    left = math.isfinite(spread) and all(x < plateau - spread for x in base_lv)
    free = [level(losses[f"{control}-s{s}"]) for s in seeds] if f"{control}-s{seeds[0]}" in losses else None
    out: dict = {
        "tail_steps": max(1, round(steps * TAIL)),
        "seeds": len(seeds),
        "base_level": [_num(x) for x in base_lv],
        "spread": _num(spread),
        "plateau": plateau,
        "base_left_plateau": left,
        "attention_free": None if free is None else [_num(x) for x in free],
        "variants": {},
    }
    for name in variants:
        lv = [level(losses[f"{name}-s{s}"]) for s in seeds]
        gaps = [a - b for a, b in zip(lv, base_lv, strict=True)]
        gap = sum(gaps) / len(gaps)
        verdict, reason = _verdict(gap, spread, len(seeds), left, max(base_lv), plateau)
        out["variants"][name] = {
            "label": LABELS.get(name, name),
            "level": [_num(x) for x in lv],
            "gaps": [_num(x) for x in gaps],
            "gap": _num(gap),
            "verdict": verdict,
            "reason": reason,
        }
    out["claim"] = _claim(out["variants"])
    return out


def _verdict(gap: float, spread: float, n: int, left: bool, worst_base: float, plateau: float) -> tuple[str, str]:
    if not math.isfinite(gap):
        return "slower", "its loss is not finite (the run diverged)"
    if n < MIN_SEEDS:
        return "inconclusive", f"too few seeds ({n}; the seed spread needs at least {MIN_SEEDS})"
    if not left:
        return "inconclusive", (
            f"the base runs do not all leave the plateau: the highest seed's loss {worst_base:.4f} is not below "
            f"{plateau:.4f} nats "
            f"(predicting from the current token alone, no attention needed) by more than the seed spread "
            f"{spread:.2g}"
        )
    if gap > spread:
        return "slower", f"mean gap {gap:+.3g} nats exceeds the seed spread {spread:.3g}"
    return "lossless", f"mean gap {gap:+.3g} nats is within the seed spread {spread:.3g}"


def _claim(variants: dict) -> dict:
    pre, ft = variants.get("sage8", {}).get("verdict"), variants.get("sage8ft", {}).get("verdict")
    if "inconclusive" in (pre, ft) or None in (pre, ft):
        status = "inconclusive"
    else:
        status = "holds" if (ft, pre) == ("lossless", "slower") else "does not hold"
    text = f"fine-tuning (sage8ft): {ft}; pretraining (sage8): {pre}"
    return {"claim": CLAIM, "source": CLAIM_SOURCE, "status": status, "text": text}


def sentence(gap: dict, tokens_per_step: int) -> str:
    """One line for the report's opening."""
    v = gap["variants"]
    parts = "; ".join(
        f"{name} {e['verdict']} (mean gap {_fmt(e['gap'])} nats, seed spread {_fmt(gap['spread'], sign=False)})"
        for name, e in v.items()
    )
    status = gap["claim"]["status"]
    reasons = [e["reason"] for e in v.values() if e["verdict"] == "inconclusive"]
    if reasons:
        why = "too few seeds" if "too few seeds" in reasons[0] else "the base runs stay on the plateau"
        status += f" ({why}{', where attention is not yet used' if 'plateau' in why else ''})"
    return (
        f"8-bit attention (SageBwd-like) vs the base run's loss: {parts}. \"Lossless fine-tuning, slower "
        f'pretraining" ({CLAIM_SOURCE}) at {tokens_per_step} tokens per step: {status}.'
    )


def plateau_sentence(gap: dict) -> str:
    """Does attention matter in these runs? The base runs' tail loss per seed against the current-token loss and
    the measured loss of the attention-free runs."""
    base = ", ".join(_fmt(x, sign=False) for x in gap["base_level"])
    free = gap.get("attention_free")
    measured = ""
    if free:
        finite = [x for x in free if x is not None]
        mean = sum(finite) / len(finite) if finite else None
        measured = f"; without attention (each position sees only itself) the runs reach {_fmt(mean, sign=False)}"
    if gap["spread"] is None:
        word = "one seed gives no spread to judge the distance against"
    elif gap["base_left_plateau"]:
        word = "below it by more than the seed spread in every seed"
    else:
        word = "not below it by more than the seed spread in every seed: attention has not yet mattered"
    return (
        f"Does attention matter here? The base runs' tail loss per seed ({base} nats) against the current-token loss "
        f"{gap['plateau']:.4f} nats (the best any model without look-back can do{measured}): {word}"
        + ("." if gap["spread"] is None else f" (seed spread {_fmt(gap['spread'], sign=False)}).")
    )


def _fmt(x: float | None, sign: bool = True) -> str:
    return "n/a" if x is None else f"{x:+.3g}" if sign else f"{x:.3g}"
