"""docs/getting-started.md shows the one line a backend whose extra is missing prints: `flashcheck compare --backend
jax-xla` is run here with JAX hidden, and its message compared with the page's (the page's install
command is from a checkout at /path/to/flashcheck; here it names this one)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.extras import install_hint

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"


def test_the_missing_extra_message_on_the_page_is_what_compare_prints(monkeypatch) -> None:
    text = PAGE.read_text()
    command = re.search(r"`(flashcheck compare --backend jax-xla)` without JAX", text)
    assert command, "the page names the command whose message it shows"
    (shown,) = [b for b in re.findall(r"^```text\n(.*?)^```", text, flags=re.S | re.M) if "install the extra" in b]
    monkeypatch.setitem(sys.modules, "jax", None)  # as if JAX were not installed: find_spec('jax') is None
    res = CliRunner().invoke(app, command[1].split()[1:])
    assert res.exit_code == 2, res.output
    page_hint = "pip install -c /path/to/flashcheck/constraints.txt -e '/path/to/flashcheck[jax]'"
    assert page_hint in shown  # the hint from a checkout; here it names this checkout (or the package)
    assert " ".join(res.output.split()) == shown.strip().replace(page_hint, install_hint("jax"))  # word for word
