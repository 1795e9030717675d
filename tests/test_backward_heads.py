"""The FA2 backward's heads in parts on the tile pool (kernels.sim.flash._backward_heads): the same gradient bits
on one thread, on two workers and on a busy machine (one part, one thread), and the parts really ran apart."""

from __future__ import annotations

import pytest
import torch

import flashcheck.kernels.sim.flash as flash_mod
from flashcheck.kernels import flash_attention

REAL = flash_mod._backward

# (B, H, Hkv, Lq, Lk, D, kwargs): causal, grouped heads, a scale that is no power of two, ragged blocks, masks
CASES = [
    (1, 4, 4, 200, 200, 32, {"causal": True}),
    (2, 3, 1, 150, 260, 24, {"block_k": 64}),
    (1, 6, 2, 130, 130, 96, {"causal": True, "policy": "fp16-mixed"}),
    (1, 2, 2, 90, 90, 16, {"policy": "fp32"}),
    (1, 4, 4, 100, 140, 16, {"policy": "bf16", "mask": "keys"}),
    (2, 2, 2, 64, 64, 16, {"mask": "per-head"}),  # a mask with its own batch and head entries: kept whole
]


def _grads(case, threads: int, free: int, monkeypatch) -> tuple[list[torch.Tensor], list[int]]:
    b, h, hkv, lq, lk, d, kw = case
    kw = dict(kw)
    g = torch.Generator().manual_seed(lq * 7 + d)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    if kw.get("mask") == "keys":
        kw["mask"] = (torch.arange(lk) < lk - 37)[None, None, None, :]  # broadcast over batch, heads and rows
    elif kw.get("mask") == "per-head":
        kw["mask"] = torch.rand(b, h, lq, lk, generator=g) > 0.3
    seen: list[int] = []

    def spy(q_, *a):
        seen.append(q_.shape[0] * q_.shape[1])
        return REAL(q_, *a)

    monkeypatch.setattr(flash_mod, "_backward", spy)
    monkeypatch.setattr(flash_mod, "free_cores", lambda: free)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        qkv = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*qkv, policy=kw.pop("policy", "bf16-mixed"), **kw)
        out.backward(dout)
        assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    return [out.detach(), *(t.grad for t in qkv)], seen


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_heads_apart_give_one_threads_bits(case, monkeypatch):
    one, seen_one = _grads(case, 1, 2, monkeypatch)
    split, seen_split = _grads(case, 2, 2, monkeypatch)
    busy, seen_busy = _grads(case, 2, 1, monkeypatch)
    n = case[0] * case[1]
    assert seen_one == [n] and seen_busy == [n]
    if case[-1].get("mask") == "per-head":
        assert seen_split == [n]  # kept whole
    else:
        assert sorted(seen_split) == [n // 2, n - n // 2]  # two parts, every head once
    for a, b_, c in zip(one, split, busy, strict=True):
        assert torch.equal(a, b_) and torch.equal(a, c)


def test_the_parts_go_to_the_pool_of_two_each_single_threaded(monkeypatch):
    """Two workers of the tile pool take the two parts (which thread takes which is the pool's race: a part this
    small may end before the pool's thread starts, so the caller takes both), each part's ops on one thread."""
    counts, pooled = set(), []
    real_pool = flash_mod._pool

    def spy(*a):
        counts.add(torch.get_num_threads())
        return REAL(*a)

    def pool_spy(workers, parts, one):
        pooled.append((workers, list(parts)))
        return real_pool(workers, parts, one)

    monkeypatch.setattr(flash_mod, "_backward", spy)
    monkeypatch.setattr(flash_mod, "_pool", pool_spy)
    monkeypatch.setattr(flash_mod, "free_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = (torch.randn(1, 4, 64, 16, dtype=torch.float64).requires_grad_() for _ in range(3))
        flash_attention(q, k, v, causal=True).sum().backward()  # dO expanded (stride 0): reshaped per part
    finally:
        torch.set_num_threads(before)
    assert pooled == [(2, [(0, 2), (2, 4)])] and counts == {1}
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
