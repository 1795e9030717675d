"""Query-row tiling shared by the simulators: a row's result depends on its own scores only, so a kernel may
run over chunks of query rows.

A BLAS sums a row of a product in an order that depends on the product's shape and on where the row sits in
it: a micro-kernel covers a panel of rows, and the rows of a last partial panel go to another kernel (measured
with torch 2.13's MKL on an AVX-512 AMD EPYC: float64 rows past the last multiple of 4, float32 products under
4 rows; elsewhere products under 6 rows were seen). `mm_blocks` takes that choice away from the chunking: every
product it forms has exactly ROW_BLOCK rows (zero-padded), and row r of the whole operand always sits at
position r % ROW_BLOCK, so a chunked run issues the very GEMM calls an unchunked one does, row for row, on any
BLAS. The standard kernel and the FP64 reference form their products so; the flash simulator's query tiles
(`mm_rows`) only pad products cut below MIN_ROWS (blocked products measured 1.3 to 2.5 times slower per step
at its tile shapes), so its tilings agree to a few units in the last place, not bit for bit."""

from __future__ import annotations

import os
import time

import torch

from flashcheck.core.numerics import Policy, batch_shape
from flashcheck.kernels.sim.ops import mm

MIN_ROWS = 8
ROW_BLOCK = 64  # rows of every product mm_blocks forms (few calls at long L, little padding at short L)


def free_cores(loadavg: str | None = None, own_running: int | None = None, own_load: float | None = None) -> int:
    """The CPU cores this process may use that no other runnable task holds (at least 1): its affinity set
    less the larger of the 1-minute load average less this process's own share of it (at least one: this
    caller's thread) and the other tasks running this instant (/proc/loadavg's 4th field less this process's
    own running threads, e.g. OpenMP workers still spinning after an op). The larger one, because a pool that
    guesses free cores wrongly runs several times slower than one thread (measured at load 6 on 2 cores,
    L=2048: 1.0 s against 0.24 s), while one that guesses busy wrongly loses at most its speed-up. The own
    share (`own_load`: None measures the cores this process kept busy over the last minute) keeps a process's
    own two-thread work from reading as another task's load (a 32k forward after a 2-thread one ran on one
    thread, 2.3x SDPA). `loadavg` (that file's text) and `own_running`: None reads them; where they cannot be
    read or parsed, os.getloadavg, else every core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    own_avg = max(1.0, _own_load() if own_load is None else own_load)
    try:
        if loadavg is None:
            with open("/proc/loadavg") as f:
                loadavg = f.read()
        fields = loadavg.split()
        own = _own_running() if own_running is None else own_running
        busy = max(float(fields[0]) - own_avg, float(int(fields[3].split("/")[0]) - max(own, 1)))
    except (OSError, ValueError, IndexError):
        try:
            busy = os.getloadavg()[0] - own_avg
        except OSError:
            return cores
    return max(1, cores - int(max(busy, 0.0) + 0.5))


_CPU_SAMPLES: list[tuple[float, float]] = [(time.monotonic(), time.process_time())]  # (wall, this process's CPU)
LOAD_WINDOW_S = 60.0  # the load average's time constant


def _own_load() -> float:
    """The cores this process kept busy, on average, since the oldest sample of the last LOAD_WINDOW_S seconds
    (its CPU time over wall time; 0 before any time has passed)."""
    now = (time.monotonic(), time.process_time())
    while len(_CPU_SAMPLES) > 1 and now[0] - _CPU_SAMPLES[1][0] >= LOAD_WINDOW_S:
        _CPU_SAMPLES.pop(0)
    t0, c0 = _CPU_SAMPLES[0]
    _CPU_SAMPLES.append(now)
    if len(_CPU_SAMPLES) > 64:
        del _CPU_SAMPLES[1:-32]
    return (now[1] - c0) / (now[0] - t0) if now[0] > t0 else 0.0


def _own_running() -> int:
    """This process's threads in state R (running or runnable) now, from /proc/self/task (0 where absent)."""
    count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        count += stat[stat.rfind(")") + 1 :].split()[:1] == ["R"]
    return count


def rows_per_chunk(rows_total: int, row_bytes: int, max_bytes: int) -> int:
    """Query rows per chunk: as many as fit `max_bytes` at `row_bytes` each (at least MIN_ROWS, at most
    rows_total)."""
    return max(MIN_ROWS, min(rows_total, max_bytes // max(row_bytes, 1)))


def row_chunks(lq: int, rows: int) -> list[tuple[int, int]]:
    """(start, stop) of chunks of max(rows, MIN_ROWS) query rows covering [0, lq); a last chunk shorter than
    MIN_ROWS joins the one before it, so every chunk has at least MIN_ROWS rows (or all lq of them)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"chunk rows={rows!r} must be a positive integer")
    rows = max(rows, MIN_ROWS)
    out = [(r0, min(lq, r0 + rows)) for r0 in range(0, lq, rows)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < MIN_ROWS:
        out[-2:] = [(out[-2][0], lq)]
    return out


def rows_max(chunks: list[tuple[int, int]]) -> int:
    """The most rows any (start, stop) chunk has (0 for none)."""
    return max((r1 - r0 for r0, r1 in chunks), default=0)


def mm_rows(
    a: torch.Tensor, b: torch.Tensor, policy: Policy, rows_untiled: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """mm(a, b) for a [..., M, K] whose M the tiling cut below MIN_ROWS from `rows_untiled`: formed with
    zero rows added up to min(MIN_ROWS, rows_untiled), then cut back (each row of a product depends on its
    own row of a and on the product's shape only). Written into `out` [..., M, N] when given."""
    m = a.shape[-2]
    want = min(MIN_ROWS, rows_untiled)
    if m >= want:
        return mm(a, b, policy, out=out)
    pad = a.new_zeros((*a.shape[:-2], want - m, a.shape[-1]))
    prod = mm(torch.cat([pad, a], dim=-2), b, policy)[..., want - m :, :]
    return prod if out is None else out.copy_(prod)


def mm_blocks(
    a: torch.Tensor,
    b: torch.Tensor,
    policy: Policy | None,
    row0: int = 0,
    out: torch.Tensor | None = None,
    rows_total: int | None = None,
) -> torch.Tensor:
    """a @ b for a [..., M, K] holding rows row0 : row0 + M of a larger operand of `rows_total` rows (None: any
    number), b [..., K, N] -> [..., M, N]: formed block by block, each product of exactly
    block = min(ROW_BLOCK, rows_total) rows (rows r with the same r // block, zeros where a has none; an operand
    of at most ROW_BLOCK rows is so one product of its own shape, as an unblocked kernel forms it), each block
    copied into a fresh contiguous operand and its product formed in a fresh contiguous result, so that every
    chunking of the operand's rows issues the same GEMM calls for each row: the same shapes, strides and
    alignment (a row's result depends on its own data, the call's layout and its position there: all fixed;
    measured: under MKL_CBWR=COMPATIBLE a product written into a strided view differs from a fresh one).
    mm under `policy` (None: torch.matmul in a's dtype). Written into `out` when given (no autograd), else
    returned out of place (differentiable)."""
    m, n = a.shape[-2], b.shape[-1]
    size = ROW_BLOCK if rows_total is None else max(1, min(ROW_BLOCK, rows_total))
    if row0 + m > (rows_total or row0 + m):
        raise ValueError(f"rows {row0}:{row0 + m} lie outside an operand of rows_total={rows_total} rows")
    blocks = range(row0 // size, -(-(row0 + m) // size))
    if out is not None:  # one contiguous operand block and one product block, reused (fresh ones fault pages in)
        batch = batch_shape(a, b)
        blk = a.new_zeros((*a.shape[:-2], size, a.shape[-1]))
        prod = out.new_empty((*batch, size, n))
    pieces = []
    for j in blocks:
        lo, hi = max(j * size, row0) - row0, min((j + 1) * size, row0 + m) - row0  # rows of a
        head = lo + row0 - j * size  # the block's rows before a's first
        if out is None:
            padded = torch.nn.functional.pad(a[..., lo:hi, :], (0, 0, head, size - head - (hi - lo)))  # a copy
            pieces.append(_mm(padded, b, policy)[..., head : head + hi - lo, :])
            continue
        if hi - lo < size:
            blk.zero_()
        blk[..., head : head + hi - lo, :] = a[..., lo:hi, :]
        res = _mm(blk, b, policy, prod)
        out[..., lo:hi, :] = res[..., head : head + hi - lo, :]
    if out is not None:
        return out
    if not pieces:
        return a.new_zeros((*batch_shape(a, b), m, n))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-2)


def _mm(a: torch.Tensor, b: torch.Tensor, policy: Policy | None, out: torch.Tensor | None = None) -> torch.Tensor:
    if policy is not None:
        return mm(a, b, policy, out=out)
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
