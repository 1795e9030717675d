"""Weight deviation between two checkpoint series, streaming one tensor at a time.

Per tensor: max |A - B| and exact Wasserstein-1 of the value distributions (by sorting). Per layer and
whole model: W1 exact when the values fit `exact_limit`, else from per-tensor quantile sketches merged
as a weighted mixture. The stated error bound is sum_t (n_t / N) * (W1(A_t, sketch A_t) + W1(B_t, sketch
B_t)), each term computed exactly while the tensor is sorted (triangle inequality; W1 of mixtures is at
most the weighted W1 of their parts), so it never exceeds sum_t (n_t / N) * (range_A,t + range_B,t) / K."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flashcheck.metrics import wasserstein1_weighted
from flashcheck.training.checkpoints import CheckpointError, open_checkpoint, series

CHUNK = 1 << 22


def _values(t: torch.Tensor) -> np.ndarray:
    """A flat writable float array (fp32 stays fp32, narrower floats widen to fp32, fp64 stays). Readers
    return fresh tensors, so the array is sorted in place without a copy."""
    if t.dtype in (torch.float16, torch.bfloat16) or not t.dtype.is_floating_point:
        t = t.to(torch.float32)
    arr = t.reshape(-1).numpy()
    return arr if arr.flags.writeable else arr.copy()


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    best = 0.0
    for i in range(0, a.size, CHUNK):
        best = max(best, float(np.max(np.abs(a[i : i + CHUNK].astype(np.float64) - b[i : i + CHUNK]), initial=0.0)))
    return best


def _mean_abs_sorted(a: np.ndarray, b: np.ndarray) -> float:
    total = 0.0
    for i in range(0, a.size, CHUNK):
        total += float(np.abs(a[i : i + CHUNK].astype(np.float64) - b[i : i + CHUNK]).sum())
    return total / a.size if a.size else 0.0


@dataclass
class _Sketch:
    """Atoms (quantile values) and their weights, of A and B, plus the error bound they carry."""

    xa: list[np.ndarray] = field(default_factory=list)
    xb: list[np.ndarray] = field(default_factory=list)
    w: list[np.ndarray] = field(default_factory=list)
    bound_mass: float = 0.0  # sum_t n_t * (W1(A_t, sketch) + W1(B_t, sketch)), divided by N at the end
    n: int = 0

    def add(self, a_sorted: np.ndarray, b_sorted: np.ndarray, points: int) -> None:
        n = a_sorted.size
        if n <= points:
            self.xa.append(a_sorted.astype(np.float64))
            self.xb.append(b_sorted.astype(np.float64))
            self.w.append(np.ones(n))
        else:
            idx = ((np.arange(points) + 0.5) * n / points).astype(np.int64)
            self.xa.append(a_sorted[idx].astype(np.float64))
            self.xb.append(b_sorted[idx].astype(np.float64))
            self.w.append(np.full(points, n / points))
            self.bound_mass += n * (_sketch_error(a_sorted, idx, points) + _sketch_error(b_sorted, idx, points))
        self.n += n

    def w1(self) -> tuple[float, float]:
        xa, xb, w = (torch.from_numpy(np.concatenate(x)) for x in (self.xa, self.xb, self.w))
        return wasserstein1_weighted(xa, w, xb, w), self.bound_mass / self.n


def _sketch_error(sorted_vals: np.ndarray, idx: np.ndarray, points: int) -> float:
    """Exact W1 between a sorted tensor and its K-atom quantile sketch: mean |x_(j) - atom(bin(j))|."""
    n, total = sorted_vals.size, 0.0
    for start in range(0, n, CHUNK):
        j = np.arange(start, min(n, start + CHUNK), dtype=np.int64)
        atoms = sorted_vals[idx[(j * points) // n]].astype(np.float64)
        total += float(np.abs(sorted_vals[start : start + j.size].astype(np.float64) - atoms).sum())
    return total / n


def layer_of(name: str) -> str:
    """'blocks.3.attn.weight' -> 'blocks.3'; 'tok.weight' -> 'tok'."""
    m = re.match(r"^(.*?\.\d+)\.", name)
    return m.group(1) if m else name.split(".")[0]


@dataclass
class PairResult:
    step: int
    max_abs: float
    wasserstein: float
    wasserstein_bound: float
    method: str
    per_tensor: dict[str, dict]
    per_layer: dict[str, dict]
    mismatches: dict[str, list]

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "max_abs": self.max_abs,
            "wasserstein": self.wasserstein,
            "wasserstein_error_bound": self.wasserstein_bound,
            "wasserstein_method": self.method,
            "per_tensor": self.per_tensor,
            "per_layer": self.per_layer,
            "mismatches": self.mismatches,
        }


def compare_checkpoints(
    path_a: str | Path, path_b: str | Path, *, step: int = 0, sketch_points: int = 4096, exact_limit: int = 20_000_000
) -> PairResult:
    """Compare two checkpoints tensor by tensor (memory: two tensors at a time, plus the sketches)."""
    ra, rb = open_checkpoint(path_a), open_checkpoint(path_b)
    ka, kb = ra.keys(), rb.keys()
    mism = {"only_in_a": sorted(set(ka) - set(kb)), "only_in_b": sorted(set(kb) - set(ka)), "shape": [], "dtype": []}
    common = [k for k in ka if k in kb]
    total = sum(int(np.prod(ka[k][0])) for k in common if ka[k][0] == kb[k][0])
    exact = total <= exact_limit
    per_tensor, whole, layers, max_all = {}, _Sketch(), {}, 0.0
    points = total + 1 if exact else sketch_points
    for name in common:
        (sa, da), (sb, db) = ka[name], kb[name]
        if sa != sb:
            mism["shape"].append({"name": name, "a": list(sa), "b": list(sb)})
            continue
        if da != db:
            mism["dtype"].append({"name": name, "a": str(da), "b": str(db)})  # compared all the same
        a, b = _values(ra.tensor(name)), _values(rb.tensor(name))
        if a.size == 0:
            continue
        mx = _max_abs(a, b)
        a.sort()
        b.sort()
        per_tensor[name] = {"max_abs": mx, "wasserstein": _mean_abs_sorted(a, b), "numel": int(a.size)}
        max_all = max(max_all, mx)
        whole.add(a, b, points)
        layers.setdefault(layer_of(name), _Sketch()).add(a, b, points)
        del a, b
    if not per_tensor:
        raise CheckpointError(f"{str(path_a)!r} and {str(path_b)!r} have no tensor in common to compare")
    w, bound = whole.w1()
    per_layer = {}
    for lname, sk in layers.items():
        lw, lb = sk.w1()
        per_layer[lname] = {"wasserstein": lw, "wasserstein_error_bound": lb, "numel": sk.n}
    return PairResult(
        step, max_all, w, bound, "exact" if exact else f"sketch({sketch_points})", per_tensor, per_layer, mism
    )


def compare_series(a: str | Path, b: str | Path, **kw) -> list[PairResult]:
    """Pairs of checkpoints matched by step (or two single files as step 0)."""
    sa, sb = series(a), series(b)
    if len(sa) == 1 and len(sb) == 1:
        return [compare_checkpoints(next(iter(sa.values())), next(iter(sb.values())), step=0, **kw)]
    steps = sorted(set(sa) & set(sb))
    if not steps:
        raise CheckpointError(f"no common steps: {str(a)!r} has {sorted(sa)[:8]}, {str(b)!r} has {sorted(sb)[:8]}")
    return [compare_checkpoints(sa[s], sb[s], step=s, **kw) for s in steps]


def slope(steps: list[int], values: list[float]) -> float:
    """Least-squares slope of values over steps (0 for fewer than two points)."""
    if len(steps) < 2:
        return 0.0
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum()) if (x * x).sum() > 0 else 0.0
