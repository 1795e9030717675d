"""Weight deviation between two checkpoint series, streaming one tensor at a time.

Per tensor: max |A - B| and exact Wasserstein-1 of the value distributions (by sorting). Per layer and
whole model: W1 exact when the values fit `exact_limit`, else from per-tensor quantile sketches merged
as a weighted mixture. The stated error bound is sum_t (n_t / N) * (W1(A_t, sketch A_t) + W1(B_t, sketch
B_t)), each term computed exactly while the tensor is sorted (triangle inequality; W1 of mixtures is at
most the weighted W1 of their parts), so it never exceeds sum_t (n_t / N) * (range_A,t + range_B,t) / K.

Memory: a pair of tensors under SPILL_BYTES each is held at once; a bigger one is compared holding one tensor
at a time: A is read, written unsorted and sorted to a temporary folder, and dropped, then B is read and
compared against A's copies in chunks (so the peak is the largest tensor plus chunk buffers)."""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flashcheck.core.metrics import wasserstein1_weighted
from flashcheck.training.checkpoints import CheckpointError, Reader, open_checkpoint, series

CHUNK = 1 << 22
SPILL_BYTES = 64 * 2**20  # a tensor at least this big is compared one tensor at a time (see above)


def _values(t: torch.Tensor) -> np.ndarray:
    """A flat writable float array (fp32 and fp64 stay, every other dtype becomes fp32). Readers
    return fresh tensors, so the array is sorted in place without a copy."""
    if t.dtype not in (torch.float32, torch.float64):
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
    sketched: bool = False  # some tensor is a sketch (weights other than 1)

    def add(self, a_sorted: np.ndarray, b_sorted: np.ndarray, points: int) -> None:
        self.add_sides(_side(a_sorted, points), _side(b_sorted, points))

    def add_sides(self, sa: tuple[np.ndarray, float, int], sb: tuple[np.ndarray, float, int]) -> None:
        """Add one tensor from each side's (atoms, W1 to its sketch, size) (see _side)."""
        n, points = sa[2], sa[0].size
        self.xa.append(sa[0])
        self.xb.append(sb[0])
        self.w.append(np.ones(n) if n <= points else np.full(points, n / points))
        if n > points:
            self.bound_mass += n * (sa[1] + sb[1])
            self.sketched = True
        self.n += n

    def w1(self) -> tuple[float, float]:
        """(W1, its error bound). Every value held (no sketch): two samples of one size with equal weights, whose
        W1 is the mean |a_(i) - b_(i)| of their order statistics (the weighted merge's value, in one sort each)."""
        if not self.sketched:
            xa, xb = np.sort(np.concatenate(self.xa)), np.sort(np.concatenate(self.xb))
            return float(np.abs(xa - xb).sum() / xa.size), 0.0
        xa, xb, w = (torch.from_numpy(np.concatenate(x)) for x in (self.xa, self.xb, self.w))
        return wasserstein1_weighted(xa, w, xb, w), self.bound_mass / self.n


def _side(sorted_vals: np.ndarray, points: int) -> tuple[np.ndarray, float, int]:
    """One side of a tensor's sketch: its atoms (every value when there are at most `points`), the exact W1
    between the tensor and them, and the tensor's size."""
    n = sorted_vals.size
    if n <= points:
        return sorted_vals.astype(np.float64), 0.0, n
    idx = ((np.arange(points) + 0.5) * n / points).astype(np.int64)
    return sorted_vals[idx].astype(np.float64), _sketch_error(sorted_vals, idx, points), n


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


ProgressFn = Callable[[int, int, str], None]


@dataclass
class PairResult:
    """The deviation of one pair of checkpoints. `nonfinite`: tensors holding NaN/Inf, {name: {"a": count,
    "b": count, "numel": n}}, left out of every figure (max_abs and wasserstein are NaN if nothing is left)."""

    step: int
    max_abs: float
    wasserstein: float
    wasserstein_bound: float
    method: str
    per_tensor: dict[str, dict]
    per_layer: dict[str, dict]
    mismatches: dict[str, list]
    nonfinite: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready (NaN as None)."""
        return {
            "step": self.step,
            "max_abs": _json_num(self.max_abs),
            "wasserstein": _json_num(self.wasserstein),
            "wasserstein_error_bound": _json_num(self.wasserstein_bound),
            "wasserstein_method": self.method,
            "per_tensor": self.per_tensor,
            "per_layer": self.per_layer,
            "mismatches": self.mismatches,
            "nonfinite": self.nonfinite,
        }


def _json_num(x: float) -> float | None:
    return None if math.isnan(x) else x


def check_limits(sketch_points: int, exact_limit: int) -> None:
    """ValueError unless sketch_points >= 1 and exact_limit >= 0 (integers)."""
    if type(sketch_points) is not int or sketch_points < 1:
        raise ValueError(f"sketch_points={sketch_points!r} is not allowed; it must be a positive integer")
    if type(exact_limit) is not int or exact_limit < 0:
        raise ValueError(f"exact_limit={exact_limit!r} is not allowed; it must be a non-negative integer")


def _nonfinite(x: np.ndarray) -> int:
    """How many values are NaN or +-Inf (in chunks: no full-size mask)."""
    return x.size - sum(int(np.count_nonzero(np.isfinite(x[i : i + CHUNK]))) for i in range(0, x.size, CHUNK))


@dataclass
class _Pair:
    """What compare_checkpoints accumulates over the tensors of a pair."""

    points: int
    per_tensor: dict = field(default_factory=dict)
    nonfinite: dict = field(default_factory=dict)
    whole: _Sketch = field(default_factory=_Sketch)
    layers: dict = field(default_factory=dict)
    max_abs: float = 0.0

    def add(self, name: str, a: np.ndarray, b: np.ndarray) -> None:
        bad_a, bad_b = _nonfinite(a), _nonfinite(b)
        if bad_a or bad_b:
            self.nonfinite[name] = {"a": bad_a, "b": bad_b, "numel": int(a.size)}
            return
        mx = _max_abs(a, b)
        a.sort()
        b.sort()
        self.per_tensor[name] = {"max_abs": mx, "wasserstein": _mean_abs_sorted(a, b), "numel": int(a.size)}
        self.max_abs = max(self.max_abs, mx)
        self._sides(name, _side(a, self.points), _side(b, self.points))

    def _sides(self, name: str, sa: tuple, sb: tuple) -> None:
        self.whole.add_sides(sa, sb)
        self.layers.setdefault(layer_of(name), _Sketch()).add_sides(sa, sb)

    def add_spilled(
        self, name: str, load_a: Callable[[], np.ndarray], load_b: Callable[[], np.ndarray], folder: Path
    ) -> None:
        """As add, holding one tensor at a time: A's unsorted and sorted copies go to `folder` first."""
        a = load_a()
        bad_a, raw, srt = _nonfinite(a), folder / "a.raw", folder / "a.sorted"
        a.tofile(raw)
        a.sort()
        a.tofile(srt)
        side_a, dtype = _side(a, self.points), a.dtype
        del a
        b = load_b()
        bad_b = _nonfinite(b)
        if bad_a or bad_b:
            self.nonfinite[name] = {"a": bad_a, "b": bad_b, "numel": int(b.size)}
            return
        mx = _chunks_of_file(raw, dtype, b, lambda x, y: float(np.max(np.abs(x - y), initial=0.0)), max)
        b.sort()
        total = _chunks_of_file(srt, dtype, b, lambda x, y: float(np.abs(x - y).sum()), lambda s, t: s + t)
        self.per_tensor[name] = {"max_abs": mx, "wasserstein": total / b.size, "numel": int(b.size)}
        self.max_abs = max(self.max_abs, mx)
        self._sides(name, side_a, _side(b, self.points))


def _chunks_of_file(path: Path, dtype: np.dtype, b: np.ndarray, fn: Callable, join: Callable) -> float:
    """join over chunks of fn(A chunk as float64, the same slice of b), A read from `path` in order."""
    acc = 0.0
    with open(path, "rb") as f:
        for i in range(0, b.size, CHUNK):
            a = np.fromfile(f, dtype=dtype, count=min(CHUNK, b.size - i)).astype(np.float64)
            acc = join(acc, fn(a, b[i : i + CHUNK]))
    return acc


def compare_checkpoints(
    path_a: str | Path,
    path_b: str | Path,
    *,
    step: int = 0,
    sketch_points: int = 4096,
    exact_limit: int = 20_000_000,
    on_progress: ProgressFn | None = None,
) -> PairResult:
    """Compare two checkpoints tensor by tensor (memory: two tensors at a time, plus the sketches).
    on_progress(done, total, tensor name) after each tensor the two have in common."""
    check_limits(sketch_points, exact_limit)
    ra = open_checkpoint(path_a)
    try:
        rb = open_checkpoint(path_b)
        try:
            return _compare(ra, rb, step, sketch_points, exact_limit, on_progress)
        finally:
            rb.close()
    finally:
        ra.close()


def _mismatch_words(mism: dict) -> str:
    """Why nothing was compared, in a few words: names on one side only, shapes that differ (3 of each)."""

    def names(key: str) -> str:
        items = mism[key]
        return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")

    words = [
        f"only in A: {names('only_in_a')}" if mism["only_in_a"] else "",
        f"only in B: {names('only_in_b')}" if mism["only_in_b"] else "",
    ]
    words += [f"{m['name']} is {tuple(m['a'])} in A, {tuple(m['b'])} in B" for m in mism["shape"][:3]]
    return "; ".join(w for w in words if w) or "both are empty"


def _compare(ra: Reader, rb: Reader, step: int, sketch_points: int, exact_limit: int, on_progress) -> PairResult:
    ka, kb = ra.keys(), rb.keys()
    mism = {"only_in_a": sorted(set(ka) - set(kb)), "only_in_b": sorted(set(kb) - set(ka)), "shape": [], "dtype": []}
    common = [k for k in ka if k in kb]
    total = sum(math.prod(ka[k][0]) for k in common if ka[k][0] == kb[k][0])
    exact = total <= exact_limit
    acc = _Pair(points=total + 1 if exact else sketch_points)
    with tempfile.TemporaryDirectory(prefix="flashcheck-drift-") as tmp:
        for i, name in enumerate(common, 1):
            (sa, da), (sb, db) = ka[name], kb[name]
            if sa != sb:
                mism["shape"].append({"name": name, "a": list(sa), "b": list(sb)})
            elif math.prod(sa) == 0:
                pass
            else:
                if da != db:
                    mism["dtype"].append({"name": name, "a": str(da), "b": str(db)})  # compared all the same
                _add_pair(acc, name, ra, rb, math.prod(sa) * max(4, da.itemsize, db.itemsize), Path(tmp))
            if on_progress is not None:
                on_progress(i, len(common), name)
    if not acc.per_tensor and not acc.nonfinite:
        raise CheckpointError(
            f"{str(ra.path)!r} and {str(rb.path)!r} have no tensor in common to compare ({_mismatch_words(mism)})"
        )
    w, bound = acc.whole.w1() if acc.per_tensor else (math.nan, math.nan)
    per_layer = {}
    for lname, sk in acc.layers.items():
        lw, lb = sk.w1()
        per_layer[lname] = {"wasserstein": lw, "wasserstein_error_bound": lb, "numel": sk.n}
    max_all = acc.max_abs if acc.per_tensor else math.nan
    method = "exact" if exact else f"sketch({sketch_points})"
    return PairResult(step, max_all, w, bound, method, acc.per_tensor, per_layer, mism, acc.nonfinite)


def _add_pair(acc: _Pair, name: str, ra: Reader, rb: Reader, nbytes: int, tmp: Path) -> None:
    """Tensor `name` of both checkpoints into acc: both held at once, or one at a time from SPILL_BYTES."""
    if nbytes >= SPILL_BYTES:
        acc.add_spilled(name, lambda: _values(ra.tensor(name)), lambda: _values(rb.tensor(name)), tmp)
        return
    a, b = _values(ra.tensor(name)), _values(rb.tensor(name))
    acc.add(name, a, b)


def series_pairs(a: str | Path, b: str | Path) -> list[tuple[int, Path, Path]]:
    """(step, checkpoint of A, checkpoint of B) matched by step (two single checkpoints: step 0)."""
    sa, sb = series(a), series(b)
    if len(sa) == 1 and len(sb) == 1:
        return [(0, next(iter(sa.values())), next(iter(sb.values())))]
    steps = sorted(set(sa) & set(sb))
    if not steps:
        raise CheckpointError(f"no common steps: {str(a)!r} has {sorted(sa)[:8]}, {str(b)!r} has {sorted(sb)[:8]}")
    return [(s, sa[s], sb[s]) for s in steps]


def _common_count(pa: Path, pb: Path) -> int:
    ra = open_checkpoint(pa)
    try:
        rb = open_checkpoint(pb)
        try:
            return len(set(ra.keys()) & set(rb.keys()))
        finally:
            rb.close()
    finally:
        ra.close()


def compare_series(a: str | Path, b: str | Path, *, on_progress: ProgressFn | None = None, **kw) -> list[PairResult]:
    """Pairs of checkpoints matched by step (or two single checkpoints as step 0); keyword arguments as
    compare_checkpoints. on_progress(done, total, note) counts the tensors of every pair."""
    check_limits(kw.get("sketch_points", 4096), kw.get("exact_limit", 20_000_000))
    plan = series_pairs(a, b)
    if on_progress is None:
        return [compare_checkpoints(pa, pb, step=s, **kw) for s, pa, pb in plan]
    counts = [_common_count(pa, pb) for _, pa, pb in plan]
    out = []
    for (s, pa, pb), offset in zip(plan, np.cumsum([0, *counts[:-1]]).tolist(), strict=True):

        def report(done: int, _n: int, name: str, s: int = s, offset: int = offset) -> None:
            on_progress(offset + done, sum(counts), f"step {s} {name}")

        out.append(compare_checkpoints(pa, pb, step=s, on_progress=report, **kw))
    return out


def slope(steps: list[int], values: list[float]) -> float:
    """Least-squares slope of values over steps (0 for fewer than two points)."""
    if len(steps) < 2:
        return 0.0
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum()) if (x * x).sum() > 0 else 0.0
