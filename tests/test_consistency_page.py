"""docs/commands/consistency.md shows what its first command prints: `flashcheck consistency sdpa-flash --max-batch
16` is run here and its lines compared with the page's output block; the prefill-vs-decode line depends on torch's
CPU dispatch, so it is compared with the line the page gives for this machine's (AVX-512 or AVX2), if either."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.measure.consistency import PHASES

PAGE = Path(__file__).resolve().parents[1] / "docs" / "commands" / "consistency.md"


def _text_blocks() -> list[list[str]]:
    return [b.splitlines() for b in re.findall(r"^```text\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)]


def test_the_page_shows_what_sdpa_flash_prints_under_this_cpu_dispatch() -> None:
    shown, avx2 = _text_blocks()[:2]
    assert shown[0].startswith("consistency of sdpa-flash:")
    checks = [re.search(r"([\w-]+): (?:bit-identical|differs)", ln) for ln in shown[1:]]
    assert [m and m[1] for m in checks] == list(PHASES)  # every check, in order
    res = CliRunner().invoke(app, ["consistency", "sdpa-flash", "--max-batch", "16"])
    assert res.exit_code == 1, res.output
    printed = [ln for ln in res.output.splitlines() if not ln.startswith("consistency:")]  # the progress line
    assert len(printed) == len(shown), res.output
    cap = torch.backends.cpu.get_cpu_capability()
    for got, want in zip(printed, shown, strict=True):
        if "prefill-decode:" not in want:
            assert got == want, res.output
        elif cap in ("AVX512", "AVX2"):  # the page's line for this dispatch (the AVX2 one is the second block)
            assert got == (want if cap == "AVX512" else avx2[0]), res.output
