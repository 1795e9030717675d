"""Standard and Flash simulators: exact under fp64, and each policy knob changes what it should."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.numerics import parse_policy, round_to
from flashcheck.kernels import flash_attention, reference_attention, standard_attention
from flashcheck.kernels.sim.fp8 import hadamard_matrix, incoherence_matrix
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
        ({"scale": float("nan")}, "scale"),
    ]:
        with pytest.raises(ValueError, match=match):
            flash_attention(q, k, v, **kwargs)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = qkv(1, 1, 8, 8, 16)
    a = flash_attention(q, k, v, policy="fp64", scale=1 / math.sqrt(16))
    assert torch.equal(a, flash_attention(q, k, v, policy="fp64"))


# --- one input rule for the three kernels and the backends' run path ---------------------------

KERNELS = {
    "reference": lambda q, k, v, **kw: reference_attention(q, k, v, **kw),
    "standard": lambda q, k, v, **kw: standard_attention(q, k, v, policy="fp64", **kw),
    "flash": lambda q, k, v, **kw: flash_attention(q, k, v, policy="fp64", block_q=3, block_k=3, **kw),
}


def _bad_inputs():
    q, k, v = qkv(1, 2, 5, 6, 4)
    return [  # (q, k, v, kwargs, fragment of the message that names the value)
        (q.long(), k.long(), v.long(), {}, "dtype int64"),
        (q.bool(), k.bool(), v.bool(), {}, "dtype bool"),
        (q.to(torch.complex128), k.to(torch.complex128), v.to(torch.complex128), {}, "dtype complex128"),
        (q.float(), k, v, {}, "float32, float64, float64"),
        (q[..., :0], k[..., :0], v, {}, "D=0"),
        (q[0], k[0], v[0], {}, "shape (2, 5, 4)"),
        (q.tolist(), k, v, {}, "got list"),
        (q, k[:, :, :4], v, {}, "same heads and length"),
        (q, k[..., :3], v, {}, "head dims differ (4 vs 3)"),
        (torch.cat([q, q]), k, v, {}, "batch sizes differ"),
        (torch.cat([q, q[:, :1]], dim=1), k, v, {}, "q has 3 heads and k, v have 2"),
        (q, k[:, :0], v[:, :0], {}, "q has 2 heads and k, v have 0"),
        (q, k, v, {"mask": torch.ones(5, 7, dtype=torch.bool)}, "mask of shape (5, 7)"),
        (q, k, v, {"mask": torch.ones(3, 2, 5, 6, dtype=torch.bool)}, "mask of shape (3, 2, 5, 6)"),
        (q, k, v, {"mask": torch.ones(1, 1, 1, 5, 6, dtype=torch.bool)}, "mask of shape (1, 1, 1, 5, 6)"),
        (q, k, v, {"mask": torch.ones(5, 6, dtype=torch.int64)}, "mask has dtype int64"),
        (q, k, v, {"scale": float("nan")}, "scale=nan"),
        (q, k, v, {"scale": float("-inf")}, "scale=-inf"),
        (q, k, v, {"scale": True}, "scale=True"),
        (q, k, v, {"scale": "0.5"}, "scale='0.5'"),
        (q, k, v, {"scale": 1j}, "scale=1j"),
    ]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_bad_inputs_raise_value_error_naming_the_value(kernel):
    for q, k, v, kw, fragment in _bad_inputs():
        with pytest.raises(ValueError) as info:
            KERNELS[kernel](q, k, v, **kw)
        assert fragment in str(info.value), (fragment, str(info.value))


@pytest.mark.parametrize("name", ["sdpa-math", "eager", "sim-flash"])
def test_backend_run_path_applies_the_same_rule(name):
    from flashcheck.backends import get_backend

    b = get_backend(name)
    for q, k, v, kw, fragment in _bad_inputs():
        with pytest.raises(ValueError) as info:
            b.run(q, k, v, device="cpu", **kw)
        assert fragment in str(info.value), (name, fragment, str(info.value))
    q, k, v = qkv(1, 2, 5, 6, 4)  # GQA runs on every backend: the same as K, V repeated over the query heads
    grouped = b.run(q, k[:, :1], v[:, :1], device="cpu")
    repeated = b.run(q, k[:, :1].expand_as(k), v[:, :1].expand_as(v), device="cpu")
    assert torch.equal(grouped, repeated)


EMPTY = {  # (B, H, Lq, Lk, Dv): what is empty
    "B=0": (0, 2, 5, 6, 4),
    "H=0": (1, 0, 5, 6, 4),
    "Lq=0": (1, 2, 0, 6, 4),
    "Lk=0": (1, 2, 5, 0, 4),
    "Dv=0": (1, 2, 5, 6, 0),
    "Lq=Lk=0": (2, 2, 0, 0, 3),
}


def _empty_qkv(b, h, lq, lk, dv):
    q, k, _ = qkv(b, h, lq, lk, 4)
    return q, k, torch.randn(b, h, lk, dv, dtype=torch.float64)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("case", sorted(EMPTY))
@pytest.mark.parametrize("causal", [False, True])
def test_empty_inputs_give_the_defined_result(kernel, case, causal):
    """Lk = 0: every row sees no key, so zeros (as a fully masked row); other empty sizes: an empty output."""
    b, h, lq, lk, dv = EMPTY[case]
    q, k, v = _empty_qkv(b, h, lq, lk, dv)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out = KERNELS[kernel](*leaves, causal=causal)
    assert out.shape == (b, h, lq, dv)
    assert torch.equal(out.detach(), torch.zeros(b, h, lq, dv, dtype=out.dtype))
    out.sum().backward()  # differentiable, with zero gradients
    for t in leaves:
        assert torch.equal(t.grad, torch.zeros_like(t))


@pytest.mark.parametrize("kernel", ["reference", "flash"])
def test_no_keys_give_lse_minus_inf(kernel):
    q, k, v = _empty_qkv(1, 2, 5, 0, 4)
    _, lse = KERNELS[kernel](q, k, v, return_lse=True)
    assert lse.shape == (1, 2, 5) and torch.isneginf(lse).all()


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-flash", "eager", "sim-flash", "sim-standard"])
@pytest.mark.parametrize("case", ["B=0", "Lq=0", "Lk=0"])
def test_backends_give_the_kernels_result_on_empty_inputs(name, case):
    from flashcheck.backends import get_backend

    q, k, v = (t.float() for t in _empty_qkv(*EMPTY[case]))
    out = get_backend(name).run(q, k, v, device="cpu")
    assert out.dtype == torch.float32
    assert torch.equal(out.double(), reference_attention(q, k, v))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_zero_and_negative_scales_are_defined(kernel):
    """scale 0: every key weighs the same, so the mean of V over the keys a row sees (an oracle that
    needs no softmax); a negative scale: the same as negating q (softmax(-s q k^T) = softmax(s (-q) k^T))."""
    q, k, v = qkv(2, 2, 7, 9, 4)
    zero = KERNELS[kernel](q, k, v, scale=0.0)
    assert (zero - v.mean(dim=-2, keepdim=True).expand_as(zero)).abs().max() < 1e-14
    causal = KERNELS[kernel](q, k, v, scale=0.0, causal=True)
    row = 4  # bottom-right causal: query 4 of 7 sees keys 0..6 of 9
    assert (causal[..., row, :] - v[..., :7, :].mean(dim=-2)).abs().max() < 1e-14
    neg = KERNELS[kernel](q, k, v, scale=-0.7)
    assert (neg - reference_attention(-q, k, v, scale=0.7)).abs().max() < 1e-13


def test_sdpa_agrees_on_zero_and_negative_scales():
    from flashcheck.backends import get_backend

    q, k, v = qkv(1, 2, 6, 6, 8)
    for s in (0.0, -0.5):
        out = get_backend("sdpa-math").run(q, k, v, device="cpu", scale=s)
        assert (out - reference_attention(q, k, v, scale=s)).abs().max() < 1e-13


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_grouped_query_attention_forward_and_gradients(kernel):
    """K/V with 2 heads serve 6 query heads (3 per group): compared with torch SDPA's enable_gqa, an
    independent implementation, forward and gradients in fp64."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    do = torch.randn(2, 6, 7, 5, generator=g, dtype=torch.float64)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, (q, k, v), do)
    out = KERNELS[kernel](q, k, v)
    assert (out - ref).abs().max() < 1e-13
    for got, want in zip(torch.autograd.grad(out, (q, k, v), do), ref_grads, strict=True):
        assert (got - want).abs().max() < 1e-12
