"""The two primitives every simulated kernel is written in: round to a stage, multiply at a precision."""

from __future__ import annotations

import functools
import math

import torch

from flashcheck.core.numerics import FP8_FORMATS, Format, Policy, info, round_to
from flashcheck.kernels.native.rounding import abs_stats as native_abs_stats
from flashcheck.kernels.native.rounding import round_ as native_round
from flashcheck.kernels.native.rounding import rounded as native_rounded
from flashcheck.kernels.sim.validation import check_scale

_NATIVE = (Format.BF16, Format.FP16)


def rnd(x: torch.Tensor, policy: Policy, stage: str) -> torch.Tensor:
    """x rounded to the format of `stage` under policy (a no-op when the stage is the working dtype)."""
    return round_to(x, policy.stage(stage))


def rnd_fresh(x: torch.Tensor, policy: Policy, stage: str) -> torch.Tensor:
    """rnd(x, policy, stage), the rounding to bf16 of a float32 CPU tensor in one C pass into a fresh tensor
    (kernels.native.rounding.rounded: the casts' very bits)."""
    if policy.stage(stage) == Format.BF16 and not (x.requires_grad and torch.is_grad_enabled()):
        out = native_rounded(x, torch.bfloat16)
        if out is not None:
            return out
    return rnd(x, policy, stage)


def rnd_(x: torch.Tensor, policy: Policy, stage: str, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """rnd in place: x holds its value rounded to the format of `stage` (and is returned). `scratch`, a flat
    buffer of that format's dtype with at least x.numel() elements, spares the cast's allocation."""
    fmt = policy.stage(stage)
    narrow = info(fmt).dtype
    if narrow == x.dtype:
        return x
    if fmt in _NATIVE and native_round(x, narrow):  # one pass in place, the casts' very bits (kernels.native.rounding)
        return x
    if scratch is not None and x.dtype == torch.float32 and fmt not in FP8_FORMATS:
        narrow = scratch[: x.numel()].view(x.shape)
        return x.copy_(narrow.copy_(x))  # the same two casts as round_to
    return x.copy_(round_to(x, fmt))


def cast_scratch(n: int, dtype: torch.dtype, policy: Policy, stage: str, device: torch.device) -> torch.Tensor:
    """A flat buffer for rnd_'s cast of up to n elements of `dtype` to `stage`'s format: n elements of that
    format's dtype, or none when the stage is `dtype` itself (rnd_ then never casts)."""
    narrow = info(policy.stage(stage)).dtype
    return torch.empty(n if narrow != dtype else 0, dtype=narrow, device=device)


def mm(a: torch.Tensor, b: torch.Tensor, policy: Policy, out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b formed and summed in policy.matmul precision, returned in a's dtype (written into `out`, of
    the product's shape, when given).

    Operands are already rounded to their stages, so an fp32 product of bf16/fp16/fp8 values is exact
    and only the sum rounds, as on tensor cores with an fp32 accumulator."""
    if policy.matmul == Format.FP32 and a.dtype == torch.float64:
        prod = torch.matmul(a.to(torch.float32), b.to(torch.float32)).to(torch.float64)
        return prod if out is None else out.copy_(prod)
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """m with -inf replaced by 0, so exp(x - m) of a fully masked row is exp(-inf) = 0, never NaN."""
    return torch.where(torch.isneginf(m), 0.0, m)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) for None, else `scale` (a finite real, see kernels.sim.validation)."""
    checked = check_scale(scale)
    return head_dim**-0.5 if checked is None else checked


def prescale_is_exact(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """True when (scale * q) @ k^T equals scale * (q @ k^T) bit for bit in float32 and wider: `scale` is a
    power of two and no partial sum of either product can be subnormal or overflow.

    Every nonzero product q_i k_i, and so every nonzero partial sum, is a multiple of
    ulp(min |q|) * ulp(min |k|) (float32 ulps, 24-bit significands): when that quantum times min(scale, 1) is
    a normal float32, every scaled operand keeps its 24 bits, and D * max|q| * max|k| * max(scale, 1) is below
    float32's overflow threshold, scaling an operand by 2^e scales every rounded step by 2^e exactly. NaN or
    inf inputs, or operands narrower than float32: False. float32's limits are stricter than float64's, so the
    answer holds for products summed in either."""
    mant, _ = math.frexp(scale) if math.isfinite(scale) and scale > 0 else (0.0, 0)
    wide = (torch.float32, torch.float64)
    if mant != 0.5 or q.numel() == 0 or k.numel() == 0 or q.dtype not in wide or k.dtype not in wide:
        return False
    stats = [native_abs_stats(t.detach()) for t in (q, k)]  # one C pass each where it applies
    if stats[0] is None or stats[1] is None:
        qa, ka = q.detach().abs(), k.detach().abs()
        (q_lo, q_hi), (k_lo, k_hi) = (tuple(float(x) for x in torch.aminmax(a)) for a in (qa, ka))
        stats = [(q_lo, q_hi, None), (k_lo, k_hi, None)]
    (q_lo, q_hi, q_nz), (k_lo, k_hi, k_nz) = stats
    big = q_hi * k_hi * q.shape[-1] * max(scale, 1.0)
    if not math.isfinite(big) or big >= 2.0**126:
        return False
    tiny = [lo if lo > 0 else (nz if nz is not None else _least_nonzero(t.detach().abs())) for lo, nz, t in
            ((q_lo, q_nz, q), (k_lo, k_nz, k))]  # fmt: skip
    if not all(math.isfinite(t) for t in tiny):
        return True  # one operand is all zeros: every product is 0 either way
    quantum = math.prod(2.0 ** (math.frexp(t)[1] - 1 - 23) for t in tiny) * min(scale, 1.0)
    return quantum >= 2.0**-126 and min(tiny) * min(scale, 1.0) >= 2.0**-102  # scaled operands stay normal


def scores_are_finite(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """True when every partial sum of q @ k^T (float32 or wider) and its product with `scale` are finite, so the
    scores are NaN-free: finite inputs and D * max|q| * max|k| * max(scale, 1) below 2^126 (a bound on every
    partial sum, with room for its roundings)."""
    if q.numel() == 0 or k.numel() == 0:
        return True
    his = []
    for t in (q.detach(), k.detach()):
        stats = native_abs_stats(t)  # one C pass where it applies (max |t|: NaN where t has a NaN)
        his.append(stats[1] if stats is not None else float(t.abs().amax()))
    big = his[0] * his[1] * q.shape[-1] * max(scale, 1.0)
    return math.isfinite(big) and big < 2.0**126


def _least_nonzero(a: torch.Tensor) -> float:
    """The least nonzero entry of a (inf when every entry is zero)."""
    return float(torch.where(a == 0, torch.full_like(a, math.inf), a).amin())


@functools.cache
def settle_exp() -> None:
    """One throwaway exp per process, float64 and float32, on every intra-op thread. Measured with torch
    2.13's CPU build here: the first exp of a process that runs after a BLAS call is, in about one process of
    four, inaccurate on one of the two OpenMP threads (float64: relative errors up to 3.3e-9 on half the heads
    of the FP64 reference's output); every later call is exact. The kernels call this before their first exp."""
    w = torch.zeros(1 << 18, dtype=torch.float64)
    w.exp_()
    w.float().exp_()
