"""The FP64 oracle against mpmath at 50 digits, and its masking, chunking and LSE."""

from __future__ import annotations

import mpmath
import pytest
import torch

from flashcheck.kernels import reference_attention

mpmath.mp.dps = 50


def mp_attention(q, k, v, scale, keep):
    """Attention for one head at 50 digits; keep[i][j] False masks; a fully masked row gives 0."""
    lq, lk, dv = q.shape[0], k.shape[0], v.shape[1]
    out = torch.zeros(lq, dv, dtype=torch.float64)
    for i in range(lq):
        s = [
            mpmath.mpf(scale)
            * mpmath.fsum(mpmath.mpf(float(q[i, d])) * mpmath.mpf(float(k[j, d])) for d in range(q.shape[1]))
            for j in range(lk)
        ]
        idx = [j for j in range(lk) if keep[i][j]]
        if not idx:
            continue
        m = max(s[j] for j in idx)
        w = {j: mpmath.exp(s[j] - m) for j in idx}
        z = mpmath.fsum(w.values())
        for c in range(dv):
            out[i, c] = float(mpmath.fsum(w[j] * mpmath.mpf(float(v[j, c])) for j in idx) / z)
    return out


@pytest.mark.parametrize("lq,lk,d,causal", [(3, 3, 2, False), (4, 6, 3, True), (5, 3, 4, True), (2, 5, 4, False)])
def test_reference_matches_mpmath(lq, lk, d, causal, gen):
    q = torch.randn(1, 1, lq, d, generator=gen, dtype=torch.float64) * 3
    k = torch.randn(1, 1, lk, d, generator=gen, dtype=torch.float64) * 3
    v = torch.randn(1, 1, lk, d, generator=gen, dtype=torch.float64)
    keep = [[(not causal) or j <= i + lk - lq for j in range(lk)] for i in range(lq)]
    want = mp_attention(q[0, 0], k[0, 0], v[0, 0], d**-0.5, keep)
    got = reference_attention(q, k, v, causal=causal, chunk=2)
    assert torch.allclose(got[0, 0], want, rtol=1e-13, atol=1e-15)
    if lq > lk and causal:  # bottom-right alignment: the first lq - lk rows see no key
        assert torch.equal(got[0, 0, : lq - lk], torch.zeros(lq - lk, d, dtype=torch.float64))


def test_reference_bool_and_additive_masks(gen):
    q, k, v = (torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5, generator=gen) > 0.4
    keep[0, 0, 2] = False  # one fully masked row
    got = reference_attention(q, k, v, mask=keep)
    additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    assert torch.equal(got, reference_attention(q, k, v, mask=additive))
    assert torch.equal(got[0, :, 2], torch.zeros(2, 4, dtype=torch.float64))
    for b in range(2):
        for h in range(2):
            want = mp_attention(q[b, h], k[b, h], v[b, h], 0.5, keep[b, 0].tolist())
            assert torch.allclose(got[b, h], want, rtol=1e-13, atol=1e-15)


def test_reference_chunking_and_lse(gen):
    q, k, v = (torch.randn(1, 3, 37, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out, lse = reference_attention(q, k, v, causal=True, chunk=5, return_lse=True)
    full = reference_attention(q, k, v, causal=True, chunk=10_000)
    assert torch.allclose(out, full, rtol=0, atol=1e-15)
    s = (q @ k.transpose(-1, -2)) * 8**-0.5
    s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(s, dim=-1), rtol=1e-14)


def test_reference_matches_sdpa_math_in_fp64(gen):
    q, k, v = (torch.randn(2, 4, 33, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(reference_attention(q, k, v, causal=True, chunk=7), sdpa, rtol=1e-12, atol=1e-14)


def test_reference_propagates_nan_and_disables_autocast(gen):
    q, k, v = (torch.randn(1, 1, 4, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    k[0, 0, 1, 0] = float("nan")
    assert torch.isnan(reference_attention(q, k, v)).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert reference_attention(q.float(), q.float(), q.float()).dtype == torch.float64


def test_reference_rejects_bad_shapes():
    with pytest.raises(ValueError, match="4-D"):
        reference_attention(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="broadcast"):
        z = torch.zeros(1, 1, 4, 2)
        reference_attention(z, z, z, mask=torch.ones(3, 3, dtype=torch.bool))
