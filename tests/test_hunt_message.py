"""A budget finding's message names each failed check with its statistic and the budget it exceeds."""

from __future__ import annotations

import re

import torch

from flashcheck.core.budget import check_budget
from flashcheck.hunt.case import HuntCase
from flashcheck.hunt.judge import judge_tensor


def test_a_budget_failure_says_which_error_exceeds_which_budget():
    case = HuntCase(lq=3, lk=4)
    r = torch.randn(1, 1, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    over = judge_tensor("out", r + 1.0, r, r + 1e-3, case, "peers")
    res = check_budget(r + 1.0, r, r + 1e-3, dtype=torch.float64, rule="peers", floor=0.0)
    want = {c.name: (c.value, c.bound) for c in res.failed()}
    assert over.kind == "budget" and set(want) == {"max", "mean"}
    got = re.fullmatch(r"max \|error\| (\S+) > budget (\S+); mean \|error\| (\S+) > budget (\S+)", over.message)
    assert got, over.message
    for (value, bound), (v, b) in zip((want["max"], want["mean"]), (got.groups()[:2], got.groups()[2:]), strict=True):
        assert float(v) == float(f"{value:.3g}") and float(b) == float(f"{bound:.3g}")


def test_the_console_and_report_say_a_budget_findings_numbers_beside_its_ratio():
    """The findings table gives a budget finding's worst error / bound; its note line gives the checks behind it."""
    from flashcheck.hunt.report import finding_notes

    budget = {"kind": "budget", "tensor": "dk", "message": "max |error| 1.67e-06 > budget 8.68e-07"}
    assert finding_notes(budget) == ["budget, dk: max |error| 1.67e-06 > budget 8.68e-07"]
    assert finding_notes({"kind": "nan", "tensor": "out", "message": "NaN at head 0, token 3"}) == []  # row says it
