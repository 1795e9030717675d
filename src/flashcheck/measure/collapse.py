"""arXiv 2606.06521's P-collapse measured in the kernel: the fraction of non-sink P values that the e4m3 cast of
P flushes to zero, for a key order and a static scale S, and the paper's closed form for it: at the paper's own
setting (4 sink tokens scored Delta + N(0, 1), the others N(0, 1): inputs "sink4:DELTA") and, per row's score
spread, at the study's ("sink:DELTA": one sink key at Delta, each row's other scores N(0, |q|^2 / D))."""

from __future__ import annotations

import math
import threading

import torch

from flashcheck.core.numerics import parse_policy
from flashcheck.kernels import flash_attention

# e4m3 flushes what falls below 2^-10 (half its smallest subnormal): P = S exp(z - Delta) collapses for
# z < Delta + delta_k - 10 ln 2 - ln S
E4M3_FLUSH = 10 * math.log(2)  # 6.93

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


def closed_form(delta: float, p_scale: float = 1.0, delta_k: float = 0.0, sigma: float = 1.0) -> float:
    """2606.06521's collapsed fraction Phi((Delta + delta_k - 6.93 - ln S) / sigma) of non-sink P values whose
    scores are N(0, sigma^2) (the paper: sigma = 1)."""
    x = (delta + delta_k - E4M3_FLUSH - math.log(p_scale)) / sigma
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def closed_form_sinks(delta: float, k_sink: int = 4, p_scale: float = 1.0) -> tuple[float, float]:
    """At the paper's setting (k_sink sinks scored delta + N(0, 1), the other scores N(0, 1), forward order):
    (its leading-order form Phi(Delta + delta_k - 6.93 - ln S) with delta_k = E[max of k_sink normals], the
    expectation E[Phi(Delta + M - 6.93 - ln S)] over that maximum M), the second by quadrature."""
    xs = [-8.0 + 16.0 * i / 4000 for i in range(4001)]
    phi = [0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) for x in xs]
    dens = [
        k_sink * f ** (k_sink - 1) * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) for x, f in zip(xs, phi, strict=True)
    ]
    h = xs[1] - xs[0]
    mean_max = sum(x * w for x, w in zip(xs, dens, strict=True)) * h
    expect = sum(closed_form(delta + x, p_scale) * w for x, w in zip(xs, dens, strict=True)) * h
    return closed_form(delta, p_scale, mean_max), expect


def closed_form_rows(q: torch.Tensor, delta: float, p_scale: float = 1.0) -> float:
    """The closed form averaged over rows of unequal score spread: the mean of Phi((Delta - 6.93 - ln S) /
    sigma_r), sigma_r = |q_r without its sink coordinate| / sqrt(D), the spread of row r's non-sink scores under
    the study's "sink:DELTA" inputs (q [B, H, Lq, D], Q's coordinate 0 carrying the sink)."""
    sig = torch.linalg.vector_norm(q[..., 1:].double(), dim=-1) / q.shape[-1] ** 0.5
    x = (delta - E4M3_FLUSH - math.log(p_scale)) / sig
    return float((0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))).mean())
