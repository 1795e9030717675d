"""docs/findings.md: every reproducer it keeps still reproduces its finding on this machine's libraries (exit 1), run
as a maintainer would (a fresh interpreter, flashcheck not importable); one that exits 0 was fixed upstream, and the
test says so. The page names each reproducer, and its flashcheck line reruns its finding."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashcheck.cli import app

DOCS = Path(__file__).resolve().parent.parent / "docs"
SCRIPTS = sorted((DOCS / "findings").glob("*.py"))


def test_the_page_names_each_reproducer_and_nothing_else():
    page = (DOCS / "findings.md").read_text()
    named = set(re.findall(r"docs/findings/([\w.-]+\.py)", page))
    assert named == {p.name for p in SCRIPTS} and len(SCRIPTS) >= 5, named


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_documented_finding_still_reproduces(script):
    text = script.read_text()
    library = "jax" if "import jax" in text else "onnxruntime" if "import onnxruntime" in text else "torch"
    pytest.importorskip(library)
    assert "import flashcheck" not in text and "from flashcheck" not in text
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    done = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, timeout=600, env=env, cwd="/")
    said = (done.stdout + done.stderr).decode("utf-8", "replace")
    if done.returncode == 0:
        pytest.fail(f"{script.name} no longer reproduces (fixed upstream?): update docs/findings.md\n{said}")
    assert done.returncode == 1 and "PRESENT" in said and "versions: " in said, said


def test_the_pages_flashcheck_line_reruns_its_finding():
    page = (DOCS / "findings.md").read_text()
    lines = [x for x in re.findall(r"```bash\n(.*?)```", page, re.S)[0].splitlines() if x.startswith("flashcheck ")]
    (line,) = lines
    res = CliRunner().invoke(app, shlex.split(line)[1:])
    assert res.exit_code == 1 and "dv" in res.output and "Traceback" not in res.output, res.output
