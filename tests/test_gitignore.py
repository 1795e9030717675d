""".gitignore covers the folder each command writes when no --out is given (names taken from the commands' own
defaults), so that running the docs' commands in a checkout leaves `git status` clean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import typer

from flashcheck.cli import app
from flashcheck.cli.app import default_out
from flashcheck.cli.hunt import default_folder

ROOT = Path(__file__).resolve().parents[1]


def _option_default(command: str, name: str = "out") -> str:
    (param,) = [p for p in typer.main.get_command(app).commands[command].params if p.name == name]
    return param.default


def _default_folders() -> list[str]:
    explain = _option_default("explain")
    return [
        default_out("flashcheck-study", "quick"),
        default_out("flashcheck-study", "modern"),
        default_out("flashcheck-study", "quick", "sweep.toml"),
        default_out("flashcheck-train-study", "quick"),
        default_out("flashcheck-train-study", "paper"),
        explain,
        f"{explain}-torch-cpu-flash",  # explain --preset torch-cpu-flash
        default_folder("sdpa-math:bf16"),
        default_folder("a target no folder name can carry"),
        _option_default("validate"),
        _option_default("mutants"),
    ]


def test_every_default_output_folder_is_ignored() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    folders = _default_folders()
    assert "flashcheck-explain-torch-cpu-flash" in folders and "flashcheck-hunt-sdpa-math-bf16" in folders
    paths = [f"{f}/summary.json" for f in folders]
    run = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths], capture_output=True, text=True)
    ignored = set(run.stdout.split())
    assert [p for p in paths if p not in ignored] == [], run.stderr
