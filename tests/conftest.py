"""Shared fixtures: a seeded generator; two threads, as on CI."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


# --- one tiny study per test session (issue 22, item 10) ---------------------------------------------
# `flashcheck study --preset tiny --workers 2`, computed once per session through the CLI and shared by
# test_study, test_guide and test_readme (each copies the folder before changing it). Under pytest-xdist the
# workers share one computation through a file lock in the session's common temporary folder.


@dataclass(frozen=True)
class TinyStudy:
    """A finished tiny study: its folder (read-only for tests: copy it first), the CLI's exit code and output,
    and every figure it saved as (file name, figure_problems, y labels) from tests.helpers.audited_figures."""

    folder: Path
    exit_code: int
    output: str
    figures: list[tuple[str, list[str], list[str]]]


def _compute_tiny_study(root: Path) -> dict:
    from tests.helpers import audited_figures
    from typer.testing import CliRunner

    from flashcheck.cli import app

    out = root / "study"
    with audited_figures() as seen:
        res = CliRunner().invoke(app, ["study", "--preset", "tiny", "--out", str(out), "--workers", "2"])
    return {"folder": str(out), "exit_code": res.exit_code, "output": res.output, "figures": seen}


@pytest.fixture(scope="session")
def tiny_study_run(tmp_path_factory, request) -> TinyStudy:
    from filelock import FileLock

    worker = getattr(request.config, "workerinput", {}).get("workerid")
    # under xdist every worker's basetemp lies in one folder of this session; alone, our own basetemp
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    root = root / "tiny-study-session"
    root.mkdir(exist_ok=True)
    done = root / "run.json"
    with FileLock(str(root / "lock")):
        if not done.is_file():
            done.write_text(json.dumps(_compute_tiny_study(root)))
    data = json.loads(done.read_text())
    figures = [(name, list(problems), list(ylabels)) for name, problems, ylabels in data["figures"]]
    return TinyStudy(Path(data["folder"]), data["exit_code"], data["output"], figures)
