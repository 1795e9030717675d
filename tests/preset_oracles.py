"""Slow hand-written oracles of the kernel presets that follow their kernels' sources (sage3-fp4, sage2-ada,
sage2-hopper, fa3-fp8), one head at a time, on tiny shapes: numpy loops over rows, key blocks and scale
groups, formats rounded by ml_dtypes (independent of flashcheck's rounding). Each follows its kernel's
source as the preset's docstring cites it; the P·V product and Q K^T are summed in float64 (the accumulator
model is tested elsewhere; tests bound its share). Arrays [L, D] float64; returns (out [Lq, Dv], sum |P| |V|
per output [Lq, Dv] / l, the scale of an accumulator's rounding); the output rounded as the preset's."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

E4M3, E2M1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn
HALF = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
LOG2E = 1.4426950408889634


def rnd(x, dtype) -> np.ndarray:
    """x rounded to dtype (nearest even) through float32, back in float64."""
    return np.asarray(x, np.float32).astype(dtype).astype(np.float64)


def sat(x, limit: float) -> np.ndarray:
    return np.clip(np.asarray(x, np.float64), -limit, limit)


def fp4x16_row(vec: np.ndarray) -> np.ndarray:
    """One row quantised in 16-element blocks, each with e4m3(amax / 6), elements e2m1(x * (1 / s))."""
    out = np.zeros_like(vec)
    for b in range(0, len(vec), 16):
        blk = np.asarray(vec[b : b + 16], np.float32)
        s = float(rnd(np.float32(np.abs(blk).max()) / np.float32(6.0), E4M3))
        if s == 0.0:
            continue
        inv = np.float32(1.0) / np.float32(s)
        out[b : b + 16] = rnd(sat(blk * inv, 6.0), E2M1) * s
    return out


def _attend(q2, k2, v, *, block_k: int, reverse: bool, causal: bool, quant_p, scale: float, start=None):
    """Online softmax over key blocks (exp2, log2(e) in the scale) with P quantised by quant_p(P) -> (Pq, unit).
    start [Lq, Lk]: added to each product q2[i] k2[j] before the scale (the MMA's initial accumulator)."""
    lq, lk = q2.shape[0], k2.shape[0]
    blocks = [(c, min(c + block_k, lk)) for c in range(0, lk, block_k)]
    out, mag = np.zeros((lq, v.shape[1])), np.zeros((lq, v.shape[1]))
    for i in range(lq):
        m, l, o, a = -math.inf, 0.0, np.zeros(v.shape[1]), np.zeros(v.shape[1])
        for c0, c1 in reversed(blocks) if reverse else blocks:
            c = np.zeros(c1 - c0) if start is None else start[i, c0:c1]
            s = np.array([(float(q2[i] @ k2[j]) + c[j - c0]) * scale * LOG2E for j in range(c0, c1)])
            if causal:
                s[np.arange(c0, c1) > i + lk - lq] = -math.inf
            if np.all(np.isneginf(s)):
                continue
            m_new = max(m, float(s.max()))
            alpha = 2.0 ** (m - m_new) if m > -math.inf else 0.0
            p = np.exp2(s - m_new)
            l = l * alpha + float(p.sum())
            pq, unit = quant_p(p)
            o = o * alpha + pq @ v[c0:c1] / unit
            a = a * alpha + np.abs(pq) @ np.abs(v[c0:c1]) / unit
            m = m_new
        out[i], mag[i] = (o / l, a / l) if l > 0 else (o, a)
    return out, mag


def sage3_qk(q, k, half: str = "bf16"):
    """SageAttention3's Q K^T operands (sageattention3_blackwell at d1a57a5, api.py preprocess_qkv): (Qs' [Lq, D],
    Ks' [Lk, D] in 1x16 FP4, delta_s [Lq, Lk]): K smoothed in `half`, Q's per-128-row mean qm (float32, the
    kernel pads L with zero rows) subtracted, delta_s = torch.matmul(qm, Ks^T) in `half` then float32: here
    the exact sum (math.fsum) of the products rounded once to `half` (ml_dtypes / numpy casts from float64)."""
    h = HALF[half]
    qh, kh = rnd(q, h), rnd(k, h)
    ks = rnd(kh - rnd(np.float32(kh.astype(np.float32).mean(axis=0)), h), h)
    lq = qh.shape[0]
    qs, qm = np.zeros_like(qh), np.zeros_like(qh)
    for g in range(0, lq, 128):
        mean = np.float32(qh[g : g + 128].sum(axis=0) / 128.0)  # the kernel pads L with zero rows
        qs[g : g + 128] = rnd(qh[g : g + 128] - mean, h)
        qm[g : g + 128] = rnd(mean, h)
    exact = np.array([[math.fsum(qm[i] * ks[j]) for j in range(len(ks))] for i in range(lq)])
    delta = np.asarray(exact, np.float64).astype(h).astype(np.float64)
    return np.stack([fp4x16_row(r) for r in qs]), np.stack([fp4x16_row(r) for r in ks]), delta


def sage3_oracle(q, k, v, half: str = "bf16", causal: bool = False):
    """SageAttention3 (sageattention3_blackwell at d1a57a5): api.py's smoothing and delta_s (sage3_qk), the
    1x16 FP4 quantiser, the scores Qs' Ks'^T + delta_s (delta_s the Q K^T MMA's initial accumulator, mainloop
    add_delta_s), P at 448 * 6 with per-16 scales (element by the float32 scale, MMA by its e4m3 rounding), key
    blocks of 128 last to first."""
    h = HALF[half]
    vh = rnd(v, h)
    d = q.shape[1]
    qq, kq, delta = sage3_qk(q, k, half)
    vq = np.stack([fp4x16_row(c) for c in vh.T]).T  # blocks of 16 tokens per channel
    unit = 448.0 * 6.0

    def quant_p(p):
        pt = np.asarray(p * unit, np.float32)
        out = np.zeros(len(pt))
        for b in range(0, len(pt), 16):
            a = np.float32(pt[b : b + 16].max()) / np.float32(6.0)
            if a > 0:
                out[b : b + 16] = rnd(sat(pt[b : b + 16] / a, 6.0), E2M1) * float(rnd(a, E4M3))
        return out, unit

    kw = {"block_k": 128, "reverse": True, "causal": causal, "quant_p": quant_p, "scale": d**-0.5}
    out, mag = _attend(qq, kq, vq, start=delta, **kw)
    return rnd(out, h), mag


def _int8_thread(x: np.ndarray, warp: int, threads: int) -> np.ndarray:
    """SageAttention2's per-thread INT8 (triton/quant_per_thread.py): in each `warp` of rows, group t holds rows
    with (index mod 8) // (8 / threads) == t; scale amax / 127 + 1e-7, round half away from zero."""
    out = np.zeros_like(x)
    for w in range(0, x.shape[0], warp):
        for t in range(threads):
            rows = [r for r in range(w, min(w + warp, x.shape[0])) if (r % 8) // (8 // threads) == t]
            if not rows:
                continue
            blk = np.asarray(x[rows], np.float32)
            sc = np.float32(np.abs(blk).max() / np.float32(127.0) + np.float32(1e-7))
            qv = np.asarray(blk / sc, np.float32)
            out[rows] = np.trunc(qv + 0.5 * np.sign(qv)) * float(sc)
    return out


def sage2_oracle(q, k, v, gpu: str, causal: bool = False):
    """SageAttention2 as `sageattn` runs it on `gpu` (ada: WARPQ 32, WARPK 64, CTA_K 64, V amax at 2.25;
    hopper: WARPQ 16, WARPK 128, CTA_K 128, V amax at 448); K smoothed; P e4m3 at 2^8.807."""
    warp_q, warp_k, block_k, vmax = (32, 64, 64, 2.25) if gpu == "ada" else (16, 128, 128, 448.0)
    ks = k - k.mean(axis=0)
    qq, kq = _int8_thread(q, warp_q, 8), _int8_thread(ks, warp_k, 4)
    vs = np.where(np.abs(v).max(axis=0) > 0, np.abs(v).max(axis=0) / vmax, 1.0)
    vq = rnd(sat(v / vs, 448.0), E4M3) * vs
    unit = 2.0**8.807

    def quant_p(p):
        return rnd(sat(p * unit, 448.0), E4M3), unit

    out, mag = _attend(
        qq, kq, vq, block_k=block_k, reverse=False, causal=causal, quant_p=quant_p, scale=q.shape[1] ** -0.5
    )
    return rnd(out, np.float16), mag


def fa3_fp8_oracle(q, k, v, rot: np.ndarray, block_q: int, block_k: int, causal: bool = False):
    """FA3's FP8 path (preset fa3-fp8): Q, K rotated by `rot`, e4m3 with one scale (amax / 448) per block of
    block_q (Q) or block_k (K, V) rows, P = 2^8 exp(S - m) in e4m3 (hopper/softmax.h Max_offset 8), key blocks
    last to first, fp16 output."""

    def blocks(x, n):
        out = np.zeros_like(x)
        for b in range(0, x.shape[0], n):
            a = np.abs(x[b : b + n]).max()
            sc = a / 448.0 if a > 0 else 1.0
            out[b : b + n] = rnd(sat(x[b : b + n] / sc, 448.0), E4M3) * sc
        return out

    qq, kq, vq = blocks(q @ rot, block_q), blocks(k @ rot, block_k), blocks(v, block_k)

    def quant_p(p):
        return rnd(sat(p * 256.0, 448.0), E4M3), 256.0

    out, mag = _attend(
        qq, kq, vq, block_k=block_k, reverse=True, causal=causal, quant_p=quant_p, scale=q.shape[1] ** -0.5
    )
    return rnd(out, np.float16), mag
