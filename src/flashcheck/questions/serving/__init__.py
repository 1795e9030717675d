"""The serving question set: is an FP8 / FP4 KV cache safe at long context, are outputs batch invariant, do
prefill and decode agree (settings, resumable units, report). `question_set()` is what study.registry takes."""

from __future__ import annotations

from pathlib import Path

from flashcheck.questions.serving.settings import PRESETS, ServingSettings

KEY = "serving"  # its table in study.json and TOML


def is_serving_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a serving study (its settings file and units folder)."""
    return (Path(folder) / "serving.json").is_file() and (Path(folder) / "serving").is_dir()


def question_set():
    """The set as study.registry.QuestionSet: its presets (no sweeps; the work is its own tasks), settings,
    tasks and report (the registry is imported here, when the engine asks)."""
    from flashcheck.questions.serving.report import build_serving_report
    from flashcheck.questions.serving.tasks import run_serving
    from flashcheck.study import registry
    from flashcheck.study.config import StudyConfig

    def preset(name: str):
        return lambda: StudyConfig(name=name, sweeps=(), settings={KEY: PRESETS[name]})

    return registry.QuestionSet(
        name="serving",
        order=60,
        presets={name: preset(name) for name in PRESETS},
        solo=frozenset(PRESETS),
        settings=(KEY, ServingSettings),
        tasks=lambda folder, s, quiet: run_serving(folder, s, quiet=quiet),
        own_report=build_serving_report,
        owns_folder=is_serving_folder,
    )


__all__ = ["KEY", "PRESETS", "ServingSettings", "is_serving_folder", "question_set"]
