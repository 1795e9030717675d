"""The field's acceptance rule as a function: error <= k * error(same-precision baseline) + rounding floor.

After flash-attention's tests (tests/test_flash_attn.py: k = 2 forward, 3 gradients, floor
2 * max|(ref + 0.3 - 0.3) - ref| in the kernel's dtype), with the mean-error and share-of-elements views
that xformers reports, and NaN where the reference has none as a failure (as PyTorch's tests do)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

K_FORWARD = 2.0
K_GRADIENT = 3.0


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
            f"k={self.k:g}, floor={self.floor:.2e}, baseline max error {self.baseline_max:.3e}, "
            f"{100 * self.share_over:.3f}% of elements over the max bound"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
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


def check_budget(
    out: torch.Tensor,
    ref: torch.Tensor,
    baseline: torch.Tensor,
    *,
    k: float = K_FORWARD,
    dtype: torch.dtype | None = None,
    floor: float | None = None,
) -> BudgetResult:
    """Judge `out` against `ref` (FP64) by `baseline` (the same-precision reference implementation).

    Checks: max |out - ref| <= k * max |baseline - ref| + floor; mean |out - ref| <= k * mean |baseline -
    ref| + floor / 2; no NaN/Inf in out where ref is finite. `dtype` (default out's) sets the floor."""
    o, r, b = (t.detach().to(torch.float64).cpu() for t in (out, ref, baseline))
    if not (o.shape == r.shape == b.shape):
        raise ValueError(f"shapes differ: out {tuple(o.shape)}, ref {tuple(r.shape)}, baseline {tuple(b.shape)}")
    fl = rounding_floor(r, dtype or out.dtype) if floor is None else float(floor)
    finite = torch.isfinite(r)
    bad = int((~torch.isfinite(o) & finite).sum())
    err, berr = (o - r).abs()[finite], (b - r).abs()[finite]
    err = torch.nan_to_num(err, nan=float("inf"))
    emax = float(err.max()) if err.numel() else 0.0
    bmax = float(berr.max()) if berr.numel() else 0.0
    bound = k * bmax + fl
    checks = (
        Check("max", emax, bound),
        Check(
            "mean",
            float(err.mean()) if err.numel() else 0.0,
            k * (float(berr.mean()) if berr.numel() else 0.0) + fl / 2,
        ),
        Check("nonfinite", float(bad), 0.0),
    )
    share = float((err > bound).double().mean()) if err.numel() else 0.0
    return BudgetResult(checks, k, fl, bmax, share)
