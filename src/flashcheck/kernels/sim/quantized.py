"""Quantized-attention inputs and P (SageAttention 1/2/3, FA4's FP8/FP4 paths): Q and K per block / token /
thread or in MX / NVFP4 blocks along D, optional smoothing, V in its own format and scaling, P scaled or
two-level NVFP4. Tensors q, k [B, H, L, D], v [B, H, L, Dv], float64 in and out (dequantised values)."""

from __future__ import annotations

import torch

from flashcheck.core.numerics import (
    INT_FORMATS,
    MX_ELEMENT_FORMATS,
    NARROW_FORMATS,
    Format,
    Policy,
    info,
    round_to,
)
from flashcheck.core.quant import (
    NVFP4Parts,
    group_ids,
    nvfp4_parts,
    nvfp4_tensor_scales,
    quantize_int,
    quantize_mx,
    quantize_nvfp4,
)
from flashcheck.kernels.formats.sage3 import quantize_fp4x16, sage3_inputs, sage3_p
from flashcheck.kernels.native.fp8 import abs_max, int_quantized, scaled
from flashcheck.kernels.native.fp8 import amax_scale as fp8_scale
from flashcheck.kernels.native.presets import fp4x16 as native_fp4x16
from flashcheck.kernels.native.presets import nvfp4 as native_nvfp4
from flashcheck.kernels.native.presets import p_fp8
from flashcheck.kernels.native.presets import sage3_p as native_sage3_p

SAGE_WARP_Q, SAGE_WARP_K = 32, 64  # SageAttention2 per_thread_int8: WARPQ = 32 query rows, BLKK = 64 keys


def uses_quantized_inputs(policy: Policy) -> bool:
    """True when the policy's inputs take this module's path (any input knob set, or an fp6/fp4/int input)."""
    knobs = policy.qk_scaling or policy.v_scaling or policy.smooth_q or policy.smooth_k or policy.v_format
    return bool(knobs) or policy.input in MX_ELEMENT_FORMATS | INT_FORMATS


def quantize_tokens(
    t: torch.Tensor,
    fmt: Format,
    scaling: str,
    *,
    block: int,
    role: str,
    scale_max: float = 0.0,
    warps: tuple[int, int] = (SAGE_WARP_Q, SAGE_WARP_K),
    mx_rounding: str = "floor",
    nvfp4_floor: bool = False,
    parts: dict | None = None,
) -> torch.Tensor:
    """t [B, H, L, D] quantised to fmt with `scaling` (QK_SCALINGS / V_SCALINGS): tensor, block (of `block`
    tokens), token, thread (SageAttention2: role q 8 groups per warps[0] rows, k 4 per warps[1]), channel (one scale per
    column over the tokens, V; its amax maps to `scale_max`, 0: fmt's max), mx / nvfp4 (blocks along D for
    q and k, along the tokens for v; MX scales rounded by `mx_rounding`, NVFP4 block scales floored by
    `nvfp4_floor`). parts (a dict): NVFP4's pieces (core.quant.nvfp4_parts: the block-scaled values, the tensor
    descale) stored under `role`, for the block-scaled MMA (kernels.sim.mma_ops)."""
    along = -2 if role == "v" else -1
    if scaling == "mx":
        return quantize_mx(t, fmt, dim=along, rounding=mx_rounding or "floor")
    if scaling == "nvfp4":
        if parts is None:
            return quantize_nvfp4(t, dim=along, scale_floor=nvfp4_floor)
        got = _nvfp4_parts(t, along, nvfp4_floor)
        parts[role] = got
        return got.values
    if scaling == "sage3":
        return fp4x16(t, dim=along).to(t.dtype)
    warp_q, warp_k = warps
    if fmt in INT_FORMATS:
        warp, threads = (warp_q, 8) if role == "q" else (warp_k, 4)
        gran = scaling or "tensor"
        fast = int_quantized(t, fmt, gran, block=block, warp=warp, threads=threads)
        return quantize_int(t, fmt, gran, block=block, warp=warp, threads=threads).to(t.dtype) if fast is None else fast
    if scaling in ("", "tensor"):
        return scaled(t, fmt, fp8_scale(t, fmt)) if fmt in NARROW_FORMATS else round_to(t, fmt)
    if scaling == "channel":  # SageAttention's per_channel_fp8: amax maps to scale_max (default fmt's max)
        scale = fp8_scale(t, fmt, -2)
        return scaled(t, fmt, scale * (info(fmt).max / scale_max) if scale_max else scale)
    ids = group_ids(t.shape[-2], scaling, block=block, warp=warp_q if role == "q" else warp_k,
                    threads=8 if role == "q" else 4)  # fmt: skip
    return _per_group(t, fmt, ids.to(t.device))


def _per_group(t: torch.Tensor, fmt: Format, ids: torch.Tensor) -> torch.Tensor:
    amax = torch.zeros(*t.shape[:-2], int(ids.max()) + 1, dtype=t.dtype, device=t.device)
    amax.scatter_reduce_(-1, ids.expand(*t.shape[:-2], -1), t.abs().amax(dim=-1), "amax")
    a = amax.index_select(-1, ids).unsqueeze(-1)
    scale = torch.where(a > 0, a / info(fmt).max, torch.ones_like(a))
    return scaled(t, fmt, scale)


def _nvfp4_parts(t: torch.Tensor, dim: int, floor: bool) -> NVFP4Parts:
    """core.quant.nvfp4_parts(t, dim=dim, scale_floor=floor), its block pieces in one C pass where it applies: the
    same float32 steps (kernels.native.presets.nvfp4), the tensor scales formed here as nvfp4_parts forms them."""
    x32 = t.detach().to(torch.float32).contiguous()  # nvfp4_parts' first step (any layout: the same values)
    if x32.numel() == 0:
        return nvfp4_parts(t, dim=dim, scale_floor=floor)
    amax_t = abs_max(x32)  # x32.abs().amax(): a maximum is exact, NaN propagates (the C pass then declines)
    s_enc, descale = nvfp4_tensor_scales(amax_t)
    fast = native_nvfp4(x32, dim, float(s_enc), floor)
    if fast is None:
        return nvfp4_parts(t, dim=dim, scale_floor=floor)
    return NVFP4Parts(fast[0].to(t.dtype), fast[1], descale)


def fp4x16(x: torch.Tensor, *, dim: int = -1, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """kernels.formats.sage3.quantize_fp4x16's values ([x's shape] in dtype, float64 or float32: each value e2m1 x e4m3
    is
    exact in float32), in one C pass where it applies."""
    x32 = x.detach().to(torch.float32).contiguous()  # quantize_fp4x16's first step (any layout: the same values)
    fast = native_fp4x16(x32, dim, dtype)
    return quantize_fp4x16(x32, dim=dim).to(dtype) if fast is None else fast


def _fp4x16_float32(x: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    return fp4x16(x, dim=dim, dtype=torch.float32)


def quantize_inputs(
    q, k, v, policy: Policy, *, block_q: int, block_k: int, parts: dict | None = None, float32: bool = False
):
    """(q, k, v) as the quantized kernel holds them. smooth_k subtracts K's mean over the tokens (a per-row
    constant of the scores, which softmax cancels: the kernels drop it); smooth_q subtracts each query block's
    mean before quantising and adds it back inside the float32 score product (the kernels add the GEMV
    mean · K^T to the scores). V in policy.v_format (default: input) with v_scaling. parts (a dict): the NVFP4
    pieces of the returned q, k, v under "q", "k", "v" (see quantize_tokens; none for a smoothed q). float32:
    SageAttention3's q, k, v come in float32 (the same values: each is exact in float32), not float64."""
    fmt = policy.input
    if fmt == Format.FP64:
        return q, k, v
    if policy.qk_scaling == "sage3":  # SageAttention3's own preprocessing (kernels.formats.sage3): q, k get 2 D columns
        quantize = _fp4x16_float32 if float32 else fp4x16
        return sage3_inputs(q, k, v, policy.source_format or Format.BF16, quantize=quantize)
    if policy.smooth_k:
        k = k - k.mean(dim=-2, keepdim=True)
    qm = None
    if policy.smooth_q:
        ids = group_ids(q.shape[-2], "block", block=block_q).to(q.device)
        sums = torch.zeros(*q.shape[:-2], int(ids.max()) + 1, q.shape[-1], dtype=q.dtype, device=q.device)
        sums.index_add_(-2, ids, q)
        counts = torch.bincount(ids).to(q.dtype).unsqueeze(-1)
        qm = (sums / counts).index_select(-2, ids)
        q = q - qm
    warps = (policy.qk_warp_q or SAGE_WARP_Q, policy.qk_warp_k or SAGE_WARP_K)
    knobs = {"mx_rounding": policy.mx_rounding or "floor", "nvfp4_floor": policy.nvfp4_floor, "warps": warps}
    knobs["parts"] = parts
    qq = quantize_tokens(q, fmt, policy.qk_scaling, block=block_q, role="q", **knobs)
    kq = quantize_tokens(k, fmt, policy.qk_scaling, block=block_k, role="k", **knobs)
    if qm is not None:
        qq = qq + qm
        if parts is not None:
            parts.pop("q", None)  # q's values are no longer the pieces' product
    vfmt = policy.v_format or fmt
    vq = quantize_tokens(v, vfmt, policy.v_scaling, block=block_k, role="v", scale_max=policy.v_scale_max, **knobs)
    return qq, kq, vq


def quantize_p(p: torch.Tensor, policy: Policy, out: torch.Tensor | None = None) -> torch.Tensor:
    """P [..., rows, Bc] as the P·V product sees it, in the p stage's scale (divide the product by p_scale):
    P * p_scale rounded to the p format; with p_scaling sage3 as SageAttention3's kernel (kernels.formats.sage3.sage3_p:
    P * p_scale, the running max at 448 * 6, in 16-key FP4 blocks with single e4m3 scales); with nvfp4 two-level
    NVFP4 (each row's max mapped to 448 * 6 by an FP32 scale, then NVFP4 blocks of 16 keys with e4m3 scales).
    out: a float32 buffer of p's shape (not p) that the FP8 and sage3 C passes write into, or None."""
    if policy.p_scaling == "sage3":
        fast = native_sage3_p(p, policy.p_scale, out)  # one C pass (kernels.native.presets, into out), or None
        return sage3_p(p, policy.p_scale) if fast is None else fast
    if policy.p_scaling == "nvfp4":
        rowmax = p.detach().abs().amax(dim=-1, keepdim=True)
        amax = rowmax * policy.p_scale
        return quantize_nvfp4(p * policy.p_scale, dim=-1, tensor_amax=amax, scale_floor=policy.nvfp4_floor).to(p.dtype)
    # FP8 P: one C pass (into `out`, a float32 tensor of p's shape, not p, where given), or None
    fast = p_fp8(p, policy.p_scale, policy.p, out) if not policy.p_scaling else None
    return round_to(p * policy.p_scale if policy.p_scale != 1.0 else p, policy.p) if fast is None else fast
