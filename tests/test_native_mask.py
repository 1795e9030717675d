"""User masks (bool or float, broadcast) through the C paths: the forward's whole query tiles (kernels.native.step)
and the backward's passes (kernels.native.backward) give the bits of torch's step loop, which every masked run took
before; a float mask that could make a NaN (NaN, +inf, huge entries) keeps torch's loop."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels import flash_attention
from flashcheck.kernels.native import backward as native_bwd
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import step as native_step
from flashcheck.kernels.sim import flash
from flashcheck.kernels.sim.masks import MASK_BOUND, bias_is_bounded, key_padding_mask

needs_tile = pytest.mark.skipif(
    cbuild.compiler() is None or not native_step.status()["tile_loop"], reason="the tile loop is off here"
)


def _alibi(h: int, lq: int, lk: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An ALiBi-like float bias [1, H, Lq, Lk]: -slope_h |i - j|, -inf beyond a window of 150 keys back."""
    i, j = torch.arange(lq).unsqueeze(-1), torch.arange(lk)
    slope = torch.tensor([2.0 ** -(n + 1) for n in range(h)]).view(1, h, 1, 1)
    bias = -slope * (i - j).abs()
    return bias.masked_fill(j < i - 150, -math.inf).to(dtype)


def _random_keep(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    keep[..., 5, :] = False  # a fully masked row (where the mask has rows)
    return keep


def _key_bias() -> torch.Tensor:
    """A float16 bias per key [2, 1, 1, 300], -inf on the second sequence's padding (right, 100 real keys)."""
    bias = torch.randn(2, 1, 1, 300, generator=torch.Generator().manual_seed(4)) * 3
    return bias.half().masked_fill(key_padding_mask([300, 100], 300).logical_not(), -math.inf)


# (B, H, Hkv, Lq, Lk, D), flash_attention's keywords: every mask kind, broadcast shape, causal alignment
CASES = {
    "pad-right": ((2, 2, 2, 300, 300, 64), {"policy": "bf16-mixed", "mask": key_padding_mask([200, 0], 300)}),
    "pad-left-causal": (
        (2, 2, 2, 300, 300, 64),
        {"policy": "bf16-mixed", "causal": True, "mask": key_padding_mask([230, 120], 300, side="left")},
    ),
    "bool-gqa-causal-wide": (
        (1, 4, 2, 260, 390, 96),
        {"policy": "fp32", "causal": True, "block_k": 64, "mask": _random_keep((1, 4, 260, 390), 1)},
    ),
    "bool-2d-causal-tall": (
        (1, 2, 1, 390, 260, 32),
        {"policy": "fp16-mixed", "causal": True, "mask": _random_keep((390, 260), 2)},
    ),
    "alibi-float32": ((1, 4, 4, 200, 300, 128), {"policy": "bf16-mixed", "mask": _alibi(4, 200, 300)}),
    "alibi-float64-causal": (
        (1, 2, 2, 300, 300, 64),
        {"policy": "bf16-mixed", "causal": True, "mask": _alibi(2, 300, 300, torch.float64)},
    ),
    "alibi-bf16": ((1, 2, 2, 200, 260, 64), {"policy": "fp32", "mask": _alibi(2, 200, 260, torch.bfloat16)}),
    "keys-fp16": ((2, 2, 2, 150, 300, 64), {"policy": "bf16-mixed", "mask": _key_bias()}),
    # several query tiles (the pool runs them at 2 threads, each in C)
    "pad-causal-tiles": (
        (1, 8, 2, 1100, 1100, 64),
        {"policy": "bf16-mixed", "causal": True, "mask": key_padding_mask([900], 1100)},
    ),
}


def _inputs(shape: tuple[int, ...], seed: int = 0):
    b, h, hkv, lq, lk, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g) * 2
    k, v = (torch.randn(b, hkv, lk, d, generator=g) * s for s in (2, 1))
    return q, k, v


def _torch_loop(monkeypatch) -> None:
    """The masked forward as it ran before masks reached C: torch's step loop, no NaN-free shortcut."""
    monkeypatch.setattr(flash, "bias_is_bounded", lambda mask: mask is None)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


@needs_tile
@pytest.mark.parametrize("name", list(CASES))
def test_masked_forward_gives_torchs_bits(name, threads, monkeypatch):
    """Output and LSE of the C tiles with the user mask against torch's step loop, bit for bit (fully masked rows
    included: output 0, LSE -inf), on one thread (every tile in C) and two (the tile pool's workers)."""
    shape, kw = CASES[name]
    q, k, v = _inputs(shape)
    real, masked_calls = native_step.tile_forward, []

    def counting(*a, **kw_):
        done = real(*a, **kw_)
        masked_calls.append(done and kw_.get("mask") is not None)
        return done

    monkeypatch.setattr(flash, "tile_forward", counting)
    fast = flash_attention(q, k, v, return_lse=True, **kw)
    _torch_loop(monkeypatch)
    slow = flash_attention(q, k, v, return_lse=True, **kw)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(_bits(a), _bits(b)), name
    if threads == 1 or name.endswith("tiles"):
        assert any(masked_calls), name  # the masked tiles ran in C
    if "pad-right" in name:
        assert bool(torch.isneginf(fast[1][1]).all()) and not bool(fast[0][1].any())  # a batch of no key


@pytest.mark.parametrize("bad", [math.inf, math.nan, 2.0**126, 1e300])
def test_a_float_mask_that_could_make_a_nan_keeps_torchs_loop(bad, threads, monkeypatch):
    """NaN, +inf or an entry too large for score + bias to stay finite: no C tile, and the bits (NaN's positions
    too) are torch's step loop's (grouped K / V heads: the loop repeats them)."""
    q, k, v = _inputs((1, 2, 1, 200, 260, 64))
    mask = _alibi(2, 200, 260, torch.float64)
    mask[0, 1, 7, 30] = bad
    assert not bias_is_bounded(mask)
    ran = []
    real = native_step.tile_forward
    monkeypatch.setattr(flash, "tile_forward", lambda *a, **kw: ran.append(1) or real(*a, **kw))
    fast = flash_attention(q, k, v, return_lse=True, policy="bf16-mixed", mask=mask)
    assert not ran
    _torch_loop(monkeypatch)
    slow = flash_attention(q, k, v, return_lse=True, policy="bf16-mixed", mask=mask)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(_bits(a), _bits(b))
    if bad != 2.0**126:  # NaN / inf reach the row (2^126 + a score stays finite here: the bound is conservative)
        assert bool(fast[0][0, 1, 7].isnan().any()) or not bool(torch.isfinite(fast[1][0, 1, 7]))


def test_bias_is_bounded():
    """bool masks always; float masks with every entry -inf or finite below MASK_BOUND, in any float dtype."""
    assert bias_is_bounded(None) and bias_is_bounded(torch.zeros(3, 4, dtype=torch.bool))
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        m = torch.tensor([[0.0, -math.inf, -1e4, 3.0]], dtype=dtype)
        assert bias_is_bounded(m), dtype
        for bad in (math.inf, math.nan):
            assert not bias_is_bounded(torch.cat([m, torch.tensor([[bad, 0, 0, 0]], dtype=dtype)])), (dtype, bad)
    assert bias_is_bounded(torch.tensor([MASK_BOUND / 2])) and not bias_is_bounded(torch.tensor([MASK_BOUND]))
    assert bias_is_bounded(torch.tensor([-1e300], dtype=torch.float64))  # -inf in float32: still no NaN


needs_bwd = pytest.mark.skipif(
    cbuild.compiler() is None or not native_bwd.status()["available"], reason="the backward's C passes are off here"
)
BWD_CASES = ["pad-right", "pad-left-causal", "bool-gqa-causal-wide", "bool-2d-causal-tall", "alibi-float64-causal",
             "alibi-bf16", "keys-fp16"]  # fmt: skip


@needs_bwd
@pytest.mark.parametrize("name", BWD_CASES)
def test_masked_backward_gives_torchs_bits(name, threads, monkeypatch):
    """dQ, dK, dV of a masked forward + backward with the C passes (P from the scores and the mask's bias in C)
    against torch's ops throughout, bit for bit; fully masked rows give zero gradients in both."""
    shape, kw = CASES[name]
    q, k, v = _inputs(shape)
    dout = torch.randn(shape[0], shape[1], shape[3], shape[5], generator=torch.Generator().manual_seed(9))
    real, used = flash._native_backward, []
    monkeypatch.setattr(flash, "_native_backward", lambda *a: used.append(real(*a)) or used[-1])

    def grads():
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        flash_attention(qq, kk, vv, **kw).backward(dout)
        return qq.grad, kk.grad, vv.grad

    fast = grads()
    assert used and all(u is not None for u in used)  # the C passes ran with the mask (each part of the heads)
    _torch_loop(monkeypatch)
    used.clear()
    slow = grads()
    assert used and all(u is None for u in used)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(_bits(a), _bits(b)), name


def test_the_backward_keeps_torchs_ops_for_a_mask_that_could_make_a_nan():
    from flashcheck.core.numerics import parse_policy

    q, k, v, do = (torch.randn(1, 2, 40, 64) for _ in range(4))
    grads = (*(torch.zeros_like(t) for t in (q, k, v)), torch.zeros(1, 2, 40, 1), torch.zeros(1, 2, 40, 1))
    mask = torch.zeros(1, 1, 40, 40)
    mask[0, 0, 3, 5] = math.inf
    cfg = flash.FlashConfig(policy=parse_policy("fp32"), mask=mask)
    assert flash._native_backward((q, k, v, do, *grads), cfg, cfg.policy, 0.125) is None
    mask[0, 0, 3, 5] = -math.inf
    expect = torch.float32 if native_bwd.usable(torch.float32) else None
    assert flash._native_backward((q, k, v, do, *grads), cfg, cfg.policy, 0.125) == expect


def test_a_mask_on_scores_that_may_overflow_keeps_torchs_loop():
    """Scores rounded to fp16 may be +inf (plus a -inf bias: NaN): a mask there keeps torch's loop; a score format
    that holds 2^126 (float32, bf16) takes the NaN-free path."""
    from flashcheck.core.numerics import parse_policy

    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    for name, want in (("fp16", False), ("bf16-mixed", True), ("bf16", True), ("fp32", True)):
        pol = parse_policy(name)
        cfg = flash.FlashConfig(policy=pol, mask=keep)
        assert flash._mask_keeps_nan_free(cfg, pol) is want, name
        assert flash._mask_keeps_nan_free(flash.FlashConfig(policy=pol), pol)
