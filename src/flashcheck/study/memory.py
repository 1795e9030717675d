"""Whether a study case fits in this machine's memory: kernels.sim.memory's estimate of one comparison, plus
the forked worker that runs it (a fresh process from the torch-preloaded fork server), against the available
memory shared by the workers."""

from __future__ import annotations

from dataclasses import replace

from flashcheck.kernels import SIMULATED_KERNELS
from flashcheck.kernels.sim.memory import (
    HEADROOM,
    Footprint,
    available_bytes,
    distinct_bytes,
    estimate_bytes,
    human_bytes,
    largest_fitting,
)
from flashcheck.study.cases import Case

MEMORY_SKIP = "too big for this machine's memory"
PROCESS_BYTES = 300 * 2**20  # a worker with torch imported (peak RSS before any case)
QUADRATIC_BACKENDS = ("sdpa-math",)  # real backends that materialise the L x L scores
# L x L arrays such a backend and its eager baseline hold at once, in fp32 at least (measured: sdpa-math:bf16
# at L=4096, H=4 peaks at 0.85 GiB in a fresh process; kernels.sim.memory's chunked model alone gave 0.63 GiB)
QUADRATIC_ARRAYS = 3


def case_footprint(c: Case) -> Footprint:
    """The sizes that set case `c`'s memory; a real backend counts as the kernel it resembles."""
    from flashcheck.core.numerics import info, parse_policy

    if c.kernel in SIMULATED_KERNELS:
        kernel, itemsize = c.kernel, parse_policy(c.policy).work_dtype.itemsize
    else:
        kernel = "standard" if c.kernel in QUADRATIC_BACKENDS else "flash"
        itemsize = info(c.policy).dtype.itemsize
    return Footprint(
        batch=c.batch,
        heads=c.heads,
        seq_len=c.seq_len,
        head_dim=c.head_dim,
        kernels=(kernel,),
        block_k=c.block_k or 128,
        work_itemsize=itemsize,
    )


def _case_bytes(c: Case, seq_len: int | None = None) -> int:
    """estimate_bytes of c's footprint (at `seq_len` when given), plus the L x L scores of a quadratic backend."""
    fp = case_footprint(c) if seq_len is None else replace(case_footprint(c), seq_len=seq_len)
    if c.kernel not in QUADRATIC_BACKENDS:
        return estimate_bytes(fp)
    lk = fp.seq_len if fp.seq_len_k is None else fp.seq_len_k
    return estimate_bytes(fp) + QUADRATIC_ARRAYS * fp.batch * fp.heads * fp.seq_len * lk * max(4, fp.work_itemsize)


# A worker evaluates a case's kernel, its baseline and two FP64 references one after another; what they free
# stays resident once glibc's mmap threshold has risen, so the peak above the imports exceeds the largest stage.
# Measured in fresh processes (flash fa3-fp8, outliers, H=2, L=4096, 2026-12-05): 246, 251, 266 MiB above the
# 223 MiB of the imports against a modelled 178 MiB (1.49x at worst; peaks 469-489 MiB against an estimate of
# 478 MiB before this factor). 1.5x keeps the bound an upper bound and within 3x of the peak.
CASE_ALLOCATOR_SPREAD = 1.5


def estimate_case_bytes(c: Case) -> int:
    """Peak bytes of one worker process evaluating case `c` (an upper bound)."""
    return PROCESS_BYTES + int(CASE_ALLOCATOR_SPREAD * _case_bytes(c))


def too_big(c: Case, available: int | None, workers: int) -> str | None:
    """Why case `c` cannot run when `workers` processes share `available` bytes; None when it fits
    (or when the available memory is unknown)."""
    if available is None:
        return None
    budget = int(HEADROOM * available) // max(1, workers) - PROCESS_BYTES
    need = _case_bytes(c)
    if need <= budget:
        return None
    largest = largest_fitting(lambda n: _case_bytes(c, n), budget, c.seq_len) if budget > 0 else 0
    split = f", split among {workers} workers" if workers > 1 else ""
    need_s, budget_s = distinct_bytes(need + PROCESS_BYTES, budget + PROCESS_BYTES)
    fits = f"the largest seq_len that fits is {largest}" if largest else "no seq_len fits"
    return (
        f"{MEMORY_SKIP}: needs about {need_s}; {human_bytes(available)} available now, a worker may plan on "
        f"{budget_s} ({HEADROOM:.0%} of it{split}); {fits} (in the memory available now)"
    )


__all__ = ["MEMORY_SKIP", "available_bytes", "case_footprint", "estimate_case_bytes", "too_big"]
