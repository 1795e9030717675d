"""FA2 backward of the flash simulator: exact under fp64, within the peers' 3x budget under bf16-mixed."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.inputs import InputSpec, make_grad, make_qkv
from flashcheck.kernels import flash_attention, reference_attention, standard_attention
from helpers import budget_ok


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do.to(out.dtype))
    return out.detach(), (q.grad, k.grad, v.grad)


@pytest.mark.parametrize(
    "shape,bq,bk",
    [
        ((2, 2, 19, 19, 8), 4, 5),
        ((1, 3, 13, 40, 16), 8, 7),
        ((1, 1, 40, 13, 8), 16, 3),
        ((1, 2, 64, 64, 32), 64, 64),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("algorithm,exp2", [("fa2", False), ("fa2", True), ("fa1", False)])
def test_fp64_flash_gradients_equal_reference_autograd(shape, bq, bk, causal, algorithm, exp2):
    b, h, lq, lk, d = shape
    g = torch.Generator().manual_seed(lq * lk)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    do = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    _, ref = grads(lambda q, k, v: reference_attention(q, k, v, causal=causal), q, k, v, do)
    _, fl = grads(
        lambda q, k, v: flash_attention(
            q, k, v, policy="fp64", block_q=bq, block_k=bk, causal=causal, algorithm=algorithm, exp2=exp2
        ),
        q,
        k,
        v,
        do,
    )
    for name, a, r in zip("qkv", fl, ref, strict=True):
        assert (a - r).abs().max() < 1e-11, name


def test_fp64_gradients_with_mask_and_hadamard():
    q, k, v = make_qkv(InputSpec(batch=1, heads=2, seq_len=24, head_dim=16, seed=2))
    do = make_grad(q.shape, 2)
    keep = torch.rand(1, 1, 24, 24, generator=torch.Generator().manual_seed(1)) > 0.3
    _, ref = grads(lambda q, k, v: reference_attention(q, k, v, mask=keep), q, k, v, do)
    _, fl = grads(
        lambda q, k, v: flash_attention(q, k, v, policy="fp64,hadamard=true", block_k=5, mask=keep),
        q,
        k,
        v,
        do,
    )
    for a, r in zip(fl, ref, strict=True):
        assert (a - r).abs().max() < 1e-11


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_gradients_within_three_x_of_baseline(policy, causal):
    q, k, v = make_qkv(InputSpec(batch=1, heads=4, seq_len=256, head_dim=64, seed=4))
    do = make_grad(q.shape, 4)
    _, ref = grads(lambda q, k, v: reference_attention(q, k, v, causal=causal), q, k, v, do)
    _, base = grads(lambda q, k, v: standard_attention(q, k, v, policy=policy, causal=causal), q, k, v, do)
    _, fl = grads(
        lambda q, k, v: flash_attention(q, k, v, policy=policy, block_q=64, block_k=64, causal=causal),
        q,
        k,
        v,
        do,
    )
    for name, a, bs, r in zip("qkv", fl, base, ref, strict=True):
        ok, msg = budget_ok(a, bs, r, 3)
        assert ok, f"d{name}: {msg}"


def test_delta_in_fp32_changes_only_gradients():
    q, k, v = make_qkv(InputSpec(batch=1, heads=2, seq_len=64, head_dim=16, distribution="tied", seed=0))
    do = make_grad(q.shape, 0)
    o1, g1 = grads(lambda q, k, v: flash_attention(q, k, v, policy="bf16-mixed", block_k=16), q, k, v, do)
    o2, g2 = grads(lambda q, k, v: flash_attention(q, k, v, policy="bf16-mixed,delta=fp32", block_k=16), q, k, v, do)
    assert torch.equal(o1, o2)
    assert torch.equal(g1[2], g2[2])  # dV does not use delta
    assert not torch.equal(g1[0], g2[0])


def test_gradient_dtypes_follow_inputs():
    q, k, v = (t.float() for t in make_qkv(InputSpec(batch=1, heads=1, seq_len=16, head_dim=8)))
    _, gs = grads(
        lambda q, k, v: flash_attention(q, k, v, policy="bf16-mixed", block_k=4),
        q,
        k,
        v,
        torch.ones(1, 1, 16, 8),
    )
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in gs)
