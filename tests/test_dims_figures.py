"""The attention-variant figures (gqa, decoding, ...; questions.variants.tables) draw each variant's mean over
seeds with its 95% interval, pool seeds only (a second length or split count is its own series), and pass
the figure audit (labels, legend = drawn series, distinct colours)."""

from __future__ import annotations

import math

import pytest
from tests.helpers import audited_figures

from flashcheck.questions.variants.tables import _draw, _groups, question_table
from flashcheck.reporting.verdicts import mean_interval
from flashcheck.study.cases import CaseRecord, evaluate_group, expand_sweep
from flashcheck.study.config import Sweep

pytest.importorskip("matplotlib")

SEEDS = (0, 1, 2)
GQA = Sweep(question="gqa", methods=("flash:bf16-mixed",), seq_lens=(32, 64), heads=4, kv_heads=(4, 1),
            head_dims=(16,), blocks=((16, 16),), causal=True, seeds=SEEDS, algorithm="fa2")  # fmt: skip
DECODING = Sweep(question="decoding", methods=("flash:bf16-mixed",), seq_lens=(1, 4), seq_lens_k=(64, 128),
                 heads=2, kv_heads=(1,), head_dims=(16,), blocks=((16, 16),), causal=True, seeds=SEEDS,
                 algorithm="fa2")  # fmt: skip


def _records(sw: Sweep) -> list[CaseRecord]:
    out: dict[str, CaseRecord] = {}
    by_inputs: dict[tuple, list] = {}
    for c in expand_sweep(sw):
        by_inputs.setdefault(c.input_key, []).append(c)
    for group in by_inputs.values():
        evaluate_group(group, lambda r: out.__setitem__(r.case_id, r))
    return [r for r in out.values() if r.status == "ok"]


@pytest.mark.parametrize("sw", [GQA, DECODING], ids=["gqa", "decoding"])
def test_dims_figure_has_intervals_over_seeds(sw, tmp_path):
    recs = _records(sw)
    groups = _groups(recs, sw.question, "rel_l2")
    assert groups and all(len(v) == len(SEEDS) for v in groups.values()), {k: len(v) for k, v in groups.items()}
    with audited_figures() as seen:
        path = _draw(recs, sw.question, tmp_path / f"{sw.question}.png")
    assert path is not None and path.is_file()
    assert [(name, problems) for name, problems, _ in seen] == [(f"{sw.question}.png", [])]
    header, rows = question_table(recs, sw.question)
    assert header[2:4] == ["rel-L2 (kernel)", "95% interval"] and all(r[-1] == str(len(SEEDS)) for r in rows)
    for (variant, x), vals in groups.items():  # the table's interval is mean_interval over the seeds' values
        est = mean_interval(vals)
        row = next(r for r in rows if r[0] == variant and r[1] == str(x))
        assert math.isfinite(est.low) and row[3] == f"[{est.low:.3g}, {est.high:.3g}]"


def test_a_second_length_is_its_own_series_not_pooled():
    """gqa at two lengths: the x axis is the K/V heads, so each length is a series (n = seeds, not 2 x seeds)."""
    names = {variant for variant, _ in _groups(_records(GQA), "gqa", "rel_l2")}
    assert any("seq_len=32" in n for n in names) and any("seq_len=64" in n for n in names), names


def test_the_figure_draws_error_bars(tmp_path):
    """Every series of the gqa figure is an error-bar line across the K/V heads (not one point per Hkv)."""
    from matplotlib.figure import Figure

    drawn = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        drawn.extend(c for ax in self.axes for c in ax.containers)
        return original(self, fname, *args, **kwargs)

    Figure.savefig = savefig
    try:
        _draw(_records(GQA), "gqa", tmp_path / "gqa.png")
    finally:
        Figure.savefig = original
    assert len(drawn) == 4 and all(c.has_yerr for c in drawn)  # flash and standard at each length
    assert all(len(c.lines[0].get_xdata()) == 2 for c in drawn)  # a line over the x axis (K/V heads 1 and 4)
