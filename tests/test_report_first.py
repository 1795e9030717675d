"""The study report answers its question first (plain sentences, the headline figure, the verdicts as a table,
then the details), and every figure the quick preset draws passes reporting.figures.figure_problems: both on a
quick-shaped folder of synthetic records (tests/quick_shaped.py, no kernel run), built once."""

from __future__ import annotations

import json
import math
import re

import pytest
from tests.helpers import audited_figures
from tests.quick_shaped import write_quick_shaped
from tests.test_study_report import config, write_study

from flashcheck.questions.paper.answer import PAPER_RATIO, answer
from flashcheck.questions.paper.findings import findings
from flashcheck.study.points import sweep_points
from flashcheck.study.report import build_report

OLD_KEYS = {
    "study",
    "conclusion",
    "findings",
    "cases",
    "failed",
    "skipped",
    "failures",
    "runs",
    "environment",
    "figures",
}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """(folder, summary, audited figures, the headline figure's series) of a quick-shaped study's report."""
    from matplotlib.figure import Figure

    from flashcheck.reporting.figures import _handle_data

    folder = tmp_path_factory.mktemp("quick")
    write_quick_shaped(folder)
    headline: dict[str, tuple] = {}

    with audited_figures(save=False) as seen:
        audited = Figure.savefig

        def keep(self, fname, *args, **kwargs):  # the headline's legend entries: (xs, ys) of each
            if "headline" in str(fname):
                for handle, label in zip(*self.axes[0].get_legend_handles_labels(), strict=True):
                    headline[label] = _handle_data(handle)[1:]
            return audited(self, fname, *args, **kwargs)

        Figure.savefig = keep
        try:
            summary = build_report(folder)
        finally:
            Figure.savefig = audited
    return folder, summary, seen, headline


@pytest.mark.xdist_group("quick_report")  # one worker computes the module fixture quick_report once
def test_the_report_opens_with_the_answer_then_the_headline_figure_then_the_verdict_table(quick_report):
    folder, summary, _, _ = quick_report
    md = (folder / "report.md").read_text()
    lines = [x for x in md.splitlines() if x.strip() and not x.startswith("<a id=")]
    assert lines[1] == "## Answer"
    assert lines[2] == summary["answer"][0] and lines[2].startswith("With fp32 statistics (real kernels)")
    lines = lines[:2] + lines[3:]  # the first sentence (test_the_first_sentence_...), then the sentences it sums up
    first = lines[2:5]  # three plain sentences: real kernels, the paper's policy, what follows
    assert first[0].startswith("Yes, for real kernels: with fp32 softmax statistics") and "0.946x [" in first[0]
    assert "no larger than standard attention's at 95% confidence" in first[0]
    assert first[1].startswith("With every stage in bf16 (the paper's policy) Flash deviates more: 8.02x [")
    assert "at L=8192 with 16x16 tiles, and the ratio grows with the length" in first[1]
    assert "The paper reports about 10x (all bf16" in first[1] and first[2].startswith("So the tiling is not")
    # then one line over the modern kernels quick also measures (questions.presets._quick_modern)
    assert lines[5].startswith("The 2026 kernels (a small part here; `flashcheck study --preset modern` measures")
    assert "FA4's bf16 kernel" in lines[5] and "FA3's FP8 path" in lines[5]
    assert [*first, lines[5]] == summary["answer"][1:]
    lines = lines[:5] + lines[6:]
    assert lines[5] == "![Flash / standard attention against the length, both policies](figures/headline.png)"
    assert lines[6:8] == ["## Verdicts", "| claim | ours (95% interval) | paper | verdict |"]
    shown = [f for f in summary["findings"] if f["status"] != "not measured"]  # the rest: one line at the end
    rows = [x for x in lines[9 : 9 + len(shown)]]
    assert len(rows) == len(shown) and all(r.startswith("| ") for r in rows)
    assert not lines[9 + len(shown)].startswith("| ")
    for f, row in zip(shown, rows, strict=True):  # one row per verdict, in order
        assert row.endswith(f"| {f['status']} |") and f["claim"] in row
    headings = [x for x in lines if x.startswith("## ")]
    assert headings[:5] == ["## Answer", "## Verdicts", "## Conclusion", "## Verdicts: rules and reasons",
                            "## The production guide's claims"]  # fmt: skip
    page = (folder / "report.html").read_text()
    assert page.index("Yes, for real kernels") < page.index("<img") < page.index("<th>claim</th>")
    assert page.index("<th>claim</th>") < page.index("id='conclusion'")
    assert OLD_KEYS | {"answer"} <= set(json.loads((folder / "summary.json").read_text()))


@pytest.mark.xdist_group("quick_report")  # one worker computes the module fixture quick_report once
def test_the_headline_figure_draws_both_policies_and_the_paper_across_every_length(quick_report):
    _, summary, _, headline = quick_report
    assert summary["figures"]["headline"] == "figures/headline.png"
    series = headline
    lengths = [512, 1024, 2048, 4096, 8192]
    bf16 = next(v for k, v in series.items() if k.startswith("all bf16"))
    mixed = next(v for k, v in series.items() if k.startswith("bf16-mixed"))
    assert bf16[0] == lengths and mixed[0] == lengths
    assert bf16[1][-1] == pytest.approx(8.02, rel=1e-3) and max(mixed[1]) < 1
    paper = next(v for k, v in series.items() if k.startswith("paper"))
    assert paper == ([0, 1], [PAPER_RATIO, PAPER_RATIO])  # a line across the whole axes, not a point at one L


def test_the_answer_follows_the_verdicts(tmp_path):
    """Not hard-coded: bf16-mixed 1.5x Baseline says "Not entirely" and drops the fp32 advice; a study
    without the seq_len question says it did not measure it."""
    cfg = config()
    records = write_study(tmp_path, cfg)
    for r in records.values():
        if r.case.policy == "bf16-mixed" and r.case.kernel == "flash":
            r.errors["max_abs"] *= 1.5 / 0.9
    pts = sweep_points(cfg.sweeps[0], records)
    said = answer(findings(cfg, records), pts)
    assert said[0].startswith("With fp32 statistics (real kernels), Flash's error is larger than standard")
    said = said[1:]
    assert said[0].startswith("Not entirely, for real kernels") and re.search(r"1\.5\d*x \[", said[0])
    assert "larger than standard attention's at 95% confidence" in said[0] and len(said) == 2
    assert answer([], [])[0].startswith("This study did not measure Flash against standard attention")


def test_a_smoke_test_says_so_first_and_an_inconclusive_ratio_is_not_called_indistinguishable(tmp_path):
    """tiny's shape (L = 64, 128, one seed): the first sentence says it is a smoke test at L=64-128; the pooled
    bf16-mixed ratio (n=2) and the verdict at the longest length (n=1) are inconclusive, so the answer says there
    is too little to say (not "Yes ... indistinguishable") and draws no conclusion about the tiling."""
    from flashcheck.study.config import StudyConfig, Sweep

    both = ("flash:bf16", "flash:bf16-mixed")
    sweep = Sweep(question="seq_len", methods=both, seq_lens=(64, 128), blocks=((16, 16),), heads=1, seeds=(0,))
    cfg = StudyConfig(name="tiny", sweeps=(sweep,))
    records = write_study(tmp_path, cfg)
    found, pts = findings(cfg, records), sweep_points(sweep, records)
    mixed = next(f for f in found if f["id"] == "flash_vs_baseline_bf16_mixed")
    assert mixed["status"] == "inconclusive"
    said = answer(found, pts, cfg)
    assert said[0].startswith("With fp32 statistics (real kernels), Flash's error is not settled") and "n=2" in said[0]
    said = said[1:]
    assert said[0].startswith("This is a smoke test (preset tiny) at L=64-128 with 1 seed") and "say little" in said[0]
    assert said[1].startswith("Too few seeds/lengths to say for real kernels") and "(n=2)" in said[1]
    assert "the verdict on it below is inconclusive" in said[1]
    assert not any("indistinguishable" in x or x.startswith(("Yes", "So the tiling")) for x in said)
    named = StudyConfig(name="synthetic", sweeps=(sweep,))
    assert answer(found, pts, named)[1:] == said[1:]  # not a smoke preset: no smoke sentence


def test_the_headline_says_when_no_point_has_an_interval_and_labels_ticks_between_decades(tmp_path, monkeypatch):
    """One seed per length: the title says there is no interval (not "mean and 95% interval"), and the ratio
    axis labels ticks between the powers of ten (2, 5, 20, ...), not only 10^0 and 10^1."""
    from matplotlib.figure import Figure

    from flashcheck.questions.paper.answer import draw_headline
    from flashcheck.study.config import StudyConfig, Sweep

    both = ("flash:bf16", "flash:bf16-mixed")
    sweep = Sweep(question="seq_len", methods=both, seq_lens=(64, 128), blocks=((16, 16),), heads=1, seeds=(0,))
    records = write_study(tmp_path, StudyConfig(name="tiny", sweeps=(sweep,)))
    seen: dict = {}
    save = Figure.savefig

    def keep(self, fname, *args, **kwargs):
        out = save(self, fname, *args, **kwargs)  # drawn: tick labels are set
        ax = self.axes[0]
        lo, hi = ax.get_ylim()
        minor = [
            t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi
        ]
        seen.update(title=ax.get_title(), minor=minor)
        return out

    monkeypatch.setattr(Figure, "savefig", keep)
    assert draw_headline(sweep_points(sweep, records), tmp_path / "headline.png") is not None
    assert seen["title"].endswith("mean (n=1 per point: no interval)") and "95%" not in seen["title"]
    assert {"2", "5"} <= set(seen["minor"])  # the axis spans about 0.9x to 10x (the paper's line)


@pytest.mark.xdist_group("quick_report")  # one worker computes the module fixture quick_report once
def test_every_figure_of_the_quick_preset_passes_figure_problems(quick_report):
    seen = quick_report[2]
    names = {name for name, _, _ in seen}
    assert {"padding.png", "boundary.png", "headline.png", "seq_len.png", "cost.png"} <= names
    assert len(seen) == len(names)  # each figure drawn once (the attention variants' no longer twice)
    for name, problems, _ in seen:
        assert problems == [], (name, problems)


def test_enough_values_whose_interval_contains_one_say_no_measurable_difference(monkeypatch):
    """quick's answer on this machine: bf16-mixed 0.99x [0.876, 1.12] (n=15), verdict inconclusive. Fifteen values
    are not "too few", but an interval that wide is not "no difference" either (issue 34): it reads "between 12%
    less and 12% more"; one within 10% either way says no measurable difference."""
    from flashcheck.questions.paper import answer as ans
    from flashcheck.reporting.verdicts import Estimate

    est = Estimate(0.99, 0.876, 1.12, 15, "geometric mean")
    monkeypatch.setattr(ans, "pooled_mixed", lambda points: (est, [512, 8192]))
    said = ans._real([], {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}})
    assert said.startswith("Inconclusive for real kernels") and "(n=15)" in said and "512-8192" in said
    assert "between 12% less and 12% more at 95% confidence" in said
    close = Estimate(0.99, 0.95, 1.04, 15, "geometric mean")
    monkeypatch.setattr(ans, "pooled_mixed", lambda points: (close, [512, 8192]))
    said = ans._real([], {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}})
    assert said.startswith("No measurable difference for real kernels") and "within 10% either way" in said
    few = Estimate(0.99, 0.5, 1.9, 2, "geometric mean")
    monkeypatch.setattr(ans, "pooled_mixed", lambda points: (few, [64, 128]))
    assert ans._real([], {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}}).startswith("Too few")


@pytest.mark.xdist_group("quick_report")  # the finished study is the module fixture's (one report build saved)
def test_an_unfinished_study_says_so_first_and_each_missing_part_is_not_measured_yet(quick_report, tmp_path):
    """`flashcheck report` on a study stopped early (a quarter of its cases, half its guide tasks): the first
    line of report.md, report.html, summary.json's `partial` and the command's output says "partial: K of N
    cases, G of T guide tasks; rerun the same command to finish"; no "None." for the problems, no "n=0" verdict
    or "L = ," condition: each missing part says "not measured yet". The finished study says nothing of it."""
    import shutil

    from typer.testing import CliRunner

    from flashcheck.cli import app
    from flashcheck.questions.guide.tasks import GUIDE_FILE
    from flashcheck.questions.presets import quick

    finished, whole, _, _ = quick_report
    assert whole["complete"] is True and whole["partial"] is None
    assert (finished / "report.md").read_text().startswith("# flashcheck study quick")
    folder = tmp_path / "stopped"
    shutil.copytree(finished, folder)
    cases = (folder / "records.jsonl").read_text().splitlines(keepends=True)
    tasks = (folder / GUIDE_FILE).read_text().splitlines(keepends=True)
    (folder / "records.jsonl").write_text("".join(cases[: len(cases) // 4]))
    (folder / GUIDE_FILE).write_text("".join(tasks[: len(tasks) // 2]))
    from flashcheck.questions.guide.tasks import tasks as planned_tasks

    with audited_figures(save=False) as seen:  # no test here looks at its PNGs: audited, not rendered
        out = CliRunner().invoke(app, ["report", str(folder)])  # the one report build of the stopped study
    assert seen and all(problems == [] for _, problems, _ in seen), seen
    summary = json.loads((folder / "summary.json").read_text())
    n_tasks = len(planned_tasks(quick().settings["guide"]))  # the GPU tasks too, where a GPU is
    first = (
        f"partial: {len(cases) // 4} of {len(cases)} cases, {len(tasks) // 2} of {n_tasks} guide tasks; rerun the "
        "same command to finish"
    )
    assert out.exit_code == 0 and out.stdout.splitlines()[0] == first, out.output
    assert summary["complete"] is False and summary["partial"] == first
    md = (folder / "report.md").read_text()
    page = (folder / "report.html").read_text()
    assert md.splitlines()[0] == f"**{first}**"
    assert page.split("<body>", 1)[1].startswith(f"<p class='partial'>{first}</p>") and f"<title>{first}" in page
    assert "None." not in md and "None so far" in md
    assert "n=0" not in md and "L = ," not in md and "nan (" not in md, [
        ln for ln in md.splitlines() if "n=0" in ln or "L = ," in ln or "nan (" in ln
    ]
    assert md.count("not measured yet") >= 10
    assert "not measured by this study" not in out.stdout and "not measured yet (" in out.stdout  # resuming does


@pytest.mark.xdist_group("quick_report")
def test_no_table_of_the_quick_report_shows_a_python_literal(quick_report):
    """The guide's fp16 boundary table printed `True` in its monotone column; every cell reads as words."""
    folder = quick_report[0]
    cells = [c.strip() for ln in (folder / "report.md").read_text().splitlines() if ln.startswith("|")
             for c in ln.strip("|").split(" | ")]  # fmt: skip
    assert cells and not {"True", "False", "None", "nan"} & set(cells), sorted(set(cells))[:50]


@pytest.mark.xdist_group("quick_report")
def test_the_first_sentence_answers_in_30_words_with_the_verdicts_numbers(quick_report):
    """The quick report opened with 70 words and three intervals; now with at most 30: about the same / larger
    / smaller, the pooled bf16-mixed ratio and its interval as a margin, the all-bf16 verdict row's ratio at its
    length. Its numbers are those of the estimates and verdict rows after it (recomputed here), not written in."""
    from flashcheck.questions.paper.answer import FIRST_WORDS, pooled_mixed
    from flashcheck.study.config import StudyConfig
    from flashcheck.study.store import ResultStore, read_study_json

    folder, summary, _, _ = quick_report
    first = summary["answer"][0]
    assert len(first.split()) <= FIRST_WORDS == 30, first
    config = StudyConfig.from_dict(read_study_json(folder), "study.json")
    sweep = next(sw for sw in config.sweeps if sw.question == "seq_len")
    est, _ = pooled_mixed(sweep_points(sweep, ResultStore(folder).load()))
    bf16 = next(f for f in summary["findings"] if f["id"] == "flash_vs_baseline_bf16")
    word = "smaller than" if est.high < 1 else "larger than" if est.low > 1 else None
    margin = f"{est.low:.2g}-{est.high:.2g}x" if word else f"within ±{max(1 - est.low, est.high - 1):.0%}"
    assert first == (
        f"With fp32 statistics (real kernels), Flash's error {f'is {word}' if word else 'matches'} standard "
        f"attention's ({est.value:.2g}x, {margin}); with all stages in bf16 it is {bf16['estimate']:.2g}x at 8k tokens."
    )
    md = (folder / "report.md").read_text()
    assert md.split("## Answer\n\n", 1)[1].startswith(first + "\n")


def test_the_first_sentence_follows_other_numbers(tmp_path):
    """Not hard-coded: a synthetic study whose bf16-mixed ratio is about 1 within its margin says "matches"
    with that margin; one that holds no all-bf16 points says only the real kernels' half; none, no sentence."""
    from flashcheck.questions.paper.answer import first_sentence

    cfg = config()
    records = write_study(tmp_path, cfg)
    for r in records.values():  # bf16-mixed Flash = Baseline within +-1%
        if r.case.policy == "bf16-mixed" and r.case.kernel == "flash":
            r.errors["max_abs"] *= (1 + 0.01 * math.sin(5 * r.case.seed + r.case.seq_len)) / 0.9
    pts, found = sweep_points(cfg.sweeps[0], records), findings(cfg, records)
    est = next(f for f in found if f["id"] == "flash_vs_baseline_bf16")["estimate"]
    said = first_sentence(found, pts)
    assert re.fullmatch(
        r"With fp32 statistics \(real kernels\), Flash's error matches standard attention's \(1(\.0)?x, within "
        rf"±\d%\); with all stages in bf16 it is {est:.2g}x at 4k tokens\.",
        said,
    ), said
    mixed_only = [p for p in pts if p.method == "flash:bf16-mixed"]
    assert first_sentence([], mixed_only) == said.split(";")[0] + "." and first_sentence([], []) is None
