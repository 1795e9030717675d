"""flashcheck's acceptance rule (flashcheck.core.budget, rule="flashcheck") beside the peers' rule, and the pytest
helper that applies it (flashcheck.testing.assert_attention_close)."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.core.budget import (
    FACTORS,
    K_FORWARD,
    K_GRADIENT,
    STATISTICS,
    Factors,
    bias_error,
    check_budget,
    factors_for,
    flashcheck_statistics,
    rel_l2_error,
    row_ratio,
)
from flashcheck.core.inputs import DISTRIBUTIONS
from flashcheck.testing import assert_attention_close
from flashcheck.testing.mutants import MUTANTS, correct_kernel


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one torch thread is as fast, and on a shared machine extra threads only spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _noisy(ref: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    """ref plus independent Gaussian noise of relative size `rel` per element."""
    g = torch.Generator().manual_seed(seed)
    return ref + rel * ref.abs().mean() * torch.randn(ref.shape, generator=g, dtype=torch.float64)


def test_statistics_against_direct_formulas(gen):
    ref = torch.randn(2, 3, 40, 8, generator=gen, dtype=torch.float64)
    err = 1e-3 * torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    assert rel_l2_error(err, ref) == pytest.approx(float(err.norm() / ref.norm()))
    # bias: groups of 16 rows, the 8 left over join the second group -> groups of 16 and 24 rows
    halves = [(err[..., :16, :], ref[..., :16, :]), (err[..., 16:, :], ref[..., 16:, :])]
    along = torch.stack([(e * r).sum((-2, -1)) / r.pow(2).sum((-2, -1)).sqrt() for e, r in halves])
    norms = torch.stack([r.pow(2).sum((-2, -1)) for _, r in halves])
    assert bias_error(err, ref) == pytest.approx(float(along.pow(2).mean().sqrt() / norms.mean().sqrt()))
    assert bias_error(0.01 * ref, ref) == pytest.approx(0.01)  # a 1% gain error is a bias of 0.01 in every group
    per_row = err.norm(dim=-1) / (2 * err).norm(dim=-1)
    assert row_ratio(err, 2 * err) == pytest.approx(float(per_row.median())) == pytest.approx(0.5)
    assert row_ratio(torch.zeros(3, 4), torch.zeros(3, 4)) == 0.0
    assert math.isinf(row_ratio(torch.ones(1, 4), torch.zeros(1, 4)))


def test_flashcheck_rule_sees_a_gain_error_under_the_floor():
    """A 0.5% systematic gain error sits far below the bf16 floor: the peers' rule passes it, the bias
    and row views do not; rounding-sized noise passes both rules."""
    ref = torch.randn(1, 4, 256, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    base = _noisy(ref, 4e-3, 1)  # the baseline: unbiased noise
    good = _noisy(ref, 3e-3, 2)
    biased = _noisy(ref * 1.005, 3e-3, 2)
    for rule in ("peers", "flashcheck"):
        assert check_budget(good, ref, base, dtype=torch.bfloat16, rule=rule), rule
    assert check_budget(biased, ref, base, dtype=torch.bfloat16, rule="peers")
    res = check_budget(biased, ref, base, dtype=torch.bfloat16)
    assert not res and {c.name for c in res.failed()} >= {"bias"} and res.rule == "flashcheck"
    assert "rule flashcheck" in res.message() and res.to_dict()["rule"] == "flashcheck"


def test_rules_share_the_max_and_nonfinite_checks():
    ref = torch.linspace(-1, 1, 64, dtype=torch.float64).reshape(4, 16)
    out = ref.clone()
    out[0, 0] = float("nan")
    peers, ours = check_budget(out, ref, ref, rule="peers"), check_budget(out, ref, ref)
    assert [c.name for c in peers.checks] == ["max", "mean", "nonfinite"]
    assert [c.name for c in ours.checks] == ["max", "nonfinite", "rel_l2", "bias", "row"]
    assert {c.name for c in ours.failed()} >= {"max", "nonfinite"}
    assert ours.checks[0].bound == pytest.approx(peers.checks[0].bound)  # the same form of max-error test
    with pytest.raises(ValueError, match="unknown rule 'strict'; expected one of peers, flashcheck"):
        check_budget(ref, ref, ref, rule="strict")


def test_factors_are_calibrated_and_cover_every_dtype():
    assert {d for d, _, _ in FACTORS} == {"bfloat16", "float16", "float32"}
    # every distribution is calibrated but "sink" (issue 23's attention-sink inputs, added after the calibration):
    # it takes the largest factors over the calibrated ones, as inputs of unknown distribution do
    assert {dist for _, _, dist in FACTORS} == set(DISTRIBUTIONS) - {"sink"}
    assert all(min(f.rel_l2, f.bias, f.row) >= 1 for f in FACTORS.values())  # the baseline passes its own rule
    assert all(f.max >= (K_GRADIENT if kind == "gradient" else K_FORWARD) for (_, kind, _), f in FACTORS.items())
    normal = factors_for(torch.bfloat16, gradient=False, distribution="normal")
    assert normal == FACTORS[("bfloat16", "output", "normal")]
    unknown = factors_for(torch.bfloat16, gradient=False)  # inputs not known: the largest over distributions
    outputs = [f for (d, kind, _), f in FACTORS.items() if (d, kind) == ("bfloat16", "output")]
    assert unknown == Factors(*(max(getattr(f, a) for f in outputs) for a in STATISTICS))
    assert factors_for(torch.bfloat16, gradient=False, distribution="sink") == unknown
    fp8 = factors_for(torch.float8_e4m3fn, gradient=True)  # uncalibrated dtype: the loosest factors
    grads = [f for (_, kind, _), f in FACTORS.items() if kind == "gradient"]
    assert fp8 == Factors(*(max(getattr(f, a) for f in grads) for a in STATISTICS))
    ref = torch.ones(4, 16, dtype=torch.float64)
    k32 = check_budget(ref, ref, ref, dtype=torch.float32, gradient=True, distribution="tied").k
    assert k32 == FACTORS[("float32", "gradient", "tied")].max
    assert check_budget(ref, ref, ref, dtype=torch.float32, gradient=True, rule="peers").k == K_GRADIENT
    assert check_budget(ref, ref, ref, k=5.0).k == 5.0


def test_statistics_skip_rows_where_the_reference_is_not_finite():
    ref = torch.ones(2, 16, 4, dtype=torch.float64)
    ref[0, 3, 1] = float("inf")
    out = ref * 1.01
    stats = flashcheck_statistics(out, ref, ref, torch.float32)
    assert stats["bias"][0] == pytest.approx(0.01) and math.isfinite(stats["rel_l2"][0])


def _sdpa(which: str):
    def fn(q, k, v, causal=False):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, which)]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("which", ["MATH", "FLASH_ATTENTION"])
def test_default_rule_passes_real_cpu_kernels(which, dtype):
    """SDPA math and flash on the CPU, forward and backward, causal and not, on the helper's default grid."""
    assert_attention_close(_sdpa(which), dtype=dtype, backward=True)


def test_helper_catches_the_scale_bug_the_peers_pass():
    mutant, grid = MUTANTS["scale-1%"].fn, {"shapes": ((1, 4, 128, 64),), "kv_heads": 2, "causal": (False,)}
    assert_attention_close(mutant, **grid, rule="peers")  # the issue: it passes (on this case; see the score)
    with pytest.raises(AssertionError, match="rule flashcheck") as err:
        assert_attention_close(mutant, **grid)
    assert "bias" in str(err.value) and "FAIL" in str(err.value)


def test_helper_grouped_query_heads():
    assert_attention_close(correct_kernel, shapes=((1, 4, 97, 32),), kv_heads=2, causal=(True,), backward=True)
    with pytest.raises(AssertionError, match="kv_heads 2"):
        assert_attention_close(MUTANTS["gqa-modulo"].fn, shapes=((1, 4, 97, 32),), kv_heads=2, causal=(True,))
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=4"):
        assert_attention_close(correct_kernel, shapes=((1, 4, 97, 32),), kv_heads=3)
    with pytest.raises(ValueError, match="unknown rule"):
        assert_attention_close(correct_kernel, rule="loose")
