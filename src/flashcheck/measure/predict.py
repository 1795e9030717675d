"""An error model that predicts a simulated kernel's error without running it.

The quantity: the relative L2 error of the output against the FP64 reference of the kernel's own rounded
inputs (a study record's errors_rounded["rel_l2"]). The model: each stage's rounding adds an independent
error of relative variance u^2 (u = 2^-precision, the unit roundoff of the stage's format) times that
stage's sensitivity, so

    rel_l2^2 = sum_s c_s * u_s^2 * g_s

with g_output = f_out (the share of sum |o|^2 outside one-hot rows, when V is exact in the output format; else
1); g_score = f_score and g_p = f_p (twice for standard, which rounds e and then P;
measure.inputstats: how much a relative rounding of the scores, or of P, moves the output); g_accum = n,
the roundings per row of the accumulator and of the running sum l (one term: every policy gives them one
format), once per tile (n = ceil(visible keys / Bc) for flash, per chunk for splitkv, 1 for standard);
g_accum_bias = n^2, the part that does not average out (a late tile's small update lost against a large
accumulator: error linear in n); g_merge = S + 1 for splitkv (S partial outputs and the combine);
g_matmul = D f_score + K f_p (products summed over D, and over K = Bc or every visible key). The score and P
terms count roundings: the standard kernel rounds P twice (exp, then the normalised P), flash once.

Real backends are predicted through an equivalent setting derived from what their kernel rounds where
(backend_equivalent; no constant of their own): SDPA math upcasts bf16/fp16 to fp32 and rounds the output
only; SDPA's CPU flash kernel keeps scores, statistics and the accumulator in fp32, rounds P~ to the input
dtype before P·V in key blocks of 512, and rounds the output; eager PyTorch rounds each op's result. Independent
roundings of relative size u have variance u^2/3, so the derivation predicts c_s near 1/3; the coefficients
below are fitted (non-negative least squares on relative residuals) on the training set named in TRAINING,
and every report shows prediction / measured on other cases.

Range terms (derived, coefficient 1, not fitted), for what leaves the formats' normal range or their
accumulators' width: P cast to fp8/fp4 (inputstats.narrow_p; flash and standard) replaces f_p by f_p_range
(inputstats.range_stats: from the scores alone, each P~ = exp(s - m) against the running max of the key
blocks in the kernel's order, times p_scale; the values that land on the format's top, P~ = 1 at the running
max or an NVFP4 tile's max, are exact; subnormal values weigh 4 per binade below the normal range) and adds
`flush`, the squared relative error of the probability mass that underflows (P~ S below half the smallest
subnormal: the collapsed fraction of arXiv 2606.06521, Phi(Delta + delta_k - 6.93 - ln S) with a sink, in
forward KV order); `acc_trunc` is the narrow P·V accumulator's (accumulator_term: with a tensor-core model,
pv_mma, the term measure.mma_error derives from the products' magnitudes; else FP22 truncation, fp16 round to
nearest, the adds between promotions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from flashcheck.core.numerics import Format, Policy, info, parse_format, parse_policy

TERMS = ("output", "score", "p", "accum", "accum_bias", "merge", "matmul")
DERIVED = ("flush", "acc_trunc")  # range terms with their constants derived, not fitted (coefficient 1)
KERNELS = ("flash", "standard", "splitkv")
BACKENDS = ("sdpa-math", "sdpa-math-lowp", "sdpa-flash", "eager")  # CPU kernels with an equivalent setting
# Fitted by fit_coefficients (questions.variants.errormodel.refit) on TRAINING; 1/3 for `merge`, which no quick case can
# identify (its format is fp32 in every quick policy). Derivation for `output` alone: relative rounding of
# an element with a log-uniform significand gives u^2 ln2 / 4.5 = 0.154 u^2; the fit gives 0.18.
COEFFS: dict[str, float] = {
    "output": 0.177,
    "score": 0.1518,
    "p": 0.139,
    "accum": 0.1043,
    "accum_bias": 0.0007941,
    "merge": 1.0 / 3.0,
    "matmul": 0.02481,
}
TRAINING_SEEDS = (0,)  # the seeds whose simulated cases (outside fp8: in_domain) the coefficients are fitted on
TRAINING = (
    "fitted on the simulated cases of seed 0 without fp8 stages of `flashcheck study` (preset quick, flashcheck "
    "2026-12-03); held out: the other seeds, every real backend (derived equivalents) and every fp8 case. A "
    "study's report checks it on its own held-out cases (section error_model: their count and the share within "
    "2x, target 90%; how many there are depends on the backends the machine runs)"
)
# Input statistics of the built-in distributions (measure.inputstats on N(0,1)-scaled draws, L=1024, D=64,
# seeds 0-2), used when the inputs are not drawn: f_score, f_p.
DEFAULT_STATS = {
    "normal": (5.0, 1.0),
    "uniform": (0.13, 0.85),
    "outliers": (11.0, 0.2),
    "sharp": (86.0, 0.12),
    "tied": (490.0, 0.82),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """What the model needs about one case: kernel (flash, standard, splitkv), policy, the mean number of
    keys a query row sees (`visible`), head_dim, block_k (Bc), splits (splitkv's S), and the input
    statistics f_score, f_p and f_out (measure.inputstats; f_out the share of sum |o|^2 outside one-hot rows,
    whose output is one V row, not rounded when the output format holds V: exact_rows); f_acc (policies with a
    P·V tensor-core model, pv_mma: the MMA chain's relative squared error, measure.mma_error); score_roundings,
    p_roundings: how often the scores and P are rounded to their stage's format (0: the kernel's own count, 1
    for scores, 2 for standard's P, else 1)."""

    kernel: str
    policy: Policy
    visible: float
    head_dim: int
    block_k: int = 128
    splits: int = 4
    f_score: float = 5.0
    f_p: float = 1.0
    score_roundings: int = 0
    p_roundings: int = 0
    f_p_range: float | None = None
    f_flush: float = 0.0
    f_out: float = 1.0
    f_acc: float | None = None

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel={self.kernel!r}; the error model covers {', '.join(KERNELS)}")
        for name in ("visible", "head_dim", "block_k", "splits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 1:
                raise ValueError(f"{name}={v!r} must be a number >= 1")
        for name in ("score_roundings", "p_roundings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be an integer >= 0 (0: the kernel's own count)")
        if not (isinstance(self.f_out, int | float) and 0.0 <= self.f_out <= 1.0):
            raise ValueError(f"f_out={self.f_out!r} must be a number in [0, 1]")
        opt = tuple(n for n in ("f_p_range", "f_acc") if getattr(self, n) is not None)
        for name in ("f_score", "f_p", "f_flush", *opt):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}={v!r} must be a finite number >= 0")
        if self.policy.hadamard and not (int(self.head_dim) == self.head_dim and _is_power_of_two(self.head_dim)):
            raise ValueError(
                f"head_dim={self.head_dim!r} is not allowed with policy {self.policy.name!r}: its Hadamard incoherent "
                "processing needs a power-of-two head dim (e.g. 64, 128)"
            )


def in_domain(policy: Policy) -> bool:
    """The model's assumption: every value stays in its format's normal range. Policies with an fp8 stage
    break it (P in e4m3 flushes below 2^-9 to zero), so their cases are not fitted on (they are evaluated)."""
    return not any(info(f).precision < 5 for f in policy.formats().values())


def unit_roundoff(policy: Policy, stage: str) -> float:
    """2^-precision of the stage's format (merge falls back to accum)."""
    fmt = policy.stage(stage) or policy.accum
    return 2.0 ** -info(fmt).precision


def tiles(s: Setting) -> int:
    """Accumulator roundings per row: key tiles a row visits (per chunk for splitkv), 1 for standard."""
    if s.kernel == "standard":
        return 1
    keys = s.visible / s.splits if s.kernel == "splitkv" else s.visible
    return max(1, math.ceil(keys / s.block_k))


def features(s: Setting) -> dict[str, float]:
    """u_s^2 * g_s for each stage s in TERMS (see the module docstring)."""
    pol = s.policy

    def u2(stage: str) -> float:
        return unit_roundoff(pol, stage) ** 2

    n = tiles(s)
    k = s.visible if s.kernel == "standard" else min(s.block_k, s.visible)
    p_count = s.p_roundings or (2 if s.kernel == "standard" else 1)
    ranged = s.f_p_range is not None and s.kernel in ("flash", "standard")  # f_p_range counts every cast
    return {
        "output": u2("output") * (s.f_out if exact_rows(pol) else 1.0),
        "score": u2("score") * s.f_score * (s.score_roundings or 1),
        "p": u2("p") * (s.f_p_range if ranged else s.f_p * p_count),
        "accum": (u2("accum") + u2("stats")) * n,
        "accum_bias": u2("accum") * n * n,
        "merge": u2("merge") * (s.splits + 1) if s.kernel == "splitkv" else 0.0,
        "matmul": u2("matmul") * (s.head_dim * s.f_score + k * s.f_p),
        "flush": s.f_flush if ranged else 0.0,
        "acc_trunc": accumulator_term(s),
    }


def exact_rows(policy: Policy) -> bool:
    """True when a one-hot row's output (one V row, P = 1) is exact: V is held unscaled in a format that the
    accumulator and the output format hold exactly (16-bit or wider inputs, no V quantisation, an output
    format at least as precise). Quantised V (fp8, fp4, int scales) is not representable in the output."""
    if policy.v_format is not None or policy.v_scaling or policy.input not in (Format.BF16, Format.FP16, Format.FP32,
                                                                              Format.FP64):  # fmt: skip
        return False
    out = info(policy.output).precision
    return info(policy.input).precision <= min(out, info(policy.accum).precision) and (
        policy.input == policy.output or policy.output in (Format.FP32, Format.FP64)
    )


MMA_K = 32  # keys one MMA instruction sums before its result is added to the accumulator (kernels.formats.fastmath)


def accumulator_term(s: Setting) -> float:
    """The squared relative error a narrow P·V accumulator (policy acc_bits, acc_promote, acc_nearest; the
    flash kernel) adds. Each of the k adds between promotions rounds the running sum S_i to acc_bits bits:
    relative to S_i, truncation (FP22) loses u * U / m (u = 2^-acc_bits, U uniform [0, 1), m the
    significand, log-uniform on [1, 2)): mean mu = 1 / (4 ln 2), second moment 1 / (8 ln 2); round to
    nearest (fp16) has mean 0 and second moment 1 / (32 ln 2). With the partial sums a random walk (S_i of
    variance i/k of the block's sum S_k), the truncation means add up coherently, sum_i S_i of variance
    (k+1)(2k+1)/6 |S_k|^2, the fluctuations in quadrature, sum_i |S_i|^2 = (k+1)/2 |S_k|^2:
        rel^2 = u^2 [mu^2 (k+1)(2k+1)/6 + sigma^2 (k+1)/2],
    the same for every promoted block (each block's error relative to its own sum, blocks independent).
    k = acc_promote / MMA_K, or every add of the row (visible / MMA_K) when the MMA accumulates into O.
    A policy with a P·V tensor-core model (pv_mma) takes that model's derived term f_acc instead (measure.mma_error:
    block FMAs aligned to the block's largest exponent, sign-symmetric term truncation), when the setting has it;
    without it (a record of an older study) the FP22 formula above stands in."""
    pol = s.policy
    if pol.accum == Format.FP64 or s.kernel != "flash":
        return 0.0
    if pol.pv_mma and s.f_acc is not None:
        return s.f_acc
    if not pol.acc_bits:
        return 0.0
    u2 = 4.0**-pol.acc_bits
    if pol.acc_promote:
        k = math.ceil(pol.acc_promote / MMA_K)
    else:
        k = tiles(s) * math.ceil(min(s.block_k, s.visible) / MMA_K)
    ln2 = math.log(2.0)
    if pol.acc_nearest:
        mu2, var = 0.0, 1 / (32 * ln2)
    else:
        mu2 = (1 / (4 * ln2)) ** 2
        var = 1 / (8 * ln2) - mu2
    return u2 * (mu2 * (k + 1) * (2 * k + 1) / 6 + var * (k + 1) / 2)


def predict(s: Setting, coeffs: dict[str, float] | None = None) -> float:
    """The predicted relative L2 error of the kernel's output (against FP64 of its rounded inputs)."""
    c = COEFFS if coeffs is None else coeffs
    f = features(s)
    return math.sqrt(sum(c[t] * f[t] for t in TERMS) + sum(f[t] for t in DERIVED))


def contributions(s: Setting, coeffs: dict[str, float] | None = None) -> dict[str, float]:
    """Each stage's share of the predicted squared error (sums to 1)."""
    c = COEFFS if coeffs is None else coeffs
    f = features(s)
    part = {t: c[t] * f[t] for t in TERMS} | {t: f[t] for t in DERIVED}
    total = sum(part.values()) or 1.0
    return {t: x / total for t, x in part.items()}


def fit_coefficients(settings: Sequence[Setting], measured: Sequence[float]) -> dict[str, float]:
    """Non-negative coefficients minimising sum ((prediction^2 - measured^2) / measured^2)^2 (relative
    residuals of the squared error). Needs scipy; ValueError with fewer cases than terms."""
    from scipy.optimize import nnls

    rows = [(features(s), m) for s, m in zip(settings, measured, strict=True) if m > 0 and math.isfinite(m)]
    if len(rows) < len(TERMS):
        raise ValueError(f"{len(rows)} usable cases; at least {len(TERMS)} are needed to fit {len(TERMS)} terms")
    # a term that cannot reach 0.1% of any case's squared error at a coefficient of 1 is not identifiable
    # from these cases: it keeps the derivation's 1/3 instead of soaking up noise
    used = [t for t in TERMS if any(f[t] > 1e-3 * m**2 for f, m in rows)]
    a = [[f[t] / m**2 for t in used] for f, m in rows]
    # the derived range terms are known: the fitted terms explain what they leave
    b = [1.0 - sum(f[t] for t in DERIVED) / m**2 for f, m in rows]
    x, _ = nnls(_matrix(a), _vector(b))
    return {t: (float(x[used.index(t)]) if t in used else 1.0 / 3.0) for t in TERMS}


def _matrix(rows: list[list[float]]):
    import numpy as np

    return np.asarray(rows, dtype=np.float64)


def _vector(xs: list[float]):
    import numpy as np

    return np.asarray(xs, dtype=np.float64)


def parse_setting(kernel: str, policy: str | Policy, **kwargs) -> Setting:
    """A Setting from a kernel name and a policy string (ValueError names bad values)."""
    return Setting(kernel=kernel, policy=parse_policy(policy), **kwargs)


def _is_power_of_two(x: float) -> bool:
    return math.frexp(x)[0] == 0.5


def backend_equivalent(backend: str, fmt: str, head_dim: int, device: str = "cpu") -> dict:
    """The simulated kernel, policy and rounding counts that round where `backend` at dtype `fmt` rounds
    (keyword arguments of Setting). Derived from the kernels' source, not fitted:
    sdpa-math: bf16/fp16 upcast to fp32 inside (allow_fp16_bf16_reduction_math_sdp off), output cast back;
    sdpa-math-lowp: q and k scaled by sqrt(scale) in fmt (two more score-sized roundings unless that factor is
    a power of two), scores, softmax and P·V each rounded once to fmt, products summed in fp32;
    sdpa-flash on the CPU (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): scores, max, sum and the
    accumulator in fp32, P~ rounded to fmt before P·V, key blocks of 512, output rounded; on CUDA
    FlashAttention-2 (blocks of 128, 64 above head dim 64); eager: scores rounded (again after the scale
    unless it is a power of two), softmax in fp32 rounded once, P·V rounded once."""
    f = parse_format(fmt)
    wide = Format.FP64 if f == Format.FP64 else Format.FP32
    keep = Policy(name=f"{backend}:{f.value}", input=f, score=wide, stats=wide, p=wide, accum=wide, output=f,
                  matmul=wide)  # fmt: skip
    low = keep.replace(score=f, p=f, name=keep.name)
    scale = head_dim**-0.5
    if backend == "sdpa-math":
        return {"kernel": "standard", "policy": keep, "p_roundings": 1}
    if backend == "sdpa-math-lowp":
        return {"kernel": "standard", "policy": low, "p_roundings": 1,
                "score_roundings": 1 if _is_power_of_two(scale**0.5) else 3}  # fmt: skip
    if backend == "eager":
        return {"kernel": "standard", "policy": low, "p_roundings": 1,
                "score_roundings": 1 if _is_power_of_two(scale) else 2}  # fmt: skip
    if backend == "sdpa-flash":
        block = 512 if device == "cpu" else (128 if head_dim <= 64 else 64)
        return {"kernel": "flash", "policy": keep.replace(p=f, name=keep.name), "block_k": block}
    raise ValueError(
        f"backend {backend!r} has no equivalent setting; the error model covers the kernels "
        f"{', '.join(KERNELS)} and the backends {', '.join(BACKENDS)}"
    )


def setting_for(kernel: str, numerics: str | Policy, *, head_dim: int, device: str = "cpu", **kwargs) -> Setting:
    """A Setting for a simulated kernel under a policy, or for a real backend at a dtype (its equivalent)."""
    if kernel in KERNELS:
        return Setting(kernel=kernel, policy=parse_policy(numerics), head_dim=head_dim, **kwargs)
    dtypes = ("bf16", "fp16", "fp32", "fp64")
    if isinstance(numerics, Policy) or str(numerics).strip().lower() not in dtypes:
        got = numerics.name if isinstance(numerics, Policy) else numerics
        raise ValueError(f"backend {kernel!r} takes a dtype ({', '.join(dtypes)}) as its numerics, not {got!r}")
    eq = backend_equivalent(kernel, numerics, head_dim, device)
    return Setting(head_dim=head_dim, **(kwargs | eq))
