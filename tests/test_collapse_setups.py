"""arXiv 2606.06521's P-collapse closed form at the paper's own setting (4 sink tokens, i.i.d. N(0, 1) scores:
sink4:DELTA) and at the study's (one sink key, rows of unequal score spread: sink:DELTA)."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.core.inputs import InputSpec, make_qkv, sink_tokens
from flashcheck.measure.collapse import closed_form, closed_form_rows, collapse_fraction

H, L, D = 8, 1024, 64


def _fraction(dist: str, seed: int = 0):
    q, k, v = make_qkv(InputSpec(heads=H, seq_len=L, head_dim=D, distribution=dist, seed=seed))
    return q, k, collapse_fraction(q, k, v)


def _tol(phi: float, n: int) -> float:
    return 5 * math.sqrt(phi * (1 - phi) / n) + 2e-4  # 5 binomial sds (the rows share their keys: n per row)


def test_paper_setting_has_four_sinks_and_unit_scores():
    q, k, _ = make_qkv(InputSpec(heads=2, seq_len=256, head_dim=D, distribution="sink4:6", seed=1))
    s = q @ k.transpose(-1, -2) / D**0.5
    assert sink_tokens("sink4:6") == 4 and sink_tokens("sink:6") == 1 and sink_tokens("normal") == 0
    assert torch.allclose(s[..., :4], torch.full_like(s[..., :4], 6.0), atol=1e-12)
    rest = s[..., 4:]
    # each row's non-sink scores are u . k with |u| = 1: variance 1 in every row, not |q|^2 / D
    assert float(rest.var(dim=-1).mean()) == pytest.approx(1.0, abs=0.02)
    assert float(rest.var(dim=-1).std()) < 0.15


@pytest.mark.parametrize("delta", [4.0, 6.0])
def test_closed_form_holds_at_the_papers_setting(delta):
    _, _, got = _fraction(f"sink4:{delta:g}")
    phi = closed_form(delta)
    assert abs(got - phi) < _tol(phi, H * (L - 4)), (got, phi)


def test_at_the_studys_setting_the_row_spread_explains_the_miss():
    """One sink, rows of score variance |q|^2 / D: at Delta = 4 the plain closed form misses (the fraction is
    convex in sigma far in the tail) while the form averaged over the rows' spreads holds."""
    q, _, got = _fraction("sink:4")
    phi, rows = closed_form(4.0), closed_form_rows(q, 4.0)
    assert abs(got - rows) < _tol(rows, H * (L - 1)), (got, rows)
    assert abs(got / phi - 1) > 0.1 and rows > phi, (got, phi, rows)
