"""benchmarks/bit_identity.py compare: equal bits (NaN payloads and -0.0 included) pass, any other difference is
named and exits 1, and a file it cannot read is one `error:` line with exit 2 (it was a traceback)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bit_identity.py"


@pytest.fixture(scope="module")
def script() -> dict:
    return runpy.run_path(str(SCRIPT), run_name="bit_identity")


def _saved(path: Path, **tensors: torch.Tensor) -> str:
    torch.save(tensors, path)
    return str(path)


def test_equal_bits_pass_and_each_difference_is_named(script, tmp_path, capsys):
    nan = torch.tensor([float("nan"), 0.0, 1.0])
    a = _saved(tmp_path / "a.pt", x=nan, y=torch.arange(3))
    assert script["compare"](a, _saved(tmp_path / "same.pt", x=nan.clone(), y=torch.arange(3))) == 0
    other_nan = nan.view(torch.int32).clone()
    other_nan[0] ^= 1  # another NaN payload: equal as values under torch.equal's NaN rules, not in bits
    b = _saved(tmp_path / "b.pt", x=other_nan.view(torch.float32), y=torch.arange(3), z=torch.zeros(1))
    c = _saved(tmp_path / "c.pt", x=torch.tensor([float("nan"), -0.0, 1.0]), y=torch.arange(3))
    capsys.readouterr()
    assert script["compare"](a, b) == 1
    said = capsys.readouterr().out
    assert "DIFFERS x" in said and "DIFFERS z" in said and "DIFFERS y" not in said  # z: in one file only
    assert script["compare"](a, c) == 1 and "DIFFERS x" in capsys.readouterr().out  # -0.0 is not 0.0


@pytest.mark.parametrize("bad", ["missing", "folder", "text", "list"])
def test_a_file_it_cannot_read_is_one_error_line_and_exit_2(script, tmp_path, capsys, bad):
    good = _saved(tmp_path / "good.pt", x=torch.ones(2))
    path = tmp_path / "bad.pt"
    if bad == "folder":
        path.mkdir()
    elif bad == "text":
        path.write_text("not a torch file")
    elif bad == "list":
        torch.save([torch.ones(2)], path)
    with pytest.raises(SystemExit) as exit_:
        script["compare"](good, str(path))
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and str(path) in line, line
