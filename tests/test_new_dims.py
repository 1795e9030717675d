"""The new dimensions in the kernels: causal x GQA x padding x decoding x backward under fp64 (property tests
against the FP64 reference), split-KV decoding and its merge stage, GQA in every CPU backend, padded rows
with no visible key, masked metrics, and the backward knobs (dS row-sum correction, delta source)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashcheck.backends import all_backends
from flashcheck.core.metrics import error_summary, rel_l2
from flashcheck.core.numerics import parse_policy
from flashcheck.kernels import flash_attention, reference_attention, split_kv_attention, standard_attention
from flashcheck.kernels.sim.decode import split_spans
from flashcheck.kernels.sim.masks import key_padding_mask, rows_with_keys
from flashcheck.kernels.sim.validation import expand_kv_heads
from flashcheck.measure import Unavailable, parse_method
from flashcheck.measure.padding import OUTCOMES, classify, padded_row_outcomes
from flashcheck.measure.symmetry import ds_row_sums, measure_point, symmetry_inputs

F64 = torch.float64


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do.to(out.dtype))
    return out.detach(), [t.grad for t in (q, k, v)]


@st.composite
def problems(draw):
    """Random shapes over causal x GQA x padding x decoding (Lq <= Lk or not), with tiles."""
    b, hkv = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    h = hkv * draw(st.sampled_from([1, 2, 4]))
    lk = draw(st.integers(1, 40))
    lq = draw(st.sampled_from([1, 16, draw(st.integers(1, 40))]))
    d = draw(st.sampled_from([4, 8, 16]))
    side = draw(st.sampled_from([None, "left", "right"]))
    lengths = [draw(st.integers(0, lk)) for _ in range(b)]
    mask = None if side is None else key_padding_mask(lengths, lk, side=side)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    q = torch.randn(b, h, lq, d, generator=g, dtype=F64)
    k, v = (torch.randn(b, hkv, lk, d, generator=g, dtype=F64) for _ in range(2))
    do = torch.randn(b, h, lq, d, generator=g, dtype=F64)
    tiles = (draw(st.integers(1, 16)), draw(st.integers(1, 16)))
    return q, k, v, do, mask, draw(st.booleans()), tiles


def _close(a: torch.Tensor, r: torch.Tensor, what: str) -> None:
    err = float((a - r).abs().max()) if a.numel() else 0.0
    assert err <= 1e-12 * max(1.0, float(r.abs().max()) if r.numel() else 1.0), f"{what}: {err:.3e}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["fp64", "fp64,ds_correction=1", "fp64,delta_source=unrounded"]))
def test_fp64_kernels_equal_reference_forward_and_backward(problem, policy):
    q, k, v, do, mask, causal, (bq, bk) = problem
    ref, ref_g = _grads(lambda a, b, c: reference_attention(a, b, c, causal=causal, mask=mask), q, k, v, do)
    flash = lambda a, b, c: flash_attention(  # noqa: E731
        a, b, c, policy=policy, block_q=bq, block_k=bk, causal=causal, mask=mask
    )
    for name, fn in (
        ("flash", flash),
        ("standard", lambda a, b, c: standard_attention(a, b, c, causal=causal, mask=mask)),
    ):
        out, g = _grads(fn, q, k, v, do)
        _close(out, ref, f"{name} out")
        for t, a, r in zip("qkv", g, ref_g, strict=True):
            _close(a, r, f"{name} d{t}")
    with torch.no_grad():
        for splits in (1, 3):
            out = split_kv_attention(q, k, v, policy="fp64", splits=splits, block_k=bk, causal=causal, mask=mask)
            _close(out, ref, f"splitkv S={splits}")


# ---- split-KV decoding --------------------------------------------------------------------------------------


def _cache(lq: int, lk: int, hkv: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 8, lq, 32, generator=g, dtype=F64)
    return q, *(torch.randn(1, hkv, lk, 32, generator=g, dtype=F64) for _ in range(2))


def test_split_spans_follow_whole_key_blocks():
    assert split_spans(1000, 4, 64) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert split_spans(100, 8, 64) == [(0, 64), (64, 100)]  # fewer blocks than splits
    with pytest.raises(ValueError, match="splits=0"):
        split_spans(100, 0, 64)


def test_one_split_is_the_flash_kernel_bit_for_bit():
    q, k, v = _cache(16, 700)
    out = split_kv_attention(q, k, v, policy="bf16-mixed", splits=1, block_k=64, causal=True)
    assert torch.equal(out, flash_attention(q, k, v, policy="bf16-mixed", block_k=64, causal=True))


@pytest.mark.parametrize("lq", [1, 16])
def test_merge_stage_is_the_only_rounding_under_fp64_elsewhere(lq):
    """Everything fp64 but the merge: exact with merge=fp64, and with merge=bf16 an error that is nonzero and
    within the bound of S + 1 roundings of partials, weights and sums (each <= u |value|, |O_s| <= max|v|)."""
    q, k, v = _cache(lq, 1024)
    ref = reference_attention(q, k, v, causal=True)
    s = 8
    exact = split_kv_attention(q, k, v, policy="fp64", splits=s, block_k=64, causal=True)
    assert float((exact - ref).abs().max()) < 1e-12
    low = split_kv_attention(q, k, v, policy="fp64,merge=bf16", splits=s, block_k=64, causal=True)
    err = float((low - ref).abs().max())
    assert 0 < err <= (4 * s + 2) * 2.0**-8 * float(v.abs().max())


@pytest.mark.parametrize("lq", [1, 16])
def test_split_kv_bf16_within_peer_budget_of_standard(lq):
    """The peers' rule (kernel error <= 2x the same-precision standard's), over 3 seeds, GQA 8:2, causal."""
    for seed in range(3):
        q, k, v = _cache(lq, 2048, seed=seed)
        ref = reference_attention(q, k, v, causal=True)
        base = rel_l2(standard_attention(q, k, v, policy="bf16-mixed", causal=True), ref)
        out = split_kv_attention(q, k, v, policy="bf16-mixed", splits=4, block_k=128, causal=True)
        assert rel_l2(out, ref) <= 2 * base


def test_splitkv_method_parses_runs_and_refuses_backward():
    m = parse_method("splitkv:bf16-mixed", splits=3, block_k=64)
    assert m.label() == "splitkv:bf16-mixed[128x64 fa2 S=3]"
    assert str(m.baseline()) == "standard:bf16-mixed"
    q, k, v = _cache(1, 300)
    want = split_kv_attention(q, k, v, policy="bf16-mixed", splits=3, block_k=64)
    assert torch.equal(m.run(q, k, v), want.double())
    with pytest.raises(Unavailable, match="forward only"):
        m.check_available(backward=True)
    with pytest.raises(ValueError, match="splits=0"):
        parse_method("splitkv:bf16-mixed", splits=0)
    with pytest.raises(ValueError, match="forward only"):
        split_kv_attention(q.requires_grad_(), k, v)


# ---- GQA and padding in every CPU backend ----------------------------------------------------------------------


def _cpu_backends():
    return [b for b in all_backends() if b.available(torch.float32, "cpu").ok]


# backends that compute grouped heads in their own layout: JAX reshapes Q to [B, T, Hkv, G, D] and batches the G
# query heads of each K/V head in one dot, so its sums run in another order than with repeated K/V heads
OWN_GROUPING = {"jax-xla"}


@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa_equals_repeated_kv_heads_in_every_cpu_backend(hkv):
    q, k, v = (t.float() for t in _cache(12, 20, hkv=hkv))
    keep = key_padding_mask([20], 20, side="left")
    ke, ve = expand_kv_heads(q, k, v)
    names = []
    for b in _cpu_backends():
        assert b.supports_gqa, b.name
        for causal, mask in ((False, None), (True, keep)):
            got = b.run(q, k, v, device="cpu", causal=causal, mask=mask)
            assert got.shape == q.shape
            repeated = b.run(q, ke, ve, device="cpu", causal=causal, mask=mask)
            if b.name in OWN_GROUPING:  # another dot shape: equal to a few fp32 roundings, not bit for bit
                assert float((got - repeated).abs().max()) <= 8 * 2**-24 * float(repeated.abs().max()), b.name
            else:
                assert torch.equal(got, repeated), b.name
        names.append(b.name)
    assert {"sdpa-math", "sdpa-flash", "eager", "sim-flash"} <= set(names)


def test_padding_masks_and_rows_without_keys():
    assert key_padding_mask([3, 0], 4, side="left").squeeze().tolist() == [[False, True, True, True], [False] * 4]
    assert key_padding_mask([3], 4).squeeze().tolist() == [True, True, True, False]
    seen = rows_with_keys(4, 4, causal=True, mask=key_padding_mask([2], 4, side="left"))
    assert seen.squeeze().tolist() == [False, False, True, True]
    with pytest.raises(ValueError, match="middle"):
        key_padding_mask([1], 4, side="middle")
    with pytest.raises(ValueError, match=r"\[5\]"):
        key_padding_mask([5], 4)


def test_classify_outcomes():
    assert classify(torch.tensor([0.0, math.nan])) == "nan"
    assert classify(torch.zeros(3)) == "zeros"
    assert classify(torch.tensor([0.0, 0.5])) == "other"


@pytest.mark.parametrize(("side", "causal", "style"), [("left", True, "bool"), ("right", False, "min")])
def test_padded_row_outcomes_report_every_implementation(side, causal, style):
    rows = {r.name.split(":")[0]: r for r in padded_row_outcomes(side=side, causal=causal, mask_style=style)}
    assert {"reference", "standard", "flash", "splitkv"} <= set(rows)
    assert {b.name for b in all_backends() if not b.name.startswith("sim-")} <= set(rows)
    ok = [r for r in rows.values() if r.status == "ok"]
    assert {"sdpa-math", "sdpa-flash", "eager", "flex"} <= {r.name.split(":")[0] for r in ok}
    for r in ok:
        assert r.outcome in OUTCOMES
        # real-token rows: the peers' rule against eager PyTorch in the same dtype
        assert r.rel_l2 <= 2 * rows["eager"].rel_l2 or r.name.startswith("reference"), r
    # the defined result of rows with no key (bool mask): zeros in the FP64 reference and the simulators;
    # an additive finfo.min mask instead averages the padded values (as the math says)
    want = "zeros" if style == "bool" else "other"
    assert {rows[n].outcome for n in ("reference", "standard", "flash", "splitkv")} == {want}
    assert all(r.reason for r in rows.values() if r.status != "ok")


def test_metrics_exclude_masked_positions():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 3, 5, 4, generator=g, dtype=F64)
    out = ref + 1e-3 * torch.randn(2, 3, 5, 4, generator=g, dtype=F64)
    out[1, :, :2] = math.nan  # padded rows of the second sequence
    keep = torch.ones(2, 1, 5, 1, dtype=torch.bool)
    keep[1, :, :2] = False
    sel = torch.cat([out[0].flatten(), out[1, :, 2:].flatten()]), torch.cat([ref[0].flatten(), ref[1, :, 2:].flatten()])
    assert rel_l2(out, ref, mask=keep) == rel_l2(*sel)
    assert all(math.isfinite(x) for x in error_summary(out, ref, mask=keep).values())
    assert math.isnan(error_summary(out, ref)["max_abs"])
    with pytest.raises(ValueError, match="does not broadcast"):
        rel_l2(out, ref, mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        rel_l2(out, ref, mask=keep.double())


# ---- backward knobs --------------------------------------------------------------------------------------------


def test_ds_row_sums_are_zero_exactly_and_not_in_bf16():
    pol = parse_policy("bf16-mixed")
    q, k, v, do = symmetry_inputs(64.0, 4.0, policy=pol, seq_len=32, head_dim=16)
    r64, l1, _ = ds_row_sums(q, k, v, do, parse_policy("fp64"))
    assert float((r64.abs() / l1).max()) < 1e-13
    r16, l1, _ = ds_row_sums(q, k, v, do, pol)
    assert float((r16.abs() / l1).mean()) > 1e-4


def test_correction_restores_the_zero_sum_of_dk():
    """Shifting every key by one vector leaves softmax unchanged, so the exact sum_j dK_j is 0; the rounded
    dS row sums break it, the correction restores it (to fp32 rounding: dK is kept in fp32 here, since the
    bf16 rounding of each dK_j alone leaves a sum of about 2^-9 |dK|)."""
    pol = parse_policy("bf16-mixed,grad_output=fp32")
    q, k, v, do = symmetry_inputs(64.0, 4.0, policy=pol, seq_len=64, head_dim=32)
    sums = {}
    for name, p in (("plain", pol), ("fixed", pol.replace(ds_correction=True))):
        _, (_, dk, _) = _grads(lambda a, b, c, p=p: flash_attention(a, b, c, policy=p, block_k=16), q, k, v, do)
        sums[name] = float(dk.double().sum(dim=-2).norm() / dk.double().norm())
    assert sums["fixed"] < 1e-5 and sums["plain"] > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correction_cuts_dq_error_tenfold_at_the_sharpest_setting(seed):
    p = measure_point(256.0, 16.0, seq_len=64, head_dim=32, block=16, seed=seed)
    assert p.dq_reduction >= 10, p
    assert p.dk_err_fixed <= 1.1 * p.dk_err  # dK is not made worse


def test_delta_source_reads_the_chosen_copy_of_o():
    """Only the output is rounded (bf16): a backward whose delta reads the unrounded O is exact; the forward's
    rounded O (the default) and a fresh stochastic rounding are not, and the fresh one depends on its seed."""
    q, k, v = _cache(24, 24)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    _, ref = _grads(reference_attention, q, k, v, do)
    err = {}
    for name in ("forward", "unrounded", "fresh", "fresh-1"):
        src, _, seed = name.partition("-")
        pol = f"fp64,output=bf16,delta_source={src},delta_seed={seed or 0}"
        _, g = _grads(lambda a, b, c, p=pol: flash_attention(a, b, c, policy=p, block_k=8), q, k, v, do)
        err[name] = g[0]
    assert float((err["unrounded"] - ref[0]).abs().max()) < 1e-12
    assert float((err["forward"] - ref[0]).abs().max()) > 1e-6
    assert float((err["fresh"] - ref[0]).abs().max()) > 1e-6
    assert not torch.equal(err["fresh"], err["fresh-1"])
    with pytest.raises(ValueError, match="delta_source"):
        parse_policy("bf16-mixed,delta_source=cached")


def test_compare_runs_the_split_kv_kernel_human_output():
    from typer.testing import CliRunner

    from flashcheck.cli import app

    args = "compare --kernel splitkv --numerics bf16-mixed --seq-len 96 --heads 2 --block-k 16 --causal"
    res = CliRunner().invoke(app, args.split())
    assert res.exit_code == 0, res.output
    assert "splitkv [bf16-mixed] vs standard [bf16-mixed]" in res.output
    assert "rel_l2" in res.output and "causal" in res.output
