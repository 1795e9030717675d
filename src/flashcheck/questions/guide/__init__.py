"""The production guide's claims measured: its settings and own tasks (cost, latency, fp16 boundaries, the
stage attribution), its error sweep, its claims, and its report (alone for the guide presets, a part of
quick's and full's)."""

from __future__ import annotations

from pathlib import Path

from flashcheck.questions.guide.presets import GuideSettings, guide, guide_full, guide_tiny
from flashcheck.questions.guide.report import build_guide_report, guide_part, guide_sentences, is_guide_folder
from flashcheck.questions.guide.tasks import GUIDE_FILE, SETTINGS_FILE, run_tasks_locked
from flashcheck.study.part import Part, Study
from flashcheck.study.registry import QuestionSet

KEY = "guide"  # its table in study.json and TOML
NOTES = {
    "guide_errors": "The production guide's error range and slope (no baseline: its claims judge each method's "
    "relative L2 error against FP64 directly; see the production guide's claims).",
}


def report_part(study: Study) -> Part:
    """Its claims (summary key `guide`), sentences and failed tasks, its claims table after the verdicts'
    rules and its evidence at the end; nothing when the study has no guide settings."""
    s = study.config.settings.get(KEY)
    if s is None:
        return Part()
    part, blocks = guide_part(study.folder, study.config, list(study.records.values()), s)
    return Part(
        sentences=guide_sentences(part),
        failures=part.get("failures", []),
        summary={"guide": part},
        middle=blocks[:3],  # the claims table and its rules (guide.report.claims_blocks)
        end=blocks[3:],
        stored={"guide tasks": tuple(part["stored"]["tasks"])},  # its error cases are the study's own
    )


def _tasks(folder: Path, settings: GuideSettings, quiet: bool) -> dict:
    return run_tasks_locked(folder, settings, quiet=quiet)


TITLES = {  # the report's headings (each question's id stays its anchor)
    "guide_errors": "Guide: the error range in both views of error",
}


QUESTION_SET = QuestionSet(
    name="guide",
    order=30,
    presets={"guide": guide, "guide-full": guide_full, "guide-tiny": guide_tiny},
    solo=frozenset({"guide", "guide-full", "guide-tiny"}),
    report=report_part,
    titles=TITLES,
    notes=NOTES,
    settings=(KEY, GuideSettings),
    tasks=_tasks,
    own_report=build_guide_report,
    owns_folder=is_guide_folder,
    files=(GUIDE_FILE, SETTINGS_FILE),
)
