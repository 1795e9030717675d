"""Standard and Flash simulators: exact under fp64, and each policy knob changes what it should."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.inputs import InputSpec, make_qkv
from flashcheck.kernels import flash_attention, reference_attention, standard_attention
from flashcheck.kernels.fp8 import hadamard_matrix, incoherence_matrix
from flashcheck.numerics import parse_policy, round_to
from helpers import budget_ok

CASES = [  # (B, H, Lq, Lk, D, block_q, block_k)
    (1, 1, 1, 1, 4, 1, 1),
    (2, 3, 17, 17, 8, 4, 5),
    (1, 2, 33, 70, 16, 16, 7),
    (2, 1, 70, 33, 8, 9, 64),
    (1, 2, 64, 64, 32, 64, 64),
    (1, 1, 100, 3, 4, 200, 2),
]


def qkv(b, h, lq, lk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, lq, d, generator=g, dtype=torch.float64),
        torch.randn(b, h, lk, d, generator=g, dtype=torch.float64) * 2,
        torch.randn(b, h, lk, d, generator=g, dtype=torch.float64),
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "algorithm,exp2,order",
    [
        ("fa1", False, "forward"),
        ("fa2", False, "reverse"),
        ("fa2", True, "shuffle"),
        ("fa1", True, "reverse"),
    ],
)
def test_fp64_kernels_equal_reference(case, causal, algorithm, exp2, order):
    b, h, lq, lk, d, bq, bk = case
    q, k, v = qkv(b, h, lq, lk, d)
    ref = reference_attention(q, k, v, causal=causal)
    fl, lse = flash_attention(
        q,
        k,
        v,
        policy="fp64",
        block_q=bq,
        block_k=bk,
        algorithm=algorithm,
        causal=causal,
        exp2=exp2,
        key_order=order,
        return_lse=True,
    )
    _, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True)
    assert (fl - ref).abs().max() < 1e-12
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and (lse - ref_lse)[finite].abs().max() < 1e-12
    st = standard_attention(q, k, v, policy="fp64", causal=causal)
    assert (st - ref).abs().max() < 1e-12


def test_single_key_block_flash_equals_standard():
    q, k, v = qkv(2, 2, 40, 40, 16)
    for alg in ("fa1", "fa2"):
        fl = flash_attention(q, k, v, policy="fp64", block_k=40, algorithm=alg)
        assert (fl - standard_attention(q, k, v, policy="fp64")).abs().max() < 1e-14


# In low precision one key block still normalises at another point than standard does (after P·V,
# not before), so the two agree to the peers' budget, not bit for bit.
@pytest.mark.parametrize("policy", ["fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp16"])
def test_single_key_block_flash_within_budget_of_standard(policy):
    q, k, v = make_qkv(InputSpec(batch=1, heads=4, seq_len=256, head_dim=64, seed=3))
    ref = reference_attention(q, k, v)
    st = standard_attention(q, k, v, policy=policy)
    for alg in ("fa1", "fa2"):
        ok, msg = budget_ok(flash_attention(q, k, v, policy=policy, block_k=256, algorithm=alg), st, ref, 2)
        assert ok, msg


def test_block_q_does_not_change_forward_rows():
    q, k, v = qkv(1, 2, 50, 50, 8)
    a = flash_attention(q, k, v, policy="bf16", block_q=4, block_k=16)
    b = flash_attention(q, k, v, policy="bf16", block_q=50, block_k=16)
    assert torch.equal(a, b)


def test_batch_invariance():
    q, k, v = qkv(3, 2, 30, 30, 8)
    full = flash_attention(q, k, v, policy="bf16-mixed", block_k=8)
    one = flash_attention(q[1:2], k[1:2], v[1:2], policy="bf16-mixed", block_k=8)
    assert torch.equal(full[1:2], one)


# --- each policy knob changes what it should, and only that -------------------------------------


def test_input_stage_alone_equals_reference_on_rounded_inputs():
    q, k, v = qkv(1, 2, 40, 40, 16)
    pol = parse_policy("input=bf16")
    want = reference_attention(*(round_to(t, "bf16") for t in (q, k, v)))
    for out in (flash_attention(q, k, v, policy=pol, block_k=8), standard_attention(q, k, v, policy=pol)):
        assert (out - want).abs().max() < 1e-13


def test_output_stage_alone_rounds_the_exact_output_once():
    q, k, v = qkv(1, 2, 40, 40, 16)
    want = round_to(reference_attention(q, k, v), "bf16")
    for out in (
        flash_attention(q, k, v, policy="output=bf16", block_k=8),
        standard_attention(q, k, v, policy="output=bf16"),
    ):
        near = (out - want).abs() > 0  # ties at fp64 noise may round either way
        assert near.double().mean() < 1e-3


def test_score_stage_alone_in_standard():
    q, k, v = qkv(1, 1, 20, 20, 8)
    s = round_to((q @ k.transpose(-1, -2)) * 8**-0.5, "fp16")
    want = torch.softmax(s, dim=-1) @ v
    assert (standard_attention(q, k, v, policy="score=fp16") - want).abs().max() < 1e-13


def test_p_stage_changes_the_output_only_where_expected():
    q, k, v = qkv(1, 4, 128, 128, 32)
    ref = reference_attention(q, k, v)
    hi = flash_attention(q, k, v, policy="bf16-mixed,p=fp32", block_k=32)
    lo = flash_attention(q, k, v, policy="bf16-mixed", block_k=32)
    assert not torch.equal(hi, lo)
    # only the p knob differs: with inputs and output identical, the fp32-P error vs the rounded-input
    # reference is at most the output rounding, the bf16-P error is larger
    rq = reference_attention(*(round_to(t, "bf16") for t in (q, k, v)))
    assert (hi - rq).abs().mean() < (lo - rq).abs().mean()
    assert (hi - ref).abs().max() > 0


@pytest.mark.parametrize("stage", ["score", "stats", "accum"])
def test_each_internal_stage_moves_the_output(stage):
    q, k, v = qkv(1, 2, 96, 96, 16)
    base = flash_attention(q, k, v, policy="fp64", block_k=16, algorithm="fa1")
    moved = flash_attention(q, k, v, policy=f"{stage}=bf16", block_k=16, algorithm="fa1")
    err = (moved - base).abs().max()
    assert 1e-6 < err < 0.1


def test_backward_stages_do_not_touch_the_forward():
    q, k, v = qkv(1, 2, 32, 32, 8)
    a = flash_attention(q, k, v, policy="bf16-mixed", block_k=8)
    b = flash_attention(q, k, v, policy="bf16-mixed,delta=fp32,grad_accum=bf16,grad_p=fp16", block_k=8)
    assert torch.equal(a, b)


def test_matmul_precision_knob():
    q, k, v = qkv(1, 2, 64, 64, 64)
    a = standard_attention(q, k, v, policy="fp64")
    b = standard_attention(q, k, v, policy="fp64,matmul=fp32")
    err = (a - b).abs().max()
    assert 1e-9 < err < 1e-5


# --- masks, special values --------------------------------------------------------------------


def test_user_masks_match_reference():
    q, k, v = qkv(2, 2, 20, 28, 8)
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(2, 1, 20, 28, generator=g) > 0.5
    keep[:, :, 3] = False
    bias = torch.randn(1, 2, 20, 28, generator=g, dtype=torch.float64)
    for mask in (keep, bias):
        ref = reference_attention(q, k, v, mask=mask, causal=True)
        for alg in ("fa1", "fa2"):
            out = flash_attention(q, k, v, policy="fp64", block_k=6, mask=mask, causal=True, algorithm=alg)
            assert (out - ref).abs().max() < 1e-12
        assert (standard_attention(q, k, v, mask=mask, causal=True) - ref).abs().max() < 1e-12
    assert torch.equal(flash_attention(q, k, v, mask=keep, block_k=6)[:, :, 3], torch.zeros(2, 2, 8))


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = qkv(1, 1, 10, 4, 8)  # causal with Lq > Lk: the first 6 rows see nothing
    for pol in ("bf16", "fp16-mixed", "fp64"):
        out = flash_attention(q, k, v, policy=pol, causal=True, block_k=2)
        assert not torch.isnan(out).any() and torch.equal(out[0, 0, :6], torch.zeros(6, 8, dtype=out.dtype))
        st = standard_attention(q, k, v, policy=pol, causal=True)
        assert not torch.isnan(st).any() and (st[0, 0, :6] == 0).all()


def test_nan_and_inf_inputs_propagate():
    q, k, v = qkv(1, 1, 8, 8, 4)
    v[0, 0, 2, 1] = float("nan")
    out = flash_attention(q, k, v, policy="bf16-mixed", block_k=4)
    assert torch.isnan(out[..., 1]).all() and not torch.isnan(out[..., 0]).any()
    k[0, 0, 0, 0] = float("inf")
    assert torch.isnan(standard_attention(q, k, v, policy="bf16")).any()


# --- fp8 and Hadamard -------------------------------------------------------------------------


def test_hadamard_matrix_is_orthogonal_and_preserves_scores():
    h = hadamard_matrix(16)
    assert torch.equal(h @ h.T, 16 * torch.eye(16, dtype=torch.float64))
    m = incoherence_matrix(16, seed=3)
    assert torch.allclose(m @ m.T, torch.eye(16, dtype=torch.float64), atol=1e-15)
    q, k, v = qkv(1, 1, 12, 12, 16)
    out = flash_attention(q, k, v, policy="fp64,hadamard=true", block_k=5)
    assert (out - reference_attention(q, k, v)).abs().max() < 1e-12
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_matrix(12)


def test_fp8_block_scaling_needs_tiles_in_standard():
    q, k, v = qkv(1, 1, 8, 8, 8)
    with pytest.raises(ValueError, match="block"):
        standard_attention(q, k, v, policy="fa3-fp8")


def test_bad_arguments():
    q, k, v = qkv(1, 1, 8, 8, 8)
    for kwargs, match in [
        ({"block_k": 0}, "block_k"),
        ({"algorithm": "fa9"}, "algorithm"),
        ({"key_order": "sideways"}, "key_order"),
        ({"key_order": [0, 0]}, "permutation"),
        ({"scale": -1.0}, "scale"),
    ]:
        with pytest.raises(ValueError, match=match):
            flash_attention(q, k, v, **kwargs)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = qkv(1, 1, 8, 8, 16)
    a = flash_attention(q, k, v, policy="fp64", scale=1 / math.sqrt(16))
    assert torch.equal(a, flash_attention(q, k, v, policy="fp64"))
