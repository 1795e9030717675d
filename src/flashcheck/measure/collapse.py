"""arXiv 2606.06521's P-collapse measured in the kernel: the fraction of non-sink P values that the e4m3 cast of
P flushes to zero, for a key order and a static scale S (questions.modern checks it against the closed form)."""

from __future__ import annotations

import threading

from flashcheck.core.numerics import parse_policy
from flashcheck.kernels import flash_attention

# The P-cast setting of 2606.06521: only P in e4m3, every other stage fp32 (questions.modern.presets.P_FP8 runs it).
P_CAST = "input=fp32,score=fp32,stats=fp32,p=fp8-e4m3,accum=fp32,output=fp32,matmul=fp32"


def collapse_fraction(q, k, v, *, block_k: int = 128, p_scale: float = 1.0, order: str = "forward") -> float:
    """The fraction of non-sink P values (below the running max's 1) that the e4m3 cast flushes to zero in the
    P-cast kernel (P_FP8: only P in e4m3) with this key order and static scale. q [B, H, Lq, D], k, v [B, H, Lk, D]."""
    pol = parse_policy(P_CAST)
    pol = pol.replace(p_scale=p_scale) if p_scale != 1.0 else pol
    counts, lock = [0, 0], threading.Lock()

    def probe(p, pc):
        nonsink = (p < 1.0) & (p > 0)
        with lock:
            counts[0] += int((nonsink & (pc == 0)).sum())
            counts[1] += int(nonsink.sum())

    flash_attention(q, k, v, policy=pol, block_k=block_k, key_order=order, p_probe=probe)
    return counts[0] / max(counts[1], 1)
