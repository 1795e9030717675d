"""The shadow check's rounding allowance: how far a correct attention kernel's output may lie from the exact
one through rounding alone, so that the budget rule (k x the baseline's error + floor) cannot fail a correct
kernel merely because the baseline happened to be nearly exact.

Why. The peers' floor, 2 max|(r + 0.3 - 0.3) - r|, is about two ulps at 0.3. In fp32 a correct kernel's
error is several ulps (sdpa-math rounds q and k once more each, by sqrt(scale)), and on small outputs the
baseline's largest error is itself only a few ulps, so the ratio of two maxima of a few hundred rounding
errors decides: 0.4% of healthy sdpa-math checks at fp32 (1, 2, 16, 8) failed (issue 22).

The allowance, per output element (i, d), q [.., Lq, D], k, v [.., Lk, D], o the exact output, P the exact
softmax: to first order in the unit roundoff, the computed output's error is a sum sum_t c_t theta_t of the
roundings theta_t (|theta_t| <= u_w, independent, mean zero) times their coefficients c_t; Hoeffding's
inequality bounds it by lambda u_w sqrt(sum_t c_t^2) with probability >= 1 - 2 exp(-lambda^2 / 2) (Higham &
Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019). The
roundings and their coefficients:

  scores    s_ij = scale q_i . k_j: D products, D - 1 sums, the scale and SDPA math's two sqrt(scale)
            factors, each at most a_ij = |scale| sum_d |q_id| |k_jd|; o moves by p_ij (v_jd - o_id) ds_ij:
            (D + 3) p_ij^2 a_ij^2 (v_jd - o_id)^2
  softmax   exp, the division and P's storage, relative to p_ij: 3 p_ij^2 (v_jd - o_id)^2; the row sum's Lk
            additions (partial sums <= 1) scale the whole row: Lk o_id^2
  P V       Lk products p_ij v_jd and Lk additions of partial sums <= sum_j p_ij |v_jd|:
            sum_j p_ij^2 v_jd^2 + Lk (sum_j p_ij |v_jd|)^2
  output    stored in the served dtype: u_o |o_id|, added (round to nearest: no lambda)

u_w: the working format of every correct kernel (fp32 arithmetic for fp32, bf16 and fp16 inputs: the fused
kernels, SDPA math, the flash simulators; fp64 for fp64), u_o: the served dtype's. P and the sums are exact
in fp64 (memory as the fp64 reference's own scores). lambda comes from a union bound over the N elements
checked: 2 N exp(-lambda^2 / 2) <= ALPHA, so a correct kernel fails a check through rounding at most once in
1 / ALPHA checks.

A kernel that declares a lower working format (sdpa-math-lowp: scores, softmax and P V in bf16/fp16, as
plain PyTorch in that dtype) gets u_w of that format (guard.adapters.working_dtype): its check is then
about as lax as its arithmetic. A kernel that works in the low format without saying so (the mutant
accum-lowp) is judged by the fp32 allowance and k x plain PyTorch's error, as in the peers' tests.

What it costs in sensitivity: in bf16 and fp16 the fp32 terms are ~1e-5 of the output and the output term is
about the peers' floor, so the rule is as before; in fp32 it is some tens of ulps of the output, below any
real bug but for the least active cases of a few (benchmarks/bench_shadow.py measures both)."""

from __future__ import annotations

import math

import torch

ALPHA = 1e-5
"""Allowed chance, per check, that rounding alone exceeds the allowance (10x below the 1e-4 target)."""
SCORE_ROUNDINGS = 3  # the scale and SDPA math's two sqrt(scale) factors, besides the D products and sums
SOFTMAX_ROUNDINGS = 3  # exp, the division, rounding P to its storage format


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p of a floating-point dtype with p bits of significand (fp32 2^-24, bf16 2^-8, fp16 2^-11)."""
    return float(torch.finfo(dtype).eps) / 2


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The arithmetic format of a correct kernel for inputs of `dtype`: fp64 for fp64, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def confidence(elements: int, alpha: float = ALPHA) -> float:
    """lambda with 2 elements exp(-lambda^2 / 2) = alpha (at least 1)."""
    return max(1.0, math.sqrt(2.0 * math.log(2.0 * max(elements, 1) / alpha)))


def rounding_allowance(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    scale: float | None,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    working: torch.dtype | None = None,
) -> float:
    """The largest per-element allowance (see the module docstring) for an output of `dtype` against the exact
    `ref` [.., Lq, Dv] of q [.., Lq, D], k, v [.., Lk, D] (K/V with q's heads), with the call's causal flag
    (bottom-right aligned) and mask (bool, True = keep, or additive); `working`: the format the kernel computes
    in where it is not fp32 or better (sdpa-math-lowp: bf16/fp16); 0.0 for an empty output."""
    if ref.numel() == 0 or k.shape[-2] == 0:
        return 0.0
    q64, k64, v64, o = (t.detach().to(torch.float64) for t in (q, k, v, ref))
    d, lk = q64.shape[-1], k64.shape[-2]
    s = d**-0.5 if scale is None else float(scale)
    p = _probabilities(q64, k64, s, causal, mask)  # [.., Lq, Lk], 0 on rows with no key
    a = abs(s) * torch.matmul(q64.abs(), k64.abs().transpose(-1, -2))  # the score magnitudes a_ij
    o_abs = torch.nan_to_num(o.abs(), nan=0.0, posinf=0.0)
    p2 = p * p
    w = (d + SCORE_ROUNDINGS) * p2 * a * a + SOFTMAX_ROUNDINGS * p2  # per key, on (v_jd - o_id)^2
    var = _weighted_spread(w, v64, o_abs * o.sign())  # sum_j w_ij (v_jd - o_id)^2
    var = var + torch.matmul(p2, v64 * v64) + lk * (torch.matmul(p, v64.abs()) ** 2 + o_abs**2)
    lam, u_w, u_o = confidence(ref.numel()), unit_roundoff(working or working_dtype(dtype)), unit_roundoff(dtype)
    return float((lam * u_w * var.clamp(min=0.0).sqrt() + u_o * o_abs).max())


def _weighted_spread(w: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """sum_j w_ij (v_jd - o_id)^2 for w [.., Lq, Lk], v [.., Lk, Dv], o [.., Lq, Dv], without an Lq x Lk x Dv
    tensor: the square expanded into three products."""
    o = torch.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.matmul(w, v * v) - 2 * o * torch.matmul(w, v) + o * o * w.sum(-1, keepdim=True)


def _probabilities(q, k, scale: float, causal: bool, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(scale q k^T + mask) in fp64, causal bottom-right aligned; rows with no key left are 0."""
    scores = scale * torch.matmul(q, k.transpose(-1, -2))
    lq, lk = scores.shape[-2], scores.shape[-1]
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=scores.device).tril(diagonal=lk - lq)
        scores = scores.masked_fill(~keep, -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(scores)
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
