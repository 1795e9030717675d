"""Acceptance rules for an attention output or gradient judged against an FP64 reference and a baseline.

rule="peers": the field's rule. After flash-attention's tests (tests/test_flash_attn.py: k = 2 forward, 3
gradients, floor 2 * max|(ref + 0.3 - 0.3) - ref| in the kernel's dtype), with the mean-error and
share-of-elements views that xformers reports, and NaN where the reference has none as a failure (as
PyTorch's tests do). It looks at the largest error only, and the floor, sized for the output's
magnitude, hides any error below it: a softmax scale 1% off passes in bf16.

rule="flashcheck" (the default): the peers' max-error test (its k calibrated, never below the peers' 2
and 3: the 3x test fails PyTorch's CPU flash backward in fp32 on sharp and tied inputs) and non-finite
check, plus three views that average over many elements or rows, each bounded by a factor times the same
statistic of the baseline:
  rel_l2  ||out - ref|| / ||ref||                      (error energy)
  bias    the mean signed error along the reference: per group of 16 rows, <e, ref> / |ref| (e = out -
          ref), RMS over groups, relative to the RMS of |ref|; a gain error out = 1.01 ref gives 0.01.
          The rows of a group are independent queries (keys for dK, dV), so rounding noise averages
          out and a systematic error does not
  row     median over rows of ||e_row|| / ||e_baseline_row||: how much worse the typical row is
The baseline's statistics are floored at those of the reference rounded to the kernel's dtype (the least
error any output in that dtype has), so a factor applies even where the baseline happens to be exact; its
bias also at rel_l2 / sqrt(elements in a group), the bias that noise of the baseline's size shows.
The factors (FACTORS) are not chosen by hand: `python benchmarks/score_mutants.py --calibrate` runs
correct kernels (the mutants' clean kernel, SDPA math and flash, the flash simulator as PyTorch's CPU
kernel and as FA2) over shapes, dtypes, causal, input distributions and seeds, and sets each factor, per
dtype, tensor kind and input distribution, to the largest ratio seen (quantile 1.0: the tails are heavy,
and the 0.99 quantile plus a 25% margin still failed correct runs) times a 1.25 margin, at least 1 so that
the baseline passes its own rule. Where the inputs' distribution is not given, the largest factor over
distributions applies.
The reference must be the exact attention of the inputs the kernel received (already rounded), as in
flash-attention's tests; `flashcheck.testing` builds it so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

K_FORWARD = 2.0
K_GRADIENT = 3.0
RULES = ("peers", "flashcheck")
STATISTICS = ("max", "rel_l2", "bias", "row")  # flashcheck's checks with a calibrated factor
BIAS_GROUP = 16  # rows per group in the bias statistic
QUANTILE = 1.0  # the calibration's upper quantile of correct kernels' ratios: the largest one seen
MARGIN = 1.25  # factor = max(1, MARGIN * that quantile)


@dataclass(frozen=True, slots=True)
class Factors:
    """flashcheck's bounds for one dtype and tensor kind, as multiples of the baseline's statistic."""

    max: float  # k of the max-error test (never below the peers' 2 / 3)
    rel_l2: float
    bias: float
    row: float


# `python benchmarks/score_mutants.py --calibrate --cases 480` (2026-12-03, torch 2.13.0+cpu): 480 cases x 5 correct
# kernels = 2400 runs; per dtype, kind and input distribution 160 outputs and 480 gradients; each factor is 1.25 x
# the largest ratio seen, rounded up to 2 digits, at least 1 (max: at least the peers' k). The spread depends on
# the inputs: on tied maxima rows repeat, so a correct kernel's tiny systematic error shows as bias (PyTorch's CPU
# flash kernel: 8x plain PyTorch's in bf16), and plain fp32 PyTorch is almost exact where the CPU flash backward
# is not (k = 39 in the max test); every fp32 mutant is caught anyway. benchmarks/budget_calibration.json lists
# the worst runs of each group.
FACTORS: dict[tuple[str, str, str], Factors] = {
    ("bfloat16", "gradient", "normal"): Factors(max=3.0, rel_l2=1.4, bias=3.3, row=1.3),
    ("bfloat16", "gradient", "outliers"): Factors(max=3.0, rel_l2=1.3, bias=1.5, row=1.2),
    ("bfloat16", "gradient", "sharp"): Factors(max=3.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("bfloat16", "gradient", "tied"): Factors(max=3.0, rel_l2=2.9, bias=13.0, row=2.2),
    ("bfloat16", "gradient", "uniform"): Factors(max=3.0, rel_l2=2.1, bias=4.1, row=1.8),
    ("bfloat16", "output", "normal"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("bfloat16", "output", "outliers"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("bfloat16", "output", "sharp"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("bfloat16", "output", "tied"): Factors(max=2.0, rel_l2=1.3, bias=11.0, row=1.3),
    ("bfloat16", "output", "uniform"): Factors(max=2.0, rel_l2=1.2, bias=1.7, row=1.3),
    ("float16", "gradient", "normal"): Factors(max=3.0, rel_l2=1.5, bias=1.7, row=1.2),
    ("float16", "gradient", "outliers"): Factors(max=3.0, rel_l2=1.3, bias=1.8, row=1.3),
    ("float16", "gradient", "sharp"): Factors(max=3.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("float16", "gradient", "tied"): Factors(max=3.0, rel_l2=2.7, bias=5.5, row=2.0),
    ("float16", "gradient", "uniform"): Factors(max=3.0, rel_l2=2.1, bias=2.9, row=1.9),
    ("float16", "output", "normal"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("float16", "output", "outliers"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("float16", "output", "sharp"): Factors(max=2.0, rel_l2=1.0, bias=1.0, row=1.0),
    ("float16", "output", "tied"): Factors(max=2.0, rel_l2=1.3, bias=18.0, row=1.3),
    ("float16", "output", "uniform"): Factors(max=2.0, rel_l2=1.3, bias=1.7, row=1.3),
    ("float32", "gradient", "normal"): Factors(max=4.7, rel_l2=2.2, bias=4.7, row=1.7),
    ("float32", "gradient", "outliers"): Factors(max=28.0, rel_l2=16.0, bias=44.0, row=1.7),
    ("float32", "gradient", "sharp"): Factors(max=8.6, rel_l2=6.8, bias=16.0, row=5.0),
    ("float32", "gradient", "tied"): Factors(max=49.0, rel_l2=52.0, bias=130.0, row=11.0),
    ("float32", "gradient", "uniform"): Factors(max=3.9, rel_l2=2.0, bias=11.0, row=2.0),
    ("float32", "output", "normal"): Factors(max=2.2, rel_l2=1.4, bias=3.2, row=1.4),
    ("float32", "output", "outliers"): Factors(max=3.2, rel_l2=1.6, bias=3.3, row=1.4),
    ("float32", "output", "sharp"): Factors(max=2.2, rel_l2=1.5, bias=2.2, row=1.3),
    ("float32", "output", "tied"): Factors(max=2.0, rel_l2=1.6, bias=2.6, row=1.4),
    ("float32", "output", "uniform"): Factors(max=2.0, rel_l2=1.4, bias=2.1, row=1.4),
}


def factors_for(dtype: torch.dtype, gradient: bool, distribution: str | None = None) -> Factors:
    """The calibrated factors for `dtype`, the tensor kind and the input `distribution` (None or one not
    calibrated: the largest over distributions; an uncalibrated dtype: the largest over dtypes)."""
    kind = "gradient" if gradient else "output"
    name = str(dtype).replace("torch.", "")
    if (name, kind, distribution) in FACTORS:
        return FACTORS[(name, kind, distribution)]
    dtypes = {d for d, _, _ in FACTORS}
    same = [f for (d, kd, _), f in FACTORS.items() if kd == kind and (d == name or name not in dtypes)]
    return Factors(*(max(getattr(f, a) for f in same) for a in STATISTICS))


@dataclass(frozen=True, slots=True)
class Check:
    """One comparison: `value` must be <= `bound`."""

    name: str
    value: float
    bound: float

    @property
    def passed(self) -> bool:
        return self.value <= self.bound

    @property
    def margin(self) -> float:
        """value / bound (> 1 fails)."""
        return self.value / self.bound if self.bound > 0 else (0.0 if self.value == 0 else float("inf"))


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """The checks and views of one comparison; truthy when every check passed."""

    checks: tuple[Check, ...]
    k: float
    floor: float
    baseline_max: float
    share_over: float  # fraction of elements with |out - ref| above the max-error bound
    rule: str = "peers"

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def __bool__(self) -> bool:
        return self.passed

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def message(self) -> str:
        lines = [f"{'check':<10}{'value':>12}{'bound':>12}{'value/bound':>13}  verdict"]
        for c in self.checks:
            lines.append(
                f"{c.name:<10}{c.value:>12.3e}{c.bound:>12.3e}{c.margin:>13.2f}  {'ok' if c.passed else 'FAIL'}"
            )
        lines.append(
            f"rule {self.rule}: k={self.k:g}, floor={self.floor:.2e}, baseline max error {self.baseline_max:.3e}, "
            f"{100 * self.share_over:.3f}% of elements over the max bound"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "rule": self.rule,
            "k": self.k,
            "floor": self.floor,
            "share_over": self.share_over,
            "checks": [{"name": c.name, "value": c.value, "bound": c.bound, "passed": c.passed} for c in self.checks],
        }


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """2 * max|(r + 0.3 - 0.3) - r| with r the reference rounded to `dtype` (flash-attention's atol)."""
    if dtype == torch.float64 or not dtype.is_floating_point or dtype.itemsize == 1:
        dtype = torch.float32 if dtype == torch.float64 else torch.float16
    r = ref.detach().to(dtype)
    return 2.0 * float(((r + 0.3 - 0.3) - r).abs().max().to(torch.float64)) if r.numel() else 0.0


def rel_l2_error(err: torch.Tensor, ref: torch.Tensor) -> float:
    """||err|| / ||ref|| (0 for an empty or zero reference with zero error, inf with error)."""
    num, den = float(torch.linalg.vector_norm(err)), float(torch.linalg.vector_norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def bias_error(err: torch.Tensor, ref: torch.Tensor, group: int = BIAS_GROUP) -> float:
    """The error's signed component along the reference, per group of `group` consecutive rows, relative:
    RMS_g(<err, ref>_g / |ref|_g) / RMS_g(|ref|_g), inner products and norms over a group's rows (last dim
    = a row). err, ref [..., L, D]; a gain error out = (1 + c) ref gives c. The last group takes the rows
    left over (no group has fewer than `group` rows when L >= group). A group whose reference is ~0
    contributes its error's size, not a ratio that blows up."""
    if ref.dim() < 2 or ref.numel() == 0:
        return 0.0
    dot, sq = (err * ref).sum(dim=-1), (ref * ref).sum(dim=-1)  # [..., L]
    length = dot.shape[-1]
    idx = (torch.arange(length) // group).clamp(max=max(length // group - 1, 0))
    groups = int(idx[-1]) + 1
    dot, sq = (torch.zeros(*x.shape[:-1], groups, dtype=x.dtype).index_add_(-1, idx, x) for x in (dot, sq))
    norm = sq.sqrt()
    along = torch.where(norm > 0, dot / torch.where(norm > 0, norm, torch.ones_like(norm)), 0.0)
    scale = float(sq.mean().sqrt())
    return float(along.pow(2).mean().sqrt()) / scale if scale > 0 else 0.0


def row_ratio(err: torch.Tensor, base_err: torch.Tensor) -> float:
    """Median over rows (last dim) of ||err_row|| / ||base_err_row|| (0/0 counts 0, x/0 inf)."""
    if err.numel() == 0:
        return 0.0
    e, b = torch.linalg.vector_norm(err, dim=-1), torch.linalg.vector_norm(base_err, dim=-1)
    r = torch.where(b > 0, e / torch.where(b > 0, b, torch.ones_like(b)), torch.where(e > 0, float("inf"), 0.0))
    return float(r.flatten().median())


def _floored(base_err: torch.Tensor, round_err: torch.Tensor) -> torch.Tensor:
    """The baseline's error, row by row no smaller than rounding the reference to the dtype."""
    bn = torch.linalg.vector_norm(base_err, dim=-1, keepdim=True)
    rn = torch.linalg.vector_norm(round_err, dim=-1, keepdim=True)
    return torch.where(bn >= rn, base_err, round_err)


def _max_errors(o: torch.Tensor, r: torch.Tensor, b: torch.Tensor) -> tuple[float, float, torch.Tensor]:
    """(max |o - r|, max |b - r|, |o - r|) over the entries where r is finite (NaN in o counts inf)."""
    finite = torch.isfinite(r)
    err = torch.nan_to_num((o - r).abs()[finite], nan=float("inf"))
    berr = (b - r).abs()[finite]
    return (float(err.max()) if err.numel() else 0.0), (float(berr.max()) if berr.numel() else 0.0), err


def flashcheck_statistics(
    out: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, dtype: torch.dtype | None = None
) -> dict[str, tuple[float, float]]:
    """name -> (out's value, the baseline's), so that the check is value <= factor * baseline's value:
    max (the max error above the rounding floor, and the baseline's max error: their ratio is the k the
    max-error test needs), rel_l2, bias, row (the row ratio against 1). Rows (last dim) where ref is not
    finite are left out of rel_l2, bias and row; non-finite entries of out count as zero error there (the
    nonfinite check fails them). Shapes as check_budget."""
    o, r, b = (t.detach().to(torch.float64).cpu() for t in (out, ref, baseline))
    dtype = dtype or out.dtype
    emax, bmax, _ = _max_errors(o, r, b)
    keep = torch.isfinite(r).all(dim=-1, keepdim=True) if r.dim() else torch.isfinite(r)
    e = torch.nan_to_num(torch.where(keep, o - r, 0.0), nan=0.0, posinf=0.0, neginf=0.0)
    r0 = torch.where(keep, r, 0.0)
    rnd = dtype if dtype.is_floating_point and dtype.itemsize > 1 else torch.float32
    rounding = r0.to(rnd).to(torch.float64) - r0
    eb_raw = torch.where(keep, b - r0, 0.0)
    eb = _floored(eb_raw, rounding)
    base_l2 = rel_l2_error(eb, r0)
    per_group = BIAS_GROUP * (r0.shape[-1] if r0.dim() else 1)
    # the baseline's bias, no smaller than that of rounding the reference (coherent where rows repeat, as
    # with tied maxima) nor than the bias a random error of the baseline's size shows (its energy spread
    # over a group's elements)
    base_bias = max(bias_error(eb_raw, r0), bias_error(rounding, r0), base_l2 / math.sqrt(per_group))
    return {
        "max": (max(0.0, emax - rounding_floor(r, dtype)), bmax),
        "rel_l2": (rel_l2_error(e, r0), base_l2),
        "bias": (bias_error(e, r0), base_bias),
        "row": (row_ratio(e, eb), 1.0),
    }


def check_budget(
    out: torch.Tensor,
    ref: torch.Tensor,
    baseline: torch.Tensor,
    *,
    k: float | None = None,
    dtype: torch.dtype | None = None,
    floor: float | None = None,
    rule: str = "flashcheck",
    gradient: bool = False,
    distribution: str | None = None,
) -> BudgetResult:
    """Judge `out` against `ref` (FP64) by `baseline` (the same-precision reference implementation).

    out, ref, baseline: one shape, rows along the last dim ([B, H, L, D]). Both rules: max |out - ref| <=
    k * max |baseline - ref| + floor; no NaN/Inf in out where ref is finite. rule="peers": k default 2, or
    3 with `gradient`, and mean |out - ref| <= k * mean |baseline - ref| + floor / 2. rule="flashcheck": k
    default the calibrated one for `dtype` and kind (at least the peers'), plus rel_l2, bias and row within
    their calibrated factors (see the module docstring). `dtype` (default out's) sets floor and factors;
    `distribution`, the name of the inputs' distribution (flashcheck.core.inputs) where known, picks the
    factors calibrated on it (None: the largest over distributions)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {', '.join(RULES)}")
    o, r, b = (t.detach().to(torch.float64).cpu() for t in (out, ref, baseline))
    if not (o.shape == r.shape == b.shape):
        raise ValueError(f"shapes differ: out {tuple(o.shape)}, ref {tuple(r.shape)}, baseline {tuple(b.shape)}")
    dtype = dtype or out.dtype
    f = factors_for(dtype, gradient, distribution)
    if k is None:
        k = f.max if rule == "flashcheck" else (K_GRADIENT if gradient else K_FORWARD)
    fl = rounding_floor(r, dtype) if floor is None else float(floor)
    emax, bmax, err = _max_errors(o, r, b)
    bound = float(k) * bmax + fl
    bad = float((~torch.isfinite(o) & torch.isfinite(r)).sum())
    share = float((err > bound).double().mean()) if err.numel() else 0.0
    if rule == "peers":
        berr = (b - r).abs()[torch.isfinite(r)]
        mean = (float(err.mean()), float(berr.mean())) if err.numel() else (0.0, 0.0)
        checks = (Check("max", emax, bound), Check("mean", mean[0], k * mean[1] + fl / 2), Check("nonfinite", bad, 0.0))
    else:
        stats = flashcheck_statistics(o, r, b, dtype)
        extra = (Check(name, val, getattr(f, name) * base) for name, (val, base) in stats.items() if name != "max")
        checks = (Check("max", emax, bound), Check("nonfinite", bad, 0.0), *extra)
    return BudgetResult(checks, float(k), fl, bmax, share, rule)
