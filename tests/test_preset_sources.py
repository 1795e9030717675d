"""The presets that follow their kernels' sources (sage3-fp4, sage2-ada, sage2-hopper, fa3-fp8) against the
slow hand-written oracles of tests/preset_oracles.py on tiny shapes, and the rules the sources fix."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from flashcheck.core.numerics import Format
from flashcheck.kernels.formats.sage3 import quantize_fp4x16, sage3_inputs, sage3_p
from flashcheck.kernels.sim.flash import flash_attention
from flashcheck.kernels.sim.fp8 import incoherence_matrix
from flashcheck.kernels.sim.presets import KERNEL_PRESETS, resolve
from preset_oracles import fa3_fp8_oracle, fp4x16_row, rnd, sage2_oracle, sage3_oracle

L, D = 160, 32
# An accumulator's rounding per output element is at most (terms per accumulation) x u x sum |p v| / l: fp16
# within 64 keys (u = 2^-11), FP22 within 128 keys (truncating, 2^-12 per 32-key chunk added), fp32 (2^-23 x L);
# a score formed in float32 instead of float64 (2^-20 relative) can move one P across a rounding boundary only
# at the very rare near-tie, which the seeds below do not meet on either CPU family.
ACC_BOUND = {"sage2-ada": 64 * 2.0**-11, "sage2-hopper": 4 * 2.0**-12, "sage3-fp4": L * 2.0**-22,
             "fa3-fp8": L * 2.0**-22}  # fmt: skip
OUT_FMT = {"sage3-fp4": "bf16", "sage2-ada": "fp16", "sage2-hopper": "fp16", "fa3-fp8": "fp16"}


def _qkv(seed: int, offset: float = 0.0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((L, D)) for _ in range(3))
    shift = offset * rng.standard_normal(D)  # a channel offset shared by Q and K (the smoothing's target)
    return q + shift, k + shift, v


def _oracle(name: str, q, k, v, causal: bool):
    if name == "sage3-fp4":
        return sage3_oracle(q, k, v, "bf16", causal)
    if name.startswith("sage2"):
        return sage2_oracle(q, k, v, name.split("-")[1], causal)
    bq, bk = KERNEL_PRESETS["fa3-fp8"].tiles(L, L, D, causal)
    return fa3_fp8_oracle(q, k, v, incoherence_matrix(D).numpy(), bq, bk, causal)


def _sim(name: str, q, k, v, causal: bool) -> np.ndarray:
    fmt = "fp8-e4m3" if name == "fa3-fp8" else ("bf16" if name == "sage3-fp4" else "fp16")
    t = [torch.tensor(x)[None, None] for x in (q, k, v)]
    with torch.no_grad():
        out = flash_attention(*t, causal=causal, **resolve(name, fmt, L, L, D, causal))
    return out[0, 0].double().numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["sage3-fp4", "sage2-ada", "sage2-hopper", "fa3-fp8"])
def test_preset_equals_its_oracle_within_the_accumulator_bound(name, causal):
    q, k, v = _qkv(3, offset=2.0)
    got, (want, mag) = _sim(name, q, k, v, causal), _oracle(name, q, k, v, causal)
    half = {"bf16": 2.0**-7, "fp16": 2.0**-10}[OUT_FMT[name]]  # one ulp relative: 2^-(mantissa bits)
    bound = ACC_BOUND[name] * mag + half * np.abs(want)  # plus one output ulp: both round nearly equal values
    excess = np.abs(got - want) - bound
    assert excess.max() <= 0, (name, causal, float(excess.max()), int((excess > 0).sum()))


def test_sage3_quantiser_is_the_kernels_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64)) * np.array([1e-3, 1.0, 30.0, 1e-6, 4.0])[:, None]
    got = quantize_fp4x16(torch.tensor(x)).numpy()
    want = np.stack([fp4x16_row(r) for r in x])
    assert np.array_equal(got, want)
    assert np.all(got[3] == 0)  # amax / 6 below e4m3's smallest subnormal: the scale, so the block, is 0


def test_sage3_p_divides_by_the_float32_scale_and_multiplies_by_its_e4m3():
    p = torch.tensor([[1.0, 0.7, 0.31, 0.05] * 4 + [0.02, 0.019] * 8], dtype=torch.float32)
    got = sage3_p(p).double().numpy()[0]
    for g in (slice(0, 16), slice(16, 32)):  # each 16-key group has its own scale
        pt = (p[0, g] * 2688.0).numpy().astype(np.float32)
        a = np.float32(pt.max()) / np.float32(6.0)
        want = rnd(np.clip(pt / a, -6, 6), ml_dtypes.float4_e2m1fn) * float(rnd(a, ml_dtypes.float8_e4m3fn))
        assert np.array_equal(got[g], want)
    assert got[0] == 6.0 * float(rnd(np.float32(2688.0) / np.float32(6.0), ml_dtypes.float8_e4m3fn))


def test_sage3_inputs_smooth_k_and_add_q_block_means_back():
    q, k, v = (torch.tensor(a)[None, None] for a in _qkv(5, offset=3.0))
    q2, k2, _ = sage3_inputs(q, k, v, Format.BF16)
    assert q2.shape[-1] == 2 * D and k2.shape[-1] == 2 * D
    assert abs(float(k2[..., D:].mean(dim=-2).abs().max())) < 0.02  # smoothed K: mean ~ 0 (bf16 rounding)
    exact = (q @ k.transpose(-1, -2)) - (q @ k.mean(dim=-2, keepdim=True).transpose(-1, -2))
    approx = q2 @ k2.transpose(-1, -2)
    no_mean = q2[..., :D] @ k2[..., :D].transpose(-1, -2)
    # adding q-bar K^T back restores what the smoothing removed: far closer to the exact scores than without
    assert (approx - exact).abs().mean() < 0.2 * (no_mean - exact).abs().mean()


def test_old_sage2_names_are_aliases_of_the_gpu_presets():
    assert (
        resolve("sage2", "fp16", 64, 64, 32, False)["policy"]
        == resolve("sage2-hopper", "fp16", 64, 64, 32, False)["policy"]
    )
    assert (
        resolve("sage2pp", "fp16", 64, 64, 32, False)["policy"]
        == resolve("sage2-ada", "fp16", 64, 64, 32, False)["policy"]
    )
    hop = resolve("sage2-hopper", "fp16", 64, 64, 32, False)
    assert (hop["block_q"], hop["block_k"], hop["policy"].qk_warp_q, hop["policy"].qk_warp_k) == (64, 128, 16, 128)
    assert resolve("fa3-fp8", "fp8-e4m3", 64, 64, 32, False)["policy"].p_scale == 256.0


@pytest.mark.parametrize("name", ["sage3-fp4", "sage2-ada", "sage2-hopper", "fa3-fp8"])
def test_each_source_following_preset_cites_file_and_commit(name):
    doc = KERNEL_PRESETS[name].policy.__doc__ or ""
    assert "commit" in doc and (".cu" in doc or ".h" in doc or ".py" in doc), (name, doc[:80])
