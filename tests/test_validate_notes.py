"""A validate comparison that passes but whose attention backward leaves its per-call budget (finite gradients) says
so as a note beside PASS, not as a `where:` failure line (users read that as the reason for a FAIL); a NaN gradient
still fails the comparison and says where."""

from __future__ import annotations

import pytest

from flashcheck.validate.report import _bullet
from flashcheck.validate.result import Comparison


def _where(nonfinite: bool) -> dict:
    what = "dQ NaN" if nonfinite else "dQ max |diff| 9.06e-06 > bound 5.15e-06"
    back = {"layer": 2, "head": 1, "tokens": [0, 3], "what": what}
    return {"layer": 2, "head": 1, "tokens": [0, 3], "what": what, "text": f"layer 2, head 1, tokens 0-3, {what} "
            "(backward)", "forward": None, "backward": back, "backward_nonfinite": nonfinite}  # fmt: skip


@pytest.mark.parametrize("nonfinite", [False, True])
def test_a_finite_backward_finding_is_a_note_a_nan_one_a_failure(nonfinite: bool) -> None:
    cmp = Comparison("sdpa:fp32", "eager:fp64", "sdpa", "fp32", 2.0, where=_where(nonfinite))
    if nonfinite:
        assert not cmp.passed and cmp.notes() == []
        (line,) = cmp.failures()
        assert line.startswith("where: attention first leaves its budget at layer 2") and "NaN" in line
        assert _bullet(cmp) == line
    else:
        assert cmp.passed and cmp.failures() == []
        (note,) = cmp.notes()
        assert note.startswith("note, not part of the verdict") and "9.06e-06 > bound 5.15e-06" in note
        assert _bullet(cmp) == f"k = 2, all checks within bounds; {note}"
    d = cmp.to_dict()
    assert (d["failures"], d["notes"]) == (cmp.failures(), cmp.notes()) and d["pass"] is cmp.passed


def test_no_where_no_note() -> None:
    cmp = Comparison("sdpa:fp32", "eager:fp64", "sdpa", "fp32", 2.0)
    assert cmp.passed and cmp.failures() == [] and cmp.notes() == []
    assert _bullet(cmp) == "k = 2, all checks within bounds"


def test_the_pass_line_names_the_factor_k_it_allows_over_the_format_alone() -> None:
    """PASS said 'within the deviation its number format causes on its own' while the table showed max abs 0.084
    against format-only 0.061 (new-user trial): the rule allows k times the format's own deviation; say k."""
    from flashcheck.validate.report import conclusion
    from flashcheck.validate.result import ValidationResult

    rows = [Comparison(f"{i}:{d}", "eager:fp32", i, d, k) for i, d, k in
            (("eager", "bf16", 2.0), ("sdpa", "fp32", 2.0), ("sdpa", "bf16", 2.0))]  # fmt: skip
    result = ValidationResult("m", tuple(rows), (), {}, {}, {"bf16": 2.0})
    assert "stays within k = 2 times the deviation its number format causes on its own" in conclusion(result)
    rows[2] = Comparison("sdpa:bf16", "eager:fp32", "sdpa", "bf16", 3.14159)
    result = ValidationResult("m", tuple(rows), (), {}, {}, {"bf16": 3.14})
    assert "within k = 2 to 3.14 times" in conclusion(result)
