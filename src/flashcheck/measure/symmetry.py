"""The broken dS symmetry of BF16 attention backward (arXiv 2609.34272), measured, and the knobs that act on it.

Each row of dS = P * (dP - delta) sums to zero exactly; rounded to bf16 before the dQ = s dS K product it
does not, and the row sum r_i times the mean key leaks into dQ_i. Inputs: q = sharpness * N(0, 1) (larger:
a sharper softmax), k = N(0, 1) + key_mean * u (u a random unit vector: key_mean is the norm of the mean
key), v and dO N(0, 1), all [B, H, L, D] and rounded to the policy's input format; gradients are compared
with the FP64 reference gradients of those rounded inputs (the kernel's own error).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from flashcheck.core.metrics import rel_l2
from flashcheck.core.numerics import DELTA_SOURCES, Policy, parse_policy, round_to
from flashcheck.kernels import flash_attention, reference_attention


@dataclass(frozen=True, slots=True)
class SymmetryPoint:
    """One (key_mean, sharpness, seed). `p_max`: mean over rows of max_j P_ij (1: one-hot); `row_sum`: mean
    |sum_j rnd(dS)_ij|; `row_sum_rel`: that over the mean row L1 norm of dS; `dq_err`/`dk_err`: relative L2
    error of flash's dQ/dK against FP64; `*_fixed`: the same with Policy.ds_correction."""

    key_mean: float
    sharpness: float
    seed: int
    p_max: float
    row_sum: float
    row_sum_rel: float
    dq_err: float
    dk_err: float
    dq_err_fixed: float
    dk_err_fixed: float

    @property
    def dq_reduction(self) -> float:
        """How many times smaller the dQ error is with the correction."""
        return self.dq_err / self.dq_err_fixed if self.dq_err_fixed > 0 else float("inf")

    def to_dict(self) -> dict[str, float]:
        return asdict(self) | {"dq_reduction": self.dq_reduction}


def symmetry_inputs(
    key_mean: float, sharpness: float, *, policy: Policy, batch: int = 1, heads: int = 2, seq_len: int = 256,
    head_dim: int = 64, seed: int = 0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """q, k, v, dO [B, H, L, D] float64 of the module docstring, rounded to policy.input (dO to grad_input)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    q = torch.randn(shape, generator=g, dtype=torch.float64) * sharpness
    u = torch.randn(head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(shape, generator=g, dtype=torch.float64) + key_mean * u / u.norm()
    v, do = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2))
    q, k, v = (round_to(t, policy.input) for t in (q, k, v))
    return q, k, v, round_to(do, policy.grad_input)


def ds_row_sums(q, k, v, do, policy: Policy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Closed form in FP64 of what the FA2 backward rounds: delta from O rounded to policy.output, dS rounded
    to policy.grad_p. Returns (row sums of rnd(dS) [B, H, Lq], row L1 norms of dS [B, H, Lq], P's row max)."""
    p = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    out = round_to(p @ v, policy.output)
    delta = (do * out).sum(dim=-1, keepdim=True)
    ds = round_to(p * (do @ v.transpose(-1, -2) - delta), policy.grad_p)
    return ds.sum(dim=-1), ds.abs().sum(dim=-1), p.amax(dim=-1)


def _grads(fn, q, k, v, do) -> list[torch.Tensor]:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do.to(out.dtype))  # dO is already in the input format: exact in fp32
    return [t.grad.double() for t in (q, k, v)]


def _flash(policy: Policy, block: int):
    return lambda q, k, v: flash_attention(q, k, v, policy=policy, block_q=block, block_k=block)


def measure_point(
    key_mean: float, sharpness: float, *, policy: Policy | str = "bf16-mixed", block: int = 64, seed: int = 0,
    **sizes: int,
) -> SymmetryPoint:  # fmt: skip
    """One point of the curve: row sums of rounded dS and flash's dQ/dK errors with and without the correction.
    `sizes`: batch, heads, seq_len, head_dim (symmetry_inputs)."""
    pol = parse_policy(policy)
    q, k, v, do = symmetry_inputs(key_mean, sharpness, policy=pol, seed=seed, **sizes)
    r, l1, pmax = ds_row_sums(q, k, v, do, pol)
    ref = _grads(reference_attention, q, k, v, do)
    plain = _grads(_flash(pol, block), q, k, v, do)
    fixed = _grads(_flash(pol.replace(ds_correction=True, name=f"{pol.name},ds_correction=1"), block), q, k, v, do)
    return SymmetryPoint(
        key_mean=float(key_mean),
        sharpness=float(sharpness),
        seed=seed,
        p_max=float(pmax.mean()),
        row_sum=float(r.abs().mean()),
        row_sum_rel=float(r.abs().mean() / l1.mean()),
        dq_err=rel_l2(plain[0], ref[0]),
        dk_err=rel_l2(plain[1], ref[1]),
        dq_err_fixed=rel_l2(fixed[0], ref[0]),
        dk_err_fixed=rel_l2(fixed[1], ref[1]),
    )


def mechanism_curve(
    key_means: list[float], sharpnesses: list[float], *, seeds: tuple[int, ...] = (0,), **options: object
) -> list[SymmetryPoint]:
    """measure_point over key_means x sharpnesses x seeds (options: policy, block, batch, heads, seq_len,
    head_dim)."""
    return [measure_point(m, s, seed=seed, **options) for m in key_means for s in sharpnesses for seed in seeds]


def delta_source_effect(
    key_mean: float, sharpness: float, *, policy: Policy | str = "bf16-mixed", block: int = 64, seed: int = 0,
    **sizes: int,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per Policy.delta_source (arXiv 2609.39813): dQ/dK relative errors and the dQ bias along the true
    gradient, <dQ - dQ_ref, dQ_ref> / |dQ_ref|^2 (negative: the gradient shrinks)."""
    pol = parse_policy(policy)
    q, k, v, do = symmetry_inputs(key_mean, sharpness, policy=pol, seed=seed, **sizes)
    ref = _grads(reference_attention, q, k, v, do)
    out = {}
    for source in DELTA_SOURCES:
        g = _grads(_flash(pol.replace(delta_source=source, delta_seed=seed), block), q, k, v, do)
        bias = float(((g[0] - ref[0]) * ref[0]).sum() / (ref[0] * ref[0]).sum())
        out[source] = {"dq_err": rel_l2(g[0], ref[0]), "dk_err": rel_l2(g[1], ref[1]), "dq_bias": bias}
    return out
