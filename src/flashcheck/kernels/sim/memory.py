"""How much memory a comparison needs, checked against what this machine has before anything is allocated.

The model (bytes, N = B * H, w = the policy's working itemsize, 4 or 8): the inputs (FP64 originals, the
rounded copies and their FP64 reference copies), the outputs kept for the metrics, and the largest working
set of the stages, which run one after another: the FP64 reference's query chunk (rows x Lk scores, see
reference._chunk_rows, in one buffer every chunk reuses), the standard kernel's query chunk (rows x Lk
scores in one reused buffer, with the rounding temporaries of a cast, see standard.CHUNK_BYTES), and
flash's query tile x Bc score blocks (flash.TILE_BYTES) beside its O(L) state. A backward keeps the graph:
the reference's and the standard kernel's arrays for every chunk, L x L in all. Against the peak RSS of
real runs (VmHWM above a warmed-up process, H=8, D=64): measured / estimated = 0.77, 0.71, 0.64 for
compare at L = 1024, 4096, 8192 (bf16-mixed), 0.66 for compare --kernel standard at 4096, 0.58-0.61 in
fp64 (a policy that never rounds P: one score buffer); an upper bound within 2x (tests/test_memory.py keeps it one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from flashcheck.kernels.sim.flash import TILE_BYTES
from flashcheck.kernels.sim.reference import REFERENCE_BLOCK_BYTES
from flashcheck.kernels.sim.standard import CHUNK_BYTES
from flashcheck.kernels.sim.tiles import ROW_BLOCK, rows_per_chunk

# Arrays of the largest size alive at once, counted from the code (see the module docstring).
STANDARD_ARRAYS = 3  # one reused score buffer (exp and P in place) and the rounding temporaries of a cast
STANDARD_GRAPH_ARRAYS = 5  # with autograd: scores, exp(scores - m), P, and the rounding temporaries
FLASH_ARRAYS = 5  # the same for one Lq x Bc block
REFERENCE_ARRAYS = 1  # one reused score buffer, updated in place (a mask's bias is counted per batch row)
BACKWARD_ARRAYS = 3  # autograd keeps scores, P and the mask of every chunk
OUTPUT_ARRAYS = 10  # reference, candidate, baseline, reference of rounded inputs, metric temporaries
HEADROOM = 0.9  # share of the available memory a run may plan to use


class InsufficientMemory(ValueError):
    """A case that cannot fit here; the message names the sizes, the estimate, what is available and the
    largest seq_len that fits. A ValueError, so the CLI exits 2 and a study records the case as skipped."""

    def __init__(self, message: str, *, needed: int, available: int, largest_seq_len: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.largest_seq_len = largest_seq_len


@dataclass(frozen=True, slots=True, kw_only=True)
class Footprint:
    """The sizes that set a comparison's memory: q [B, H, L, D], k/v [B, H, Lk, D] (Lk = L by default)."""

    batch: int
    heads: int
    seq_len: int
    head_dim: int
    seq_len_k: int | None = None
    kernels: tuple[str, ...] = ("flash", "standard")
    block_k: int = 128
    work_itemsize: int = 8
    backward: bool = False
    rounds_p: bool = True  # the standard kernel rounds P (its cast's temporaries count)

    def describe(self) -> str:
        lk = "" if self.seq_len_k is None else f" Lk={self.seq_len_k}"
        return f"batch={self.batch} heads={self.heads} seq_len={self.seq_len}{lk} head_dim={self.head_dim}"


def estimate_bytes(fp: Footprint) -> int:
    """Peak bytes of one comparison with these sizes (an upper bound; Python ints, never overflows)."""
    n, lq, d = fp.batch * fp.heads, fp.seq_len, fp.head_dim
    lk = fp.seq_len if fp.seq_len_k is None else fp.seq_len_k
    w = fp.work_itemsize
    inputs = n * (lq + 2 * lk) * d * (8 + w + 8)
    outputs = OUTPUT_ARRAYS * n * lq * d * 8
    stages = [_reference_bytes(n, lq, lk, fp.backward, fp.batch)]
    if "standard" in fp.kernels:
        stages.append(_standard_bytes(n, lq, lk, d, w, fp.backward, fp.rounds_p))
    if "flash" in fp.kernels or "splitkv" in fp.kernels:
        block = min(fp.block_k, lk)
        rows = min(lq, rows_per_chunk(lq, n * block * w, TILE_BYTES))  # one query tile's score blocks
        stages.append(FLASH_ARRAYS * n * rows * block * w + 4 * n * lq * (d + 2) * w + rows * block * 9)
    if "splitkv" in fp.kernels:  # flash per chunk, plus a chunk mask bias (at most Lq x Lk) and 8 partials
        stages[-1] += lq * lk * (w + 1) + 8 * n * lq * (d + 1) * w
    return inputs + outputs + max(stages)


STANDARD_ALLOCATOR_SPREAD = 1.3  # the standard stage's share: 436 - 417 MiB over its 137 MiB seen, doubled for margin


def _standard_bytes(n: int, lq: int, lk: int, d: int, w: int, backward: bool, rounds_p: bool = True) -> int:
    """One query chunk's arrays (+ the causal bias and its bool mask), and the chunks' outputs before and
    after they are joined; with a backward, the graph of every chunk (L x L in all)."""
    if backward:
        return (STANDARD_GRAPH_ARRAYS + BACKWARD_ARRAYS) * n * lq * lk * w + lq * lk * 9
    rows = min(lq, rows_per_chunk(lq, n * lk * w, CHUNK_BYTES))
    blocks = 2 * n * ROW_BLOCK * lk * w  # tiles.mm_blocks' operand and product blocks
    arrays = (STANDARD_ARRAYS if rounds_p else 1) * n * rows * lk * w + rows * lk * 9 + 2 * n * lq * d * w + blocks
    # mm_blocks allocates and frees one [N, 64, Lk] block per 64 rows; once glibc's mmap threshold has risen they
    # come from the heap and freed ones stay resident: fresh processes peaked at 349, 370, 402 and 436 MiB for a
    # model of 417 (H=8, L=4096, bf16-mixed, 2026-12-04; the standard stage 137 of them), so the bound carries that.
    return int(arrays * STANDARD_ALLOCATOR_SPREAD)


def _reference_bytes(n: int, lq: int, lk: int, backward: bool, batch: int = 1) -> int:
    """One query chunk's scores and a causal or padding mask's bool and float64 bias for each batch row."""
    if backward:
        return BACKWARD_ARRAYS * n * lq * lk * 8
    row = 8 * n * lk
    rows = max(1, min(1024, lq, REFERENCE_BLOCK_BYTES // max(row, 1)))
    return REFERENCE_ARRAYS * rows * row + batch * rows * lk * 9 + 2 * ROW_BLOCK * row  # + mm_blocks' blocks


def available_bytes() -> int | None:
    """Memory this process can still use: MemAvailable (psutil or /proc/meminfo), capped by a cgroup
    limit; None where neither can be read (then nothing is refused)."""
    avail = _mem_available()
    limit = _cgroup_room()
    if avail is None:
        return limit
    return avail if limit is None else min(avail, limit)


def _mem_available() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """limit - usage of this process's cgroup (v2 memory.max, or v1 memory.limit_in_bytes)."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap, used = Path(limit).read_text().strip(), int(Path(usage).read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:
            return max(0, int(cap) - used)
    return None


def largest_fitting(need: Callable[[int], int], budget: int, upper: int) -> int:
    """The largest n in [0, upper] with need(n) <= budget (need grows with n); 0 when none does."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def distinct_bytes(need: int, budget: int) -> tuple[str, str]:
    """human_bytes of `need` and `budget`, with as many decimals as it takes for a need above the budget
    not to print as equal to it (20.5 GiB > 20.5 GiB would contradict the refusal)."""
    a, b = human_bytes(need), human_bytes(budget)
    for decimals in (2, 3, 4):
        if a != b or need <= budget:
            break
        a, b = human_bytes(need, decimals), human_bytes(budget, decimals)
    return a, b


def human_bytes(n: float, decimals: int = 1) -> str:
    """1.5 GiB, 12.0 PiB, 1.5e+09 PiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return (
                f"{n:.0f} {unit}"
                if unit == "B"
                else f"{n:.{decimals if n < 1e4 else 2}{'f' if n < 1e4 else 'e'}} {unit}"
            )
        n /= 1024
    raise AssertionError("unreachable")


def check_fits(fp: Footprint, available: int | None = None) -> int:
    """Raise InsufficientMemory unless `fp` fits in HEADROOM x `available` (default: available_bytes());
    returns the estimate in bytes."""
    need = estimate_bytes(fp)
    avail = available_bytes() if available is None else available
    if avail is None or need <= HEADROOM * avail:
        return need
    budget = int(HEADROOM * avail)
    largest = largest_fitting(lambda n: estimate_bytes(_with_len(fp, n)), budget, fp.seq_len)
    need_s, budget_s = distinct_bytes(need, budget)
    raise InsufficientMemory(
        f"{fp.describe()} needs about {need_s} ({_parts(fp)}); {human_bytes(avail)} is available now and a run "
        f"may plan on {HEADROOM:.0%} of it ({budget_s}); "
        f"{_hint(fp, budget, largest)} (in the memory available now, which changes from run to run)",
        needed=need,
        available=avail,
        largest_seq_len=largest,
    )


def _hint(fp: Footprint, budget: int, largest: int) -> str:
    """What would fit: the largest seq_len_k at this seq_len (when Lk is given), else the largest seq_len
    (Lk scaled with it), else the largest head_dim at this seq_len."""
    fields = {f: getattr(fp, f) for f in fp.__dataclass_fields__}
    if fp.seq_len_k is not None:
        lk = largest_fitting(lambda n: estimate_bytes(Footprint(**{**fields, "seq_len_k": n})), budget, fp.seq_len_k)
        if lk >= 1:
            return f"the largest seq_len_k that fits at seq_len={fp.seq_len} is {lk}"
    if largest >= 1:
        return f"the largest seq_len that fits is {largest}"
    d = largest_fitting(lambda n: estimate_bytes(Footprint(**{**fields, "head_dim": n})), budget, fp.head_dim)
    if d >= 1:
        return (
            f"even seq_len=1 does not fit at head_dim={fp.head_dim}; the largest head_dim that fits at "
            f"seq_len={fp.seq_len} is {d}"
        )
    return "even seq_len=1 does not fit: reduce batch, heads or head_dim"


def check_all_fit(footprints: Iterable[Footprint], available: int | None = None) -> None:
    """check_fits for each, reading the available memory once."""
    avail = available_bytes() if available is None else available
    for fp in footprints:
        check_fits(fp, avail)


def _with_len(fp: Footprint, n: int) -> Footprint:
    lk = None if fp.seq_len_k is None else math.ceil(fp.seq_len_k * n / max(fp.seq_len, 1))
    return Footprint(**{**{f: getattr(fp, f) for f in fp.__dataclass_fields__}, "seq_len": n, "seq_len_k": lk})


def _parts(fp: Footprint) -> str:
    parts = ["inputs", "FP64 reference chunks"]
    if "standard" in fp.kernels:
        parts.append("the standard kernel's L x L scores")
    if "flash" in fp.kernels:
        parts.append("flash's blocks")
    return ", ".join([*parts, "outputs"]) + (", backward graph" if fp.backward else "")
