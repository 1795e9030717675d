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
