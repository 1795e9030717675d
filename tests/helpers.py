"""Test helpers: the peers' acceptance rule (flash-attention's tests/test_flash_attn.py) through the project's
own `check_budget`, so the tests judge kernels exactly as users' tests do."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from flashcheck.core.budget import check_budget


def budget_ok(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, k: float) -> tuple[bool, str]:
    """The peers' rule: max|out - ref| <= k * max|base - ref| + 2 * max|(ref + 0.3 - 0.3) - ref| (reference in
    fp32, as flash-attention's tests round it), and the same on the mean error."""
    res = check_budget(out, ref, base, k=k, dtype=torch.float32, rule="peers")
    return res.passed, res.message()


def _figure_name(fname) -> str:
    """The file name a figure is saved under (atomic_target's temporary name mapped back)."""
    return re.sub(r"^\.(.+)\.[0-9a-f]{12}\.tmp(\.\w+)$", r"\1\2", Path(str(fname)).name)


@contextlib.contextmanager
def audited_figures(save: bool = True) -> Iterator[list[tuple[str, list[str], list[str]]]]:
    """Every figure saved inside the block as (file name, reporting.figures.figure_problems, y labels):
    wraps matplotlib's Figure.savefig, so it audits any report's figures (study, train-study). save=False
    writes an empty file instead of the PNG (the audit without the rendering, for speed)."""
    from matplotlib.figure import Figure

    from flashcheck.reporting.figures import figure_problems

    seen: list[tuple[str, list[str], list[str]]] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        name = _figure_name(fname)
        seen.append((name, figure_problems(self), [ax.get_ylabel() for ax in self.axes]))
        if not save:
            Path(fname).write_bytes(b"")
            return None
        return original(self, fname, *args, **kwargs)

    Figure.savefig = savefig
    try:
        yield seen
    finally:
        Figure.savefig = original


@contextlib.contextmanager
def figures_from(folder: Path) -> Iterator[list[str]]:
    """The file names of every figure saved inside the block; each is written as a copy of the PNG of that
    name in `folder` (a report already rendered from the same records) instead of being rasterised again, and
    rendered as usual where `folder` has none."""
    from matplotlib.figure import Figure

    saved: list[str] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        name = _figure_name(fname)
        saved.append(name)
        if not (folder / name).is_file():
            return original(self, fname, *args, **kwargs)
        Path(fname).write_bytes((folder / name).read_bytes())
        return None

    Figure.savefig = savefig
    try:
        yield saved
    finally:
        Figure.savefig = original


def scale_qkv(lq: int, lk: int, d: int = 16, heads: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded FP64 q [1, H, Lq, D], k, v [1, H, Lk, D] (keys doubled) for the scale and memory tests."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, heads, lk, d, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, heads, lk, d, generator=g, dtype=torch.float64)
    return q, k, v


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n inside the block, the caller's restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
