"""Whether a study case fits in this machine's memory: kernels.memory's estimate of one comparison, plus
the spawned worker that runs it, against the available memory shared by the workers."""

from __future__ import annotations

from dataclasses import replace

from flashcheck.kernels import SIMULATED_KERNELS
from flashcheck.kernels.memory import HEADROOM, Footprint, available_bytes, estimate_bytes, human_bytes, largest_fitting
from flashcheck.study.cases import Case

MEMORY_SKIP = "too big for this machine's memory"
PROCESS_BYTES = 300 * 2**20  # a spawned worker with torch imported (peak RSS before any case)
QUADRATIC_BACKENDS = ("sdpa-math",)  # real backends that materialise the L x L scores


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


def estimate_case_bytes(c: Case) -> int:
    """Peak bytes of one worker process evaluating case `c` (an upper bound)."""
    return PROCESS_BYTES + estimate_bytes(case_footprint(c))


def too_big(c: Case, available: int | None, workers: int) -> str | None:
    """Why case `c` cannot run when `workers` processes share `available` bytes; None when it fits
    (or when the available memory is unknown)."""
    if available is None:
        return None
    budget = int(HEADROOM * available) // max(1, workers) - PROCESS_BYTES
    fp = case_footprint(c)
    need = estimate_bytes(fp)
    if need <= budget:
        return None
    largest = largest_fitting(lambda n: estimate_bytes(replace(fp, seq_len=n)), budget, c.seq_len) if budget > 0 else 0
    share = f", {human_bytes(max(budget, 0))} for each of {workers} workers" if workers > 1 else ""
    fits = f"the largest seq_len that fits is {largest}" if largest else "no seq_len fits"
    return (
        f"{MEMORY_SKIP}: needs about {human_bytes(need + PROCESS_BYTES)}; "
        f"{human_bytes(available)} available{share}; {fits}"
    )


__all__ = ["MEMORY_SKIP", "available_bytes", "case_footprint", "estimate_case_bytes", "too_big"]
