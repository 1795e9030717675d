"""arXiv 2606.06521's P-collapse measured in the kernel: the fraction of non-sink P values that the e4m3 cast of
P flushes to zero, for a key order and a static scale S, and the paper's closed form for it: at the paper's own
setting (4 sink tokens scored Delta + N(0, 1), the others N(0, 1): inputs "sink4:DELTA") and, per row's score
spread, at the study's ("sink:DELTA": one sink key at Delta, each row's other scores N(0, |q|^2 / D))."""

from __future__ import annotations

import math
import threading

import torch

from flashcheck.core.inputs import sink_delta, sink_tokens
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


def _max_density(k_sink: int) -> tuple[list[float], list[float], float]:
    """The density of the maximum of k_sink i.i.d. N(0, 1) on a grid over [-8, 8]: (points, density, step)."""
    xs = [-8.0 + 16.0 * i / 4000 for i in range(4001)]
    cdf = [0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) for x in xs]
    norm = 1.0 / math.sqrt(2 * math.pi)
    dens = [k_sink * f ** (k_sink - 1) * math.exp(-x * x / 2) * norm for x, f in zip(xs, cdf, strict=True)]
    return xs, dens, xs[1] - xs[0]


def expected_max(k_sink: int) -> float:
    """E[max of k_sink i.i.d. N(0, 1)] by quadrature: the paper's delta_k (1.029 for 4 sinks; 0 for one sink key
    scored Delta exactly, the study's "sink:DELTA")."""
    if k_sink == 1:
        return 0.0
    xs, dens, h = _max_density(k_sink)
    return sum(x * w for x, w in zip(xs, dens, strict=True)) * h


def closed_form_sinks(delta: float, k_sink: int = 4, p_scale: float = 1.0) -> tuple[float, float]:
    """At the paper's setting (k_sink sinks scored delta + N(0, 1), the other scores N(0, 1), forward order):
    (its leading-order form Phi(Delta + delta_k - 6.93 - ln S) with delta_k = E[max of k_sink normals], the
    expectation E[Phi(Delta + M - 6.93 - ln S)] over that maximum M), the second by quadrature."""
    xs, dens, h = _max_density(k_sink)
    expect = sum(closed_form(delta + x, p_scale) * w for x, w in zip(xs, dens, strict=True)) * h
    return closed_form(delta, p_scale, expected_max(k_sink)), expect


def paper_form(delta: float, k_sink: int, p_scale: float = 1.0) -> float:
    """2606.06521's closed form as it states it: Phi(Delta + delta_k - 6.93 - ln S), delta_k the expected maximum
    of the k_sink sinks' N(0, 1) score parts (0 for one sink key scored Delta exactly: the study's "sink:DELTA")."""
    return closed_form(delta, p_scale, expected_max(k_sink))


def refined_form(q: torch.Tensor, k: torch.Tensor, distribution: str, p_scale: float = 1.0) -> float:
    """The closed form refined for these inputs' own setting, where the paper's leading order misses: for
    "sink4:DELTA" E[Phi(Delta + M - 6.93 - ln S)] over the sinks' maximum M, times (Lk - 4) / (Lk - 1) (three of the
    four sinks count as non-sink P values and never flush); for "sink:DELTA" the mean over rows of their spreads
    (closed_form_rows). q [B, H, Lq, D], k [B, H, Lk, D]."""
    delta, n = sink_delta(distribution), sink_tokens(distribution)
    if delta is None:
        raise ValueError(f"distribution={distribution!r} is not a sink distribution (sink:DELTA or sink4:DELTA)")
    if n == 1:
        return closed_form_rows(q, delta, p_scale)
    lk = k.shape[-2]
    return closed_form_sinks(delta, n, p_scale)[1] * (lk - n) / (lk - 1)


def closed_form_rows(q: torch.Tensor, delta: float, p_scale: float = 1.0) -> float:
    """The closed form averaged over rows of unequal score spread: the mean of Phi((Delta - 6.93 - ln S) /
    sigma_r), sigma_r = |q_r without its sink coordinate| / sqrt(D), the spread of row r's non-sink scores under
    the study's "sink:DELTA" inputs (q [B, H, Lq, D], Q's coordinate 0 carrying the sink)."""
    sig = torch.linalg.vector_norm(q[..., 1:].double(), dim=-1) / q.shape[-1] ** 0.5
    x = (delta - E4M3_FLUSH - math.log(p_scale)) / sig
    return float((0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))).mean())
