"""KV-cache formats against ml_dtypes and slow per-element oracles."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from flashcheck.kernels.serving.kvcache import (
    KVCacheFormat,
    parse_kv_format,
    quantize_fp4_block16,
    quantize_fp8,
    quantize_kv,
    tensor_scale,
)


def _qkv(seed=0, shape=(2, 3, 40, 32), mean=0.0, sd=3.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * sd + mean for _ in range(3)]


def _ml_fp8(x: np.ndarray, scale) -> np.ndarray:
    """e4m3 through ml_dtypes, saturating first (vLLM clamps before the cast)."""
    y = np.clip(x / scale, -448.0, 448.0)
    return y.astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale


@pytest.mark.parametrize("mode", ["static", "calc", "amax"])
def test_fp8_per_tensor_matches_ml_dtypes(mode):
    q, k, v = _qkv(mean=0.5, sd=40.0)  # values past 448 at scale 1.0 test the saturation
    qq, kq, vq, scales = quantize_kv(q, k, v, f"fp8/{mode}")
    for which, x, xq in (("q", q, qq), ("k", k, kq), ("v", v, vq)):
        s = scales[which]
        expect = {"static": 1.0, "calc": float(x.abs().max()) / {"q": 200, "k": 200, "v": 100}[which],
                  "amax": float(x.abs().max()) / 448}[mode]  # fmt: skip
        assert s == pytest.approx(expect, rel=1e-15)
        np.testing.assert_array_equal(xq.numpy(), _ml_fp8(x.numpy(), s))


def test_fp8_head_and_token_scales():
    _, k, _ = _qkv(seed=1)
    k[:, 1] *= 1e5  # one head far larger: at its scale the other heads fall into e4m3 subnormals
    per_head = parse_kv_format("fp8-head")
    _, kh, _, _ = quantize_kv(k, k, k, per_head)
    for h in range(k.shape[1]):
        s = float(k[:, h].abs().max()) / 448
        np.testing.assert_array_equal(kh[:, h].numpy(), _ml_fp8(k[:, h].numpy(), s))
    _, kt, _, _ = quantize_kv(k, k, k, "fp8-token")
    row = k[1, 2, 7]
    np.testing.assert_array_equal(kt[1, 2, 7].numpy(), _ml_fp8(row.numpy(), float(row.abs().max()) / 448))
    # the per-tensor scale (amax) loses the small heads' resolution that per-head keeps
    _, kt_tensor, _, _ = quantize_kv(k, k, k, "fp8/amax")
    assert (kt_tensor[:, 0] - k[:, 0]).abs().max() > 4 * (kh[:, 0] - k[:, 0]).abs().max()


def _fp4_slow(block: list[float]) -> list[float]:
    """SGLang's recipe, one element at a time: scale 2^ceil(log2(amax / 6)), the nearest e2m1 magnitude with
    a midpoint going to the larger one."""
    amax = max(abs(x) for x in block)
    e = math.ceil(math.log2(max(amax / 6.0, 1e-10)))
    s = 2.0**e
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    out = []
    for x in block:
        a = abs(x) / s
        best = grid[0]
        for lo, hi in itertools.pairwise(grid):
            if a >= (lo + hi) / 2:
                best = hi
        out.append(math.copysign(best, x) * s if best else 0.0)
    return out


def test_fp4_block16_matches_slow_oracle_and_e2m1_values():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 2, 5, 32, generator=g) * 2.0).to(torch.float64)
    x[0, 0, 0, :16] = torch.tensor([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 6.0, -2.5] + [0.0] * 8)  # midpoints, scale 1
    got = quantize_fp4_block16(x)
    flat, gflat = x.reshape(-1, 16), got.reshape(-1, 16)
    for i in range(flat.shape[0]):
        assert gflat[i].tolist() == _fp4_slow(flat[i].tolist())
    # the midpoints go away from zero (ties-to-even would give 0, 1, 1, 2, 4, 4 for the first six)
    assert got[0, 0, 0, :8].tolist() == [0.5, 1.0, 1.5, 3.0, 4.0, 6.0, 6.0, -3.0]
    # every stored value is an e2m1 value times a power of two (checked through ml_dtypes' float4)
    elem = (flat / 2.0 ** torch.ceil(torch.log2(flat.abs().amax(-1, keepdim=True) / 6))).numpy()
    recast = (gflat / 2.0 ** torch.ceil(torch.log2(flat.abs().amax(-1, keepdim=True) / 6))).numpy()
    assert np.array_equal(recast.astype(ml_dtypes.float4_e2m1fn).astype(np.float64), recast)
    assert np.abs(recast - elem).max() <= 1.0  # half of e2m1's largest gap (4 -> 6)


def test_fp8k_nvfp4v_and_bad_names():
    q, k, v = _qkv(seed=4, shape=(1, 2, 8, 32))
    _, kq, vq, _ = quantize_kv(q, k, v, "fp8k-nvfp4v")
    np.testing.assert_array_equal(kq.numpy(), _ml_fp8(k.numpy(), 1.0))
    _, _, v_nv, _ = quantize_kv(q, k, v, "nvfp4")
    assert torch.equal(vq, v_nv)
    assert not torch.equal(vq, quantize_fp8(v, 1.0))
    with pytest.raises(ValueError, match="unknown KV-cache scheme 'fp3'"):
        KVCacheFormat("fp3")
    with pytest.raises(ValueError, match="unknown KV scale 'dyn'"):
        parse_kv_format("fp8/dyn")
    with pytest.raises(ValueError, match="divisible by 16"):
        quantize_fp4_block16(torch.ones(1, 1, 2, 24))
    assert tensor_scale(torch.zeros(3), "calc", "k") == 1.0
