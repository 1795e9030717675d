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


TIMEOUT_S = 600


def _maintainers_env() -> dict[str, str]:
    """The caller's environment without PYTHONPATH; torch dispatching its AVX2 CPU kernels, as on the hunts' machine
    (the fp32 large-logits finding holds there only: AVX-512's kernels round its backward otherwise, see the page),
    unless the caller chose a dispatch."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return {"ATEN_CPU_CAPABILITY": "avx2", **env}


@pytest.fixture(scope="module")
def torch_script(tmp_path_factory):
    """run(script) -> (exit code or None, stdout + stderr) of a torch reproducer run as `python -I script` from /:
    forked from one fresh isolated interpreter (-I: no PYTHONPATH, no user site, no working folder on the path) that
    imported torch and numpy once, as each script does first (helpers.forked_runs)."""
    from helpers import forked_runs

    pytest.importorskip("torch")
    with forked_runs(["numpy", "torch"], TIMEOUT_S, isolated=True, env=_maintainers_env(), cwd="/") as forked:
        yield lambda script: forked("path", str(script), [str(script)], "/", tmp_path_factory.mktemp("out") / "log")


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_documented_finding_still_reproduces(script, request):
    text = script.read_text()
    library = "jax" if "import jax" in text else "onnxruntime" if "import onnxruntime" in text else "torch"
    pytest.importorskip(library)
    assert "import flashcheck" not in text and "from flashcheck" not in text
    if library == "torch":
        code, said = request.getfixturevalue("torch_script")(script)
    else:
        cmd = [sys.executable, "-I", str(script)]
        done = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT_S, env=_maintainers_env(), cwd="/")
        code, said = done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")
    if code == 0:
        pytest.fail(f"{script.name} no longer reproduces (fixed upstream?): update docs/findings.md\n{said}")
    assert code == 1 and "PRESENT" in said and "versions: " in said, said


def test_the_pages_flashcheck_line_reruns_its_finding():
    page = (DOCS / "findings.md").read_text()
    lines = [x for x in re.findall(r"```bash\n(.*?)```", page, re.S)[0].splitlines() if x.startswith("flashcheck ")]
    (line,) = lines
    res = CliRunner().invoke(app, shlex.split(line)[1:])
    assert res.exit_code == 1 and "dv" in res.output and "Traceback" not in res.output, res.output
