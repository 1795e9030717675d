"""Shared fixtures: a seeded generator; two threads, as on CI."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
