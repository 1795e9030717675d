"""The study report on synthetic records whose answer is known: verdicts (rule, interval, n), the structural
Br finding, the conclusion's sentences and links, the two views of error, figures' metadata."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from tests.helpers import audited_figures

from flashcheck.questions.paper.conclusion import conclusion
from flashcheck.questions.paper.findings import findings
from flashcheck.study.cases import CaseRecord, expand
from flashcheck.study.config import StudyConfig, Sweep
from flashcheck.study.points import sweep_points
from flashcheck.study.report import build_report

SEEDS = (0, 1, 2)
LENGTHS = (512, 1024, 2048, 4096)


def config(seeds=SEEDS) -> StudyConfig:
    both = ("flash:bf16", "flash:bf16-mixed")
    common = {"heads": 1, "seeds": seeds}
    return StudyConfig(
        name="synthetic",
        sweeps=(
            Sweep(question="seq_len", methods=both, seq_lens=LENGTHS, blocks=((16, 16),), **common),
            Sweep(question="block_area", methods=both, seq_lens=(1024,), blocks=((8, 8), (16, 16), (32, 32)), **common),
            Sweep(question="swapped", methods=both, seq_lens=(1024,), blocks=((16, 64), (64, 16)), **common),
        ),
    )


def known_error(c, growth: float) -> float:
    """Baseline 1e-3 (falling as L^-0.2); all-bf16 Flash 2x (L/512)^growth x (Bc/16)^-0.5 of it; bf16-mixed
    0.9x of it; +-2% noise per case. Br has no effect (the same value for the same Bc, as in the kernel)."""
    base = 1e-3 * (c.seq_len / 512) ** -0.2 * (1 + 0.02 * math.sin(7 * c.seed + c.seq_len))
    if c.kernel == "standard":
        return base
    if c.policy == "bf16-mixed":
        return base * 0.9 * (1 + 0.01 * math.cos(3 * c.seed))
    noise = 1 + 0.02 * math.sin(11 * c.seed + c.block_k + c.seq_len)
    return base * 2 * (c.seq_len / 512) ** growth * (c.block_k / 16) ** -0.5 * noise


def write_study(folder: Path, cfg: StudyConfig, growth: float = 0.5) -> dict[str, CaseRecord]:
    """study.json and records.jsonl with the known errors (both views)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps(cfg.to_dict()))
    records = {}
    for c in expand(cfg):
        e = known_error(c, growth)
        d = {
            "case_id": c.case_id,
            "case": dataclasses.asdict(c),
            "status": "ok",
            "errors": {"max_abs": e, "rel_l2": e / 10},
            "errors_rounded": {"max_abs": e / 2, "rel_l2": e / 20},
            "seconds": 0.1,
        }
        records[c.case_id] = CaseRecord.from_dict(d)
    (folder / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records.values()))
    return records


def by_id(found: list[dict]) -> dict[str, dict]:
    return {f["id"]: f for f in found}


def test_verdicts_on_a_known_answer(tmp_path):
    cfg = config()
    found = by_id(findings(cfg, write_study(tmp_path, cfg)))
    paper = found["flash_vs_baseline_bf16"]
    assert paper["status"] == "holds" and paper["holds"] is True and paper["n"] == 3
    truth = 2 * (4096 / 512) ** 0.5
    assert paper["interval"][0] < truth < paper["interval"][1] and "t interval" in paper["rule"]
    mixed = found["flash_vs_baseline_bf16_mixed"]
    assert mixed["status"] == "holds" and mixed["interval"][1] < 1  # 0.9x: lower than Baseline
    grows = found["grows_with_seq_len"]
    assert grows["status"] == "holds" and grows["n"] == len(LENGTHS) * 3
    assert grows["interval"][0] < 0.5 < grows["interval"][1] and "Kendall" in grows["rule"]
    base = grows["baseline_trend"]["estimate"]
    assert base["low"] < -0.2 < base["high"] and base["high"] < 0  # the Baseline's own fall is reported
    assert found["shrinks_with_block_area"]["status"] == "holds"
    assert found["swapped_blocks"]["status"] == "holds"  # Bc=16 worse than Bc=64
    br = found["br_no_effect"]
    assert br["status"] == "structural" and "test_block_q_does_not_change_forward_rows" in br["rule"]
    assert br["measured"].startswith("2 of 2 pairs")  # 16x16 (seq_len, block_area) vs 64x16 (swapped), 2 policies
    for f in found.values():
        assert set(f) >= {"id", "claim", "measured", "status", "holds", "rule", "interval", "n"}


def test_br_no_effect_says_when_the_sweep_has_no_br_pairs_and_fails_on_a_counterexample(tmp_path):
    """A custom sweep whose tiles never differ only in Br: "not measured by this sweep", not "0 of 0 pairs"
    beside a structural verdict; a pair that differs only in Br with different errors: does not hold."""
    cfg = StudyConfig(name="c", sweeps=(config().sweeps[0],))  # one tile (16x16): no pair
    br = by_id(findings(cfg, write_study(tmp_path / "one", cfg)))["br_no_effect"]
    assert br["measured"].startswith("not measured by this sweep") and "0 of 0" not in br["measured"]
    cfg = config()
    records = write_study(tmp_path / "pairs", cfg)
    for r in records.values():  # the swapped sweep's 64x16 tile now differs from 16x16 at the same Bc
        if r.case.block_q == 64 and r.case.block_k == 16:
            r.errors["max_abs"] *= 1.5
    br = by_id(findings(cfg, records))["br_no_effect"]
    assert br["status"] == "does not hold" and br["measured"].startswith("0 of 2 pairs")


def test_a_flat_trend_and_too_few_seeds_give_no_verdict(tmp_path):
    cfg = config()
    found = by_id(findings(cfg, write_study(tmp_path / "flat", cfg, growth=0.0)))
    assert found["grows_with_seq_len"]["status"] in ("inconclusive", "does not hold")
    two = config(seeds=(0, 1))
    found = by_id(findings(two, write_study(tmp_path / "two", two)))
    assert found["flash_vs_baseline_bf16"]["status"] == "inconclusive" and found["flash_vs_baseline_bf16"]["n"] == 2
    assert found["swapped_blocks"]["status"] == "inconclusive"


def test_points_carry_both_views_paired_by_seed(tmp_path):
    cfg = config()
    records = write_study(tmp_path, cfg)
    p = next(p for p in sweep_points(cfg.sweeps[0], records) if p.method == "flash:bf16" and p.seq_len == 4096)
    assert p.seeds == SEEDS and p.baseline == "standard:bf16"
    assert p.ratios() == pytest.approx([a / b for a, b in zip(p.values, p.base_values, strict=True)])
    assert p.own_ratio_estimate().value == pytest.approx(p.ratio_estimate().value)  # own = e/20 vs base/20


def test_conclusion_states_the_numbers_and_links_each_sentence(tmp_path):
    cfg = config()
    records = write_study(tmp_path, cfg)
    found = findings(cfg, records)
    pts = {sw.question: sweep_points(sw, records) for sw in cfg.sweeps}
    sentences = conclusion(found, pts)
    text = " ".join(t for t, _ in sentences)
    realistic, paper = sentences[0][0], sentences[1][0]
    assert realistic.startswith("Kernel-realistic") and "lower than it at 95% confidence" in realistic
    assert re.search(r"is 0\.9\d*x \[", realistic) and "L=4096" in realistic
    assert paper.startswith("Paper's policy") and re.search(r"5\.\d+x \[", paper)
    assert "Baseline's own max-abs falling" in text and "Bc" in text
    assert re.search(r"over lengths 512-4096 \(below it at 95% confidence\)", text)  # pooled: 0.9x, n=12
    assert {a for _, a in sentences} <= {"seq_len", "block_area", "problems"}


def test_report_opens_with_the_answer_and_its_links_resolve(tmp_path):
    cfg = config()
    write_study(tmp_path, cfg)
    with audited_figures(save=False) as seen:
        summary = build_report(tmp_path)
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    first = [
        "## Answer",
        "## Verdicts",
        "## Conclusion",
        "## Verdicts: rules and reasons",
        "## Skipped and failed cases",
    ]
    assert headings[:5] == first
    for c in summary["conclusion"]:
        assert f"](#{c['section']})" in md and f'<a id="{c["section"]}"></a>' in md
        assert f"href='#{c['section']}'" in page and f"id='{c['section']}'" in page
    assert page.index("Answer") < page.index("<img") < page.index("Verdicts") < page.index("Conclusion")
    assert "ratio on rel-L2 vs FP64 of the rounded inputs (kernel's own)" in md  # the second view, labelled
    assert re.search(r"\| flash:bf16 \| 4096 \| 64 \| 16x16 \| 3 \| [\d.e-]+ \[", md)  # mean [95%], n
    drawn = ["block_area.png", "headline.png", "seq_len.png", "swapped.png"]  # each drawn in place, atomically
    assert sorted(name for name, _, _ in seen) == drawn
    for name, problems, ylabels in seen:
        assert problems == [], (name, problems)
        assert all(re.search(r"max-abs|rel-L2", y) for y in ylabels if y), (name, ylabels)


def test_figure_problems_catches_what_the_old_figures_did(tmp_path):
    """A legend entry for a series drawn nowhere (x = 0 on a log axis), a repeated colour, one tick label for
    every tile, a linear axis over decades: each is reported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import figure_problems

    fig, ax = plt.subplots()
    ax.plot([1, 2], [1e-4, 1], color="C0", label="flash")
    ax.plot([0], [0.5], color="C0", label="standard")  # nothing visible on the log x axis
    ax.set_xscale("log")
    ax.set_xticks([1, 2], ["64x16", "64x16"])
    ax.legend()
    problems = " ".join(figure_problems(fig))
    assert "no x label" in problems and "repeated x tick labels" in problems
    assert "legend ['flash', 'standard'] but drawn ['flash']" in problems and "colour" in problems
    assert "linear y axis" in problems
    plt.close(fig)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], color="C0", label="a")
    ax.plot([1, 2], [2, 3], color="C1", label="b")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend()
    assert figure_problems(fig) == []
    plt.close(fig)


def test_figure_problems_catches_crowded_x_twin_styles_and_markers_without_a_legend():
    """The old padding.png (20 series at one length), two series in one colour and marker, and the old
    boundary.png (markers in four styles, none in a legend) are reported; one colour in two markers, hollow
    beside filled, and a legend for every marker style are fine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashcheck.reporting import Styler
    from flashcheck.reporting.figures import MAX_AT_ONE_X, figure_problems

    def axes():
        fig, ax = plt.subplots()
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        return fig, ax

    fig, ax = axes()
    style = Styler()
    for i in range(MAX_AT_ONE_X + 1):
        ax.errorbar([512], [1.0 + i], yerr=[[0.1], [0.1]], **style(f"s{i}"))
    ax.legend()
    assert figure_problems(fig) == [f"axes 0 (y): 9 series at x = 512 (at most {MAX_AT_ONE_X} can be told apart)"]
    plt.close(fig)
    fig, ax = axes()
    ax.plot([1, 2], [1, 2], color="C0", marker="o", label="a")
    ax.plot([1, 2], [2, 3], color="C0", marker="o", label="b")
    ax.plot([1, 2], [3, 4], color="C0", marker="s", label="c")  # the same colour, another marker: told apart
    ax.legend()
    assert figure_problems(fig) == ["axes 0 (y): one colour and marker for more than one series (['a', 'b'])"]
    plt.close(fig)
    fig, ax = axes()
    for marker, colour, face in (("o", "g", "g"), ("X", "r", "r"), ("o", "g", "none"), ("X", "r", "none")):
        ax.scatter([1, 2], [1, 2], marker=marker, edgecolors=colour, facecolors=face)
    assert figure_problems(fig) == ["axes 0 (y): 4 marker series with no legend entry"]
    plt.close(fig)
    fig, ax = axes()
    for i, (marker, colour, face) in enumerate((("o", "g", "g"), ("o", "g", "none"), ("X", "r", "r"))):
        ax.scatter([1, 2], [1, 2], marker=marker, edgecolors=colour, facecolors=face, label=f"k{i}")
    ax.legend()
    assert figure_problems(fig) == []
    plt.close(fig)


def test_the_cli_prints_the_conclusion_skipped_and_failed_cases(capsys):
    from flashcheck.cli.study import _print_findings

    summary = {
        "conclusion": [{"text": "Flash is fine at bf16-mixed.", "section": "seq_len"}],
        "findings": [{"id": "br_no_effect", "measured": "2 of 2 pairs", "status": "structural", "holds": True}],
        "skipped": [{"method": "flash-attn:bf16", "cases": 3, "reason": "needs a GPU"}],
        "failed": 1,
        "failures": [{"case": "flash:fa3-fp8 L=16", "error": "ValueError: power-of-two head dim"}],
    }
    _print_findings(summary, None, "out")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["Conclusion", "- Flash is fine at bf16-mixed."]
    assert "br_no_effect: structural — 2 of 2 pairs" in lines
    assert "skipped: flash-attn:bf16, 3 case(s): needs a GPU" in lines
    assert "  flash:fa3-fp8 L=16: ValueError: power-of-two head dim" in lines


def test_real_backends_against_their_baseline_and_flash_against_math(tmp_path):
    """eager 1e-3; SDPA math 0.6x and flash 0.7x of it in the original view, 0.4x and 0.5x in the kernel's own."""
    sw = Sweep(
        question="backends",
        methods=("sdpa-math:bf16", "sdpa-flash:bf16"),
        seq_lens=(64, 128),
        heads=1,
        seeds=SEEDS,
        metric="rel_l2",
    )
    cfg = StudyConfig(name="be", sweeps=(sw,))
    scale = {"eager": (1.0, 1.0), "sdpa-math": (0.6, 0.4), "sdpa-flash": (0.7, 0.5)}
    records = {}
    for c in expand(cfg):
        noise = 1 + 0.01 * math.sin(5 * c.seed + c.seq_len)
        view, own = scale[c.kernel]
        d = {
            "case_id": c.case_id,
            "case": dataclasses.asdict(c),
            "status": "ok",
            "errors": {"rel_l2": 1e-3 * view * noise},
            "errors_rounded": {"rel_l2": 1e-3 * own * noise},
            "seconds": 0.1,
        }
        records[c.case_id] = CaseRecord.from_dict(d)
    found = by_id(findings(cfg, records))
    assert found["backend_sdpa-math_bf16"]["status"] == "holds" and found["backend_sdpa-math_bf16"]["n"] == 6
    vs = found["backend_flash_vs_math_bf16"]
    assert vs["status"] == "holds" and vs["estimate"] == pytest.approx(1.25) and vs["n"] == 6
    pts = {"backends": sweep_points(sw, records)}
    text = next(t for t, a in conclusion(list(found.values()), pts) if a == "backends")
    assert "The CPU flash kernel against SDPA math at bf16" in text and "1.25x [" in text


def test_fa3_conclusion_states_the_papers_conditions_once():
    """The Table-3 sentence gives each row's paper ratio, and the conditions (the same for both rows) only once."""
    from flashcheck.questions.paper.findings import FA3_CONDITIONS, _fa3_findings

    found = [{**f, "status": "holds", "measured": "1.3x [1.2, 1.4] (n=12)"} for f in _fa3_findings([])]
    text = next(t for t, a in conclusion(found, {}) if a == "fa3")
    assert text.count(FA3_CONDITIONS) == 1 and text.count("Bernoulli(0.001)") == 1, text
    assert "= 1.7x; verdict: holds" in text and "= 2.6x; verdict: holds" in text


def test_fa3_paper_values_read_in_the_measured_ratios_order():
    """The paper's RMSEs are printed as Baseline / candidate, the order of the measured ratio beside them."""
    from flashcheck.questions.paper.findings import _fa3_findings

    found = {f["id"]: f for f in _fa3_findings([])}
    assert found["fa3_fp16"]["paper"].startswith("Baseline's RMSE 3.2e-04 / flash:fp16-mixed's 1.9e-04 = 1.7x (theirs:")
    assert found["fa3_fp8"]["paper"].startswith("Baseline's RMSE 2.4e-02 / flash:fa3-fp8's 9.1e-03 = 2.6x (theirs:")
    # the paper's conditions beside the row: what section 4.3 states and what it does not
    assert "Bernoulli(0.001)" in found["fa3_fp8"]["paper"] and "section 4.3" in found["fa3_fp8"]["paper"]
    assert "not stated: sequence length, head dim, number of heads, batch size" in found["fa3_fp8"]["paper"]


def test_section_headings_are_the_question_sets_titles_and_the_ids_stay_anchors(tmp_path):
    """Issue 34 item 13: a question's table is headed by its set's title, not its raw id (the id is the anchor)."""
    from flashcheck.study import registry

    cfg = config()
    write_study(tmp_path, cfg)
    with audited_figures(save=False):
        build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    headings = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    titles = registry.titles()
    asked = {s.question for s in cfg.sweeps}
    assert asked and all(q in titles for q in asked)
    for q in asked:
        assert titles[q] in headings and q not in headings
        assert f'<a id="{q}"></a>\n\n## {titles[q]}' in md


def test_what_to_do_cites_no_bound_from_an_inconclusive_ratio():
    """The tiny study's "What to do" cited 0.868x [0.63, 1.2] (n=2) as "at most 20% above it" while the answer
    says it settles nothing (fixa2-3): too few values, or an interval wider than the margin, is said so."""
    from flashcheck.questions.paper.conclusion import _within
    from flashcheck.reporting.verdicts import Estimate

    assert _within(Estimate(0.868, 0.63, 1.2, 2, "ratio")).startswith("too few values to settle it: n=2")
    assert _within(Estimate(1.08, 0.947, 1.23, 6, "ratio")) == (
        "inconclusive: between 5% less and 23% more at 95% confidence"
    )
    assert _within(Estimate(1.0, 0.95, 1.05, 6, "ratio")) == "at most 5% above it at 95% confidence"
