"""kernels.native.backward: the FA2 backward's passes in C give torch's bits (each routine against torch's ops, and
the flash simulator's gradients with them against the gradients without them), or the backward keeps torch's ops."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels import flash_attention
from flashcheck.kernels.native import backward as native_bwd
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import step as native_step
from flashcheck.kernels.sim import flash

needs_bwd = pytest.mark.skipif(
    cbuild.compiler() is None or not native_bwd.status()["available"], reason="the C backward passes are off here"
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@needs_bwd
@pytest.mark.parametrize("case", range(len(native_bwd._CASES)))
@pytest.mark.parametrize("p_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_passes_give_torchs_bits(case, p_dtype, threads):
    """P (scale, causal bias of either alignment, a user mask's bias (bool, float, broadcast, strided), LSE, exp,
    rounding), dS and the dQ / dK updates against torch's ops, on rows of no key, ragged widths and strided row
    operands."""
    if not native_bwd.usable(p_dtype):
        pytest.skip(f"no {p_dtype} rounding in this build")
    shape, causal, scale, spec = native_bwd._CASES[case]
    s, lse, dp, delta, x, acc = native_bwd._case(shape, case + 100)
    mask = native_bwd._mask(spec, shape, case)
    p, p_r = native_bwd._torch_probs(s.clone(), scale, lse, p_dtype, causal, mask)
    got = s.clone()
    got_r = native_bwd.probs(got, scale, lse, p_dtype, causal, mask)
    assert torch.equal(_bits(p), _bits(got)) and torch.equal(_bits(p_r), _bits(got_r))
    assert (p == 0).any() and (p > 0).any()  # masked / underflowing entries and live ones
    want = (p * (dp - delta)).to(p_dtype).float()
    assert torch.equal(_bits(want), _bits(native_bwd.ds(dp.clone(), p, delta, p_dtype)))
    for add in (True, False):
        want, got = acc.clone(), acc.clone()
        want[..., 5:, :] = want[..., 5:, :] + x * scale if add else x * scale
        native_bwd.scale_add(got[..., 5:, :], x, scale, add)
        assert torch.equal(_bits(want), _bits(got))


# (B, H, Hkv, Lq, Lk, D), flash_attention's options: causal both ways of Lq != Lk, grouped heads, head dims 32-256
CASES = [
    ((1, 2, 2, 300, 300, 64), {"policy": "bf16-mixed", "causal": True}),
    ((1, 4, 2, 260, 390, 128), {"policy": "bf16-mixed", "causal": True, "block_k": 64}),
    ((2, 2, 1, 390, 260, 32), {"policy": "fp16-mixed", "causal": True}),
    ((1, 2, 2, 300, 200, 96), {"policy": "fp32"}),
    ((1, 2, 1, 200, 200, 256), {"policy": "bf16-mixed", "causal": True, "block_k": 96}),
]


@needs_bwd
@pytest.mark.parametrize("case", range(len(CASES)))
def test_simulator_gradients_unchanged(case, threads, monkeypatch):
    """dQ, dK, dV of the flash simulator with the C passes and with torch's ops only: the same bits."""
    (b, h, hkv, lq, lk, d), kw = CASES[case]
    g = torch.Generator().manual_seed(case)
    q = torch.randn(b, h, lq, d, generator=g)
    k, v = (torch.randn(b, hkv, lk, d, generator=g) for _ in range(2))
    dout = torch.randn(b, h, lq, d, generator=g)
    real, used = flash._native_backward, []

    def counting(*a):
        used.append(real(*a))
        return used[-1]

    def grads(native: bool):
        monkeypatch.setattr(flash, "_native_backward", counting if native else (lambda *a: None))
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        flash_attention(qq, kk, vv, **kw).backward(dout)
        return qq.grad, kk.grad, vv.grad

    fast, slow = grads(True), grads(False)
    assert used and all(u is not None for u in used)  # the C passes ran (each part of the heads)
    for a, want in zip(fast, slow, strict=True):
        assert torch.equal(_bits(a), _bits(want)), kw


def test_off_where_a_value_could_be_nan():
    """An infinite dO (dP would be inf or NaN, whose bf16 rounding has more than one answer): torch's ops."""
    from flashcheck.core.numerics import parse_policy

    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    do = torch.randn(1, 2, 40, 64)
    do[0, 0, 3, 5] = math.inf
    grads = (*(torch.zeros_like(t) for t in (q, k, v)), torch.zeros(1, 2, 40, 1), torch.zeros(1, 2, 40, 1))
    cfg = flash.FlashConfig(policy=parse_policy("bf16-mixed"), causal=True)
    assert flash._native_backward((q, k, v, do, *grads), cfg, cfg.policy, 0.125) is None
    do[0, 0, 3, 5] = 1.0
    expect = torch.bfloat16 if native_bwd.usable(torch.bfloat16) else None
    assert flash._native_backward((q, k, v, do, *grads), cfg, cfg.policy, 0.125) == expect


@pytest.mark.skipif(
    cbuild.compiler() is None or cbuild.disabled() or not native_step._torch_vexp(),
    reason="no compiler, FLASHCHECK_NATIVE=0 or no MKL exp in torch here",
)
def test_on_where_it_can_be():
    """With a compiler and torch's MKL exp the passes are on: a C routine that differs from torch fails here (its
    self-test turns it off) rather than only skipping the tests above."""
    assert native_bwd.status()["available"], native_bwd.status()["reason"]
