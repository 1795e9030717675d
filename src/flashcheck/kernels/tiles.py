"""Query-row tiling shared by the simulators: a row's result depends on its own scores only, so a kernel may
run over chunks of query rows, provided every product keeps the summation order it had unchunked.

BLAS sums a product of fewer than MIN_ROWS rows in another order (its small-matrix path; measured with
torch 2.13's CPU BLAS: 1 to 5 rows differ in the last bit from the same rows inside a larger product,
6 and more agree). So chunks have at least MIN_ROWS rows, and `mm_rows` pads a product whose rows were
cut below MIN_ROWS by the tiling back to the row count it would have had."""

from __future__ import annotations

import torch

from flashcheck.core.numerics import Policy
from flashcheck.kernels.ops import mm

MIN_ROWS = 8


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
