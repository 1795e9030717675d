"""The study engine and its question sets (study.registry): a set registered by a test, not shipped, runs and
reports through the engine without an edit to it; the engine's files name no registered set, preset, question
or verdict; the shipped sets and their order."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.reporting import Heading, Text
from flashcheck.reporting.verdicts import compare, ratio_interval
from flashcheck.study import registry
from flashcheck.study.cases import Case, CaseRecord, expand_sweep
from flashcheck.study.config import StudyConfig, Sweep, preset
from flashcheck.study.part import Part, Study
from flashcheck.study.points import finding, ratio_text, sweep_points
from flashcheck.study.registry import QuestionSet
from flashcheck.study.report import build_report

ENGINE = Path(__file__).resolve().parents[1] / "src" / "flashcheck" / "study"
QUESTION = "example_fp16"


def _example_preset() -> StudyConfig:
    """Flash fp16 against standard attention at fp16 (its baseline), three seeds at a toy size."""
    sweep = Sweep(
        question=QUESTION, methods=("flash:fp16",), seq_lens=(64,), seeds=(0, 1, 2), heads=1, blocks=((16, 16),)
    )
    return StudyConfig(name="example", sweeps=(sweep,))


def _example_findings(study: Study) -> list[dict]:
    pts = [p for p in study.points.get(QUESTION, []) if p.baseline]
    est = ratio_interval([v for p in pts for v in p.values], [v for p in pts for v in p.base_values]) if pts else None
    verdict = compare(est, above=False, threshold=100.0) if est is not None else None
    claim = "flash fp16 deviates less than 100x standard attention at fp16"
    return [finding("example_within_100x", claim, ratio_text(est), verdict, paper="made up", section=QUESTION)]


def _example_report(study: Study) -> Part:
    mine = [f for f in study.found if f["id"] == "example_within_100x"]
    if not mine or mine[0]["status"] == "not measured":
        return Part()
    return Part(
        answer=[f"The example set answers first: {mine[0]['measured']}."],
        brief=["The example set's one line."],
        sentences=[(f"Example: {mine[0]['status']}.", QUESTION)],
        summary={"example": {"n": mine[0]["n"]}},
        end=[Heading("The example's own section", anchor="example"), Text("Written by the example set.")],
    )


EXAMPLE = QuestionSet(
    name="example",
    order=5,  # before every shipped set: it leads the Answer of any study that measures it
    presets={"example": _example_preset},
    findings=_example_findings,
    report=_example_report,
    notes={QUESTION: "A question set registered by a test."},
)


def test_an_example_question_set_registered_by_a_test_runs_and_reports_through_the_engine(tmp_path):
    """Adding a set is a register() call: its preset runs from the CLI, its verdict, Answer, conclusion sentence,
    summary key, note and section appear in the report, and the shipped sets' lines follow in their order."""
    out = tmp_path / "ex"
    with registry.registered(EXAMPLE):
        assert preset("example") == _example_preset()
        res = CliRunner().invoke(app, ["study", "--preset", "example", "--out", str(out), "--workers", "1"])
        assert res.exit_code == 0, res.output
        summary = json.loads((out / "summary.json").read_text())
    by = {f["id"]: f for f in summary["findings"]}
    assert summary["findings"][0]["id"] == "example_within_100x"  # order 5: its verdicts before the paper's
    assert by["example_within_100x"]["status"] == "holds" and by["example_within_100x"]["n"] == 3
    assert summary["answer"][0].startswith("The example set answers first: ")
    assert "did not measure" not in " ".join(summary["answer"])  # it leads: the paper's fallback is not said
    assert summary["conclusion"][0] == {"text": "Example: holds.", "section": QUESTION}
    assert summary["example"] == {"n": 3}
    md = (out / "report.md").read_text()
    assert "A question set registered by a test." in md and "Written by the example set." in md
    assert md.index("Written by the example set.") > md.index(f"## {QUESTION}")  # end blocks after the questions
    assert "example_within_100x" in res.output and "The example set answers first" in res.output
    assert "example" not in registry.presets() and all(s.name != "example" for s in registry.sets())


def test_a_set_that_leads_gives_the_others_brief_lines_and_a_solo_preset_shows_its_verdicts_alone(tmp_path):
    """The Answer's composition: the first set (in order) with an answer leads, the rest add their brief line;
    with none, the first fallback; a solo preset's report holds its set's verdicts alone."""
    from flashcheck.study.report import _answer, report_parts

    late = dataclasses.replace(EXAMPLE, name="late", order=99, presets={}, solo=frozenset({"only-late"}))
    rec, cfg = _ok_records(), _example_preset()
    study = Study(folder=tmp_path, config=cfg, records=rec, ok=rec, points={QUESTION: sweep_points(cfg.sweeps[0], rec)})
    study = dataclasses.replace(study, found=_example_findings(study))
    with registry.registered(EXAMPLE), registry.registered(late):
        parts, lead = report_parts(study)
        said = _answer(parts, lead)
        assert said[0].startswith("The example set answers first") and said[-1] == "The example set's one line."
        (tmp_path / "study.json").write_text(json.dumps(dataclasses.replace(cfg, name="only-late").to_dict()))
        (tmp_path / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in rec.values()))
        summary = build_report(tmp_path)
    assert [f["id"] for f in summary["findings"]] == ["example_within_100x"]  # no paper, variants or modern rows


def _ok_records() -> dict[str, CaseRecord]:
    """Made-up ok records of the example's sweep: flash twice its baseline's error at every seed."""
    out = {}
    for c in expand_sweep(_example_preset().sweeps[0]):
        e = (2e-3 if c.kernel == "flash" else 1e-3) * (1 + c.seed / 10)
        errors = dict.fromkeys(("max_abs", "mean_abs", "std", "rmse", "rel_l2"), e)
        out[c.case_id] = CaseRecord(
            case_id=c.case_id,
            case=c,
            status="ok",
            errors=errors,
            errors_rounded=errors,
            seconds=0.0,
            error=None,
            env={},
        )
    return out


def test_the_engine_names_no_registered_set_preset_question_or_verdict():
    """No string in study/*.py is a set's name, a preset, a question or a verdict id (the engine reads them from
    the registry), except the names of Sweep's and Case's fields and a finding's keys (the grammar)."""
    names = set()
    for s in registry.sets():
        names |= {s.name, *s.presets, *s.notes, *s.published, *s.draw, *s.cells, *s.files}
        if s.settings is not None:
            names.add(s.settings[0])
    for make in registry.presets().values():
        names |= {sw.question for sw in make().sweeps}
    grammar = {f.name for f in dataclasses.fields(Sweep)} | {f.name for f in dataclasses.fields(Case)} | {"paper"}
    said = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names - grammar:
                said.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert len(names - grammar) > 30 and not said, said


def test_the_store_files_are_the_engines_and_the_registered_sets(tmp_path):
    """study/store.py named the guide's own files: the store's list is the engine's files and each registered
    set's `files`, so a set registered by a test has its file refused as a link like the engine's records."""
    import os

    import pytest

    from flashcheck.core.fileio import LinkRefused
    from flashcheck.study.store import ENGINE_FILES, check_store_files, store_files

    assert store_files() == (*ENGINE_FILES, "guide.jsonl", "guide.json")  # the guide keeps its tasks' results
    (tmp_path / "elsewhere").write_text("")
    os.symlink(tmp_path / "elsewhere", tmp_path / "example.jsonl")
    check_store_files(tmp_path)  # not a store file of any registered set: left alone
    with registry.registered(dataclasses.replace(EXAMPLE, files=("example.jsonl",))):
        assert "example.jsonl" in store_files()
        with pytest.raises(LinkRefused, match=r"example\.jsonl"):
            check_store_files(tmp_path)


def test_the_shipped_sets_and_presets():
    """The shipped sets in report order, each preset owned by one, and every preset builds."""
    assert [s.name for s in registry.sets()] == ["studies", "paper", "variants", "guide", "modern", "serving"]
    assert set(registry.presets()) == {
        "quick", "paper", "fa3", "full", "tiny", "production", "guide", "guide-full", "guide-tiny", "modern",
        "serving", "serving-tiny",
    }  # fmt: skip
    assert registry.solo_set("production").name == "variants" and registry.solo_set("quick") is None
    assert registry.settings_tables() == {
        "guide": type(preset("quick").settings["guide"]),
        "serving": type(preset("serving").settings["serving"]),
    }
    try:
        registry.register(dataclasses.replace(EXAMPLE, name="again", presets={"quick": _example_preset}))
    except ValueError as exc:
        assert "preset 'quick' is another set's" in str(exc)
    else:
        raise AssertionError("a taken preset name was accepted")
