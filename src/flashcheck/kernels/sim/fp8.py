"""Input quantisation of FlashAttention-3's FP8 path: per-tensor or per-block scales, Hadamard rotation."""

from __future__ import annotations

import torch

from flashcheck.core.numerics import FP8_FORMATS, Format, Policy, amax_scale, info, round_to
from flashcheck.kernels.formats.hadamard import hadamard_matrix as hadamard_matrix  # re-exported: part of this API
from flashcheck.kernels.formats.hadamard import incoherence_matrix
from flashcheck.kernels.native.fp8 import amax_scale as tensor_scale
from flashcheck.kernels.native.fp8 import block_amax, hadamard, scaled
from flashcheck.kernels.sim.ops import rnd_fresh
from flashcheck.kernels.sim.quantized import quantize_inputs, uses_quantized_inputs


def quantize_blocks(x: torch.Tensor, fmt: Format, block: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Round x [B, H, L, D] to fmt with one scale per block of `block` rows x D (ragged last block). dtype
    float32: the float64 result rounded to float32, x float64 or float32 (taken as its float64 values)."""
    b, h, n, d = x.shape
    block = max(1, min(block, n))  # a block longer than x is one block: same scale, no giant zero padding
    if x.is_contiguous() and x.numel():  # the same values without padding x: per-block amax by views, per-row scales
        amax = block_amax(x.detach(), block).to(torch.float64)  # a float32 maximum is exact in float64
        amax = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
        scale = torch.where(amax > 0, amax / info(fmt).max, torch.ones_like(amax))  # numerics.amax_scale's steps
        return scaled(x, fmt, scale.expand(b, h, -1, block, 1).reshape(b, h, -1, 1)[:, :, :n], dtype)
    if dtype is not None:
        return quantize_blocks(x.to(torch.float64), fmt, block).to(dtype)
    pad = (-n) % block
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    xb = xp.reshape(b, h, -1, block, d)
    out = scaled(xb, fmt, amax_scale(xb, fmt, dims=(-2, -1)))
    return out.reshape(b, h, -1, d)[:, :, :n]


def round_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    policy: Policy,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    hadamard_seed: int = 0,
    parts: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q, K, V as the kernel holds them (policy.input, in the working dtype), and the rotation used.

    FP8 inputs are scaled per tensor, or per block of block_q (Q) / block_k (K, V) rows when
    policy.fp8_scaling == "block"; quantized-attention policies (fp6/fp4/int inputs, or the input knobs
    qk_scaling, v_format, ...) take kernels.sim.quantized's path. With policy.hadamard, Q and K are rotated by M first
    (see
    incoherence_matrix); the returned M [D, D] (else None) maps gradients back: dQ = dQ' M^T. policy.exact_inputs
    keeps Q and K ("qk": rotated, not smoothed or rounded) or V ("v") exact, the others rounded as without it.
    parts (a dict): filled with the NVFP4 pieces of the rounded inputs (kernels.sim.quantized.quantize_inputs) that
    are NVFP4 values, by role "q", "k", "v"."""
    if _plain_float32(q, k, v, policy):  # no float64 round trip (float32 -> float64 -> float32 is exact)
        return *(_fresh(rnd_fresh(t, policy, "input"), t) for t in (q, k, v)), None
    rot = None
    if _fp8_float32(q, k, v, policy):  # FP8 in float32: float32 in and out of the C passes, the same values
        if policy.hadamard:
            rot = incoherence_matrix(q.shape[-1], hadamard_seed).to(q.device)
            q, k = (_rotated(t, rot) for t in (q, k))
        return *_fp8_rounded(q, k, v, policy, block_q, block_k, torch.float32), rot
    if _fp4_float32(q, k, v, policy):  # NVFP4 or SageAttention3 from float32: float32 in and out, no float64 trip
        blocks = {"block_q": block_q or 128, "block_k": block_k or 64}
        return *quantize_inputs(q, k, v, policy, **blocks, parts=parts, float32=True), None
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    if policy.hadamard:
        rot = incoherence_matrix(q.shape[-1], hadamard_seed).to(q.device)
        q, k = q @ rot, k @ rot
    qr, kr, vr = _rounded(q, k, v, policy, block_q, block_k, parts)
    if policy.exact_inputs == "qk":  # explain's input sub-stages: these stay exact (work_dtype is then float64)
        qr, kr = q, k
    elif policy.exact_inputs == "v":
        vr = v
    if parts is not None:  # no pieces for an input kept exact
        for role in {"qk": ("q", "k"), "v": ("v",)}.get(policy.exact_inputs, ()):
            parts.pop(role, None)
    return qr, kr, vr, rot


def casts_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Policy) -> bool:
    """True when round_inputs only casts each element of float32 q, k, v (so rounding grouped K / V heads and then
    repeating them gives the repeated heads' rounding)."""
    return _plain_float32(q, k, v, policy)


def _plain_float32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Policy) -> bool:
    """float32 inputs that the policy only casts (to a float format of at most float32's width, in float32)."""
    plain = policy.work_dtype == torch.float32 and not policy.hadamard and not policy.exact_inputs
    plain = plain and policy.input in _CASTS and not uses_quantized_inputs(policy)
    return plain and all(t.dtype == torch.float32 for t in (q, k, v))


_CASTS = (Format.FP32, Format.BF16, Format.FP16)


def _rotated(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x (float32) @ rot in float64: butterflies where every row's sum is exact (fp8_native.hadamard), else the
    float64 product; the same bits."""
    fast = hadamard(x, rot)
    return x.to(torch.float64) @ rot if fast is None else fast


def _fp8_float32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Policy) -> bool:
    """float32 inputs that the policy scales to FP8 (per tensor or per block) in float32 work."""
    fp8 = policy.work_dtype == torch.float32 and not policy.exact_inputs and policy.input in FP8_FORMATS
    fp8 = fp8 and not uses_quantized_inputs(policy)
    return fp8 and all(t.dtype == torch.float32 for t in (q, k, v))


def _fp4_float32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Policy) -> bool:
    """float32 inputs, in float32 work, that the policy quantises to NVFP4 (Q, K and V, no smoothing) or as
    SageAttention3 does: the quantisers' first step takes them to float32 (kernels.sim.quantized,
    core.quant.nvfp4_parts, kernels.formats.sage3.sage3_inputs), so from float32 or from their exact float64 copies they
    compute the same values, which _rounded would return in float32 (every one exact in float32)."""
    plain = policy.work_dtype == torch.float32 and not policy.hadamard and not policy.exact_inputs
    nvfp4 = policy.qk_scaling == policy.v_scaling == "nvfp4" and not (policy.smooth_q or policy.smooth_k)
    plain = plain and (nvfp4 or policy.qk_scaling == "sage3")
    return plain and policy.input != Format.FP64 and all(t.dtype == torch.float32 for t in (q, k, v))


def _fresh(rounded: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """rounded, never the caller's own tensor (round_to returns its input when the stage is its dtype)."""
    return rounded.clone() if rounded is source else rounded


def _rounded(q, k, v, policy: Policy, block_q: int | None, block_k: int | None, parts: dict | None = None):
    """Q, K, V [B, H, L, D] (float64, rotated) rounded to policy.input as round_inputs describes, in work_dtype."""
    work = policy.work_dtype
    fmt = policy.input
    if uses_quantized_inputs(policy):
        qq, kq, vq = quantize_inputs(q, k, v, policy, block_q=block_q or 128, block_k=block_k or 64, parts=parts)
        return qq.to(work), kq.to(work), vq.to(work)
    if fmt not in FP8_FORMATS:
        return round_to(q.to(work), fmt), round_to(k.to(work), fmt), round_to(v.to(work), fmt)
    out = _fp8_rounded(q, k, v, policy, block_q, block_k)
    return out[0].to(work), out[1].to(work), out[2].to(work)


def _fp8_rounded(q, k, v, policy: Policy, block_q: int | None, block_k: int | None, dtype: torch.dtype | None = None):
    """Q, K, V scaled to policy.input (FP8) per tensor or per block, float64 (dtype None) or rounded to dtype."""
    fmt = policy.input
    if policy.fp8_scaling == "block":
        if block_q is None or block_k is None:
            raise ValueError("fp8_scaling='block' needs tiles: use the flash kernel (block_q, block_k)")
        return [quantize_blocks(t, fmt, blk, dtype) for t, blk in ((q, block_q), (k, block_k), (v, block_k))]
    return [scaled(t, fmt, tensor_scale(t, fmt, dtype=torch.float64), dtype) for t in (q, k, v)]
