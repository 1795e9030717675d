"""Kernel presets of the attention run in 2026: FlashAttention-4 (Blackwell; bf16, FP8, FP4), SageAttention 1 /
2 / 2++ / 3, and FA3's FP8 path with the FP22 tensor-core accumulator. Each preset's docstring cites what it
follows; where the source leaves a choice open the docstring says which choice the preset makes."""

from __future__ import annotations

from collections.abc import Callable

from flashcheck.core.numerics import FP8_FORMATS, POLICY_LOOKUPS, Format, Policy, mixed_policy
from flashcheck.kernels.sim.preset_type import KernelPreset, fa3_fp8_tiles

FA4_EX2_EMU = {"exp2_emu": 10, "exp2_emu_res": 4, "exp2_emu_start": 1}
# The FP8/FP4 MMAs as kernels.tensorcore.mma computes them: Blackwell's tcgen05 (late c, 25 fraction bits), Hopper's
# wgmma and
# Ada's mma.sync (FP22: 13 fraction bits, c in the alignment). NVFP4 operands enter as a block-scaled MMA takes
# them: e2m1 x e4m3 block scale in the chain, the fp32 tensor scales on its result (kernels.sim.mma_ops); how the
# hardware aligns block-scaled products inside the chain is modelled, not measured.
B200_MMA = {"qk_mma": "b200", "pv_mma": "b200"}
HALF = (Format.FP16, Format.BF16)


def _need(name: str, fmt: Format, allowed: tuple[Format, ...]) -> None:
    if fmt not in allowed:
        want = ", ".join(f.value for f in allowed)
        raise ValueError(f"preset {name} runs {want} inputs; got {fmt.value} (use {allowed[0].value})")


def _fp8_base(fmt: Format, name: str, output: Format = Format.BF16) -> Policy:
    return Policy(
        name=name,
        input=fmt,
        score=Format.FP32,
        stats=Format.FP32,
        p=Format.FP8_E4M3,
        accum=Format.FP32,
        output=output,
        matmul=Format.FP32,
        fp8_scaling="tensor",
    )


def fa4_bf16(fmt: Format) -> Policy:
    """FlashAttention-4 forward, 16-bit inputs (Dao-AILab/flash-attention at commit 0251105a,
    flash_attn/cute/flash_fwd_sm100.py and softmax.py SoftmaxSm100): fp32 statistics and TMEM accumulator, P
    cast to the input dtype; part of the exp2s emulated in software (ex2_emu_freq 10, ex2_emu_res 4,
    ex2_emu_start_frg 1: the tuning of hdim 128, non-causal, 2-CTA); conditional rescaling with
    rescale_threshold 8.0 (16-bit inputs); 1/l by rcp.approx."""
    _need("fa4-bf16", fmt, (Format.BF16, Format.FP16))
    return mixed_policy(fmt).replace(
        name=f"fa4-bf16@{fmt.value}", rescale_threshold=8.0, approx_recip=True, **FA4_EX2_EMU
    )


def fa4_fp8(fmt: Format) -> Policy:
    """FlashAttention-4 forward, FP8 inputs (flash-attention at commit 0251105a, flash_attn/cute/flash_fwd_sm100.py:
    max_offset 8 for 1-byte inputs, so P is
    scaled by 2^8 before its e4m3 cast; rescale_threshold 0; descale factors per tensor): e4m3 Q, K, V with
    per-tensor scales, P e4m3 x 256, fp32 statistics and accumulator (Blackwell's tcgen05 accumulates FP8 MMA
    in full fp32), emulated exp2 as fa4-bf16, rcp.approx; bf16 output."""
    _need("fa4-fp8", fmt, tuple(sorted(FP8_FORMATS)))
    base = _fp8_base(fmt, f"fa4-fp8@{fmt.value}")
    return base.replace(name=base.name, p_scale=256.0, approx_recip=True, **B200_MMA, **FA4_EX2_EMU)


def fa4_fp4(fmt: Format) -> Policy:
    """FlashAttention-4 with NVFP4 operands. The fetched flash-attention snapshot (commit 0251105a) has no sm100 FP4
    forward
    (no flash_fwd_sm100_fp4.py), so this preset models Blackwell's block-scaled MMA (tcgen05 kind mxf4nvf4):
    Q, K, V as NVFP4 (e2m1, 16-element blocks along the product's reduction dim, e4m3 block scales, an
    fp32 tensor scale: the block-scaled values go through the MMA, the tensor scales multiply its fp32 result,
    as torchao 0.18.0's _addmm_nvfp4_dispatch does), P as in fa4-fp8 (e4m3 x 2^8), fp32 accumulator, FA4's
    softmax. `fmt` is the
    16-bit dtype the inputs come in. Block scales: NVIDIA's quantisation recipe (torchao's nvfp4_quantize, which
    the MSLK kernels match) raises a block scale below e4m3's 2^-6 to it: nvfp4_floor on."""
    _need("fa4-fp4", fmt, HALF)
    base = _fp8_base(Format.FP4_E2M1, f"fa4-fp4@{fmt.value}", output=fmt)
    return base.replace(
        name=base.name,
        qk_scaling="nvfp4",
        v_scaling="nvfp4",
        p_scale=256.0,
        approx_recip=True,
        nvfp4_floor=True,
        **B200_MMA,
        **FA4_EX2_EMU,
    )


def sage1(fmt: Format) -> Policy:
    """SageAttention (arXiv 2410.02367; thu-ml/SageAttention at commit d1a57a5, sageattention/core.py
    sageattn_qk_int8_pv_fp16_triton): K smoothed
    (its mean over the tokens subtracted), Q and K INT8 per block (128 query, 64 key rows; scale amax/127,
    rounding half away from zero), P and V in fp16, P·V accumulated in fp32, output in the input dtype."""
    _need("sage1", fmt, HALF)
    pol = mixed_policy(Format.INT8).replace(p=Format.FP16, output=fmt, name=f"sage1@{fmt.value}")
    return pol.replace(name=pol.name, qk_scaling="block", smooth_k=True, v_format=Format.FP16)


SAGE_COMMIT = "thu-ml/SageAttention d1a57a546c3d395b1ffcbeecc66d81db76f3b4b5"
SAGE_P_SCALE = 2.0**8.807  # csrc/qattn/attn_utils.cuh S_FP8_OFFSET 8.807: the row max maps to 2^8.807 (448)


def _sage2_common(fmt: Format, name: str, warp_q: int, warp_k: int) -> Policy:
    # sageattention/core.py: smooth_k (K's mean over the tokens subtracted), qk_quant_gran per_thread
    # (triton/quant_per_thread.py: per WARPQ query rows 8 groups by index mod 8, per WARPK keys 4 groups of
    # index pairs), V per_channel_fp8 (quant.py) in e4m3, P e4m3 offset by S_FP8_OFFSET
    pol = mixed_policy(Format.INT8).replace(p=Format.FP8_E4M3, output=fmt, name=name)
    return pol.replace(
        name=name,
        qk_scaling="thread",
        qk_warp_q=warp_q,
        qk_warp_k=warp_k,
        smooth_k=True,
        v_format=Format.FP8_E4M3,
        v_scaling="channel",
        p_scale=SAGE_P_SCALE,
    )


def sage2_ada(fmt: Format) -> Policy:
    """SageAttention2 on Ada (sm89), as `sageattn` runs it there (thu-ml/SageAttention at commit d1a57a5,
    sageattention/core.py sageattn -> sageattn_qk_int8_pv_fp8_cuda with pv_accum_dtype "fp32+fp16";
    csrc/qattn/sm89_qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf.cu: CTA_Q 128, CTA_K 64, WARP_Q 32,
    WARP_K 64): INT8 per-thread Q (32-row warps) and K (64-key groups) with K smoothed; V e4m3 per channel
    with its amax mapped to 2.25 (quant_v_scale_max for fp32+fp16) so the fp16 sums stay in range; P e4m3
    offset by 2^8.807; the FP8 P·V MMA accumulates in fp16 within each 64-key block, added to an fp32 buffer
    after it (SageAttention2++, arXiv 2505.21136)."""
    _need("sage2-ada", fmt, HALF)
    pol = _sage2_common(fmt, f"sage2-ada@{fmt.value}", 32, 64)
    # Ada's mma.sync with an fp16 accumulator register (kernels.tensorcore.mma, acc "fp16"); acc_bits states its width
    # to
    # the error model
    return pol.replace(name=pol.name, acc_bits=10, acc_nearest=True, acc_promote=64, v_scale_max=2.25, pv_mma="ada")


def sage2_hopper(fmt: Format) -> Policy:
    """SageAttention2 on Hopper (sm90), as `sageattn` runs it there (thu-ml/SageAttention at commit d1a57a5,
    sageattention/core.py sageattn_qk_int8_pv_fp8_cuda_sm90, pv_accum_dtype "fp32+fp32": per_thread_int8
    with BLKQ 64, WARPQ 16, BLKK 128, WARPK 128; csrc/qattn/qk_int_sv_f8_cuda_sm90.cu: CTA_Q 64, CTA_K 128,
    each key block's wgmma P·V into RO_temp, then RO += RO_temp in fp32): INT8 per-thread Q (16-row warps)
    and K (128-key groups) with K smoothed; V e4m3 per channel (amax at 448); P e4m3 offset by 2^8.807; the
    FP8 MMA's FP22 accumulator (13 mantissa bits, truncating) within each 128-key block, promoted to fp32."""
    _need("sage2-hopper", fmt, HALF)
    pol = _sage2_common(fmt, f"sage2-hopper@{fmt.value}", 16, 128)
    return pol.replace(name=pol.name, acc_bits=13, acc_promote=128, pv_mma="hopper")  # tensorcore.mma's Hopper


def sage2_4b(fmt: Format) -> Policy:
    """SageAttention2's 4-bit variant (arXiv 2411.10958; no released kernel at commit d1a57a5): Q and K INT4 per
    thread with Ada's granularity, Q smoothed (each query block's mean subtracted and added back in the fp32
    scores) and K smoothed, FP8 P (x 2^8.807) and V (per channel), the FP22 accumulator promoted per 64 keys
    ("fp32+fp32")."""
    _need("sage2-4b", fmt, HALF)
    pol = _sage2_common(fmt, f"sage2-4b@{fmt.value}", 32, 64)
    return pol.replace(name=pol.name, input=Format.INT4, smooth_q=True, acc_bits=13, acc_promote=64, pv_mma="hopper")


def sage3_fp4(fmt: Format) -> Policy:
    """SageAttention3 (arXiv 2505.11594) as its Blackwell kernel does it (thu-ml/SageAttention at commit
    d1a57a5, sageattention3_blackwell/sageattn3/api.py, quantization/fp4_quantization_4d.cu,
    blackwell/softmax_fused.h, mainloop_tma_ws.h; the rules in kernels.formats.sage3): K smoothed over the tokens,
    Q's per-128-row-block mean subtracted and q̄ K^T (in the input dtype) the Q K^T MMA's initial fp32 C,
    Q, K, V in 1x16 FP4 blocks with one e4m3 scale amax / 6 and no tensor scale, P offset so the running max
    maps to 448 * 6 before its per-16 e4m3 scales, key blocks last to first, fp32 accumulator; output in the
    input dtype. A block scale whose e4m3 cast is subnormal or zero is kept (fp4_quantization_4d.cu: no floor;
    nvfp4_floor does not apply)."""
    _need("sage3-fp4", fmt, HALF)
    base = mixed_policy(Format.FP4_E2M1).replace(p=Format.FP4_E2M1, output=fmt)
    return base.replace(
        name=f"sage3-fp4@{fmt.value}", qk_scaling="sage3", v_scaling="sage3", p_scaling="sage3",
        p_scale=448.0 * 6.0, kv_order="reverse", source_format=fmt, **B200_MMA,
    )  # fmt: skip


def fa3_fp8_fp22(fmt: Format) -> Policy:
    """FlashAttention-3's FP8 path (as preset fa3-fp8: e4m3 block scales, Hadamard, P x 2^8 in e4m3) with the FP8
    MMA's real accumulator: about 13-14 mantissa bits on Ada/Hopper (SageAttention2, arXiv 2411.10958: FP22,
    1 sign, 8 exponent, 13 mantissa bits; DeepSeek-V3, arXiv 2412.19437, section 3.3.2), truncating. FA3
    accumulates P·V into O inside the MMA with no promotion, so O itself is held in FP22; Q K^T, an FP8 MMA
    too, sums in FP22 over D. Both MMAs run kernels.tensorcore.mma's Hopper model (qk_mma, pv_mma: blocks of 32 products
    aligned to their largest exponent, terms truncated to 13 bits below it, as the H100 does); acc_bits and
    qk_acc_bits state the width to the error model. (SageAttention's Q K^T is an INT8 MMA: exact int32 sums.)"""
    _need("fa3-fp8-fp22", fmt, tuple(sorted(FP8_FORMATS)))
    from flashcheck.core.numerics import NAMED_POLICIES

    base = NAMED_POLICIES["fa3-fp8"]
    pol = base.replace(input=fmt, p=fmt, fp8_scaling="block", hadamard=True, p_scale=256.0, kv_order="reverse")
    return pol.replace(name=f"fa3-fp8-fp22@{fmt.value}", acc_bits=13, qk_acc_bits=13, qk_mma="hopper", pv_mma="hopper")


def _tiles(bq: int, bk: int) -> Callable[[int, int, int, bool], tuple[int, int]]:
    def tiles(lq: int, lk: int, d: int, causal: bool) -> tuple[int, int]:
        return bq, bk

    return tiles


def preset_policy(spec: str) -> tuple[Policy, KernelPreset] | None:
    """(policy, preset) for "NAME" or "NAME@FMT" naming a preset here (NAME's default format when no FMT);
    None when NAME is not one of them. ValueError for a format the preset does not run."""
    name, _, fmt = spec.strip().lower().partition("@")
    pre = MODERN_PRESETS.get(name)
    if pre is None:
        return None
    from flashcheck.core.numerics import parse_format

    return pre.policy(parse_format(fmt or pre.default_format)), pre


# FA4 sm100: m_block_size 128 per CTA, n_block_size 128. Sage: CTA_Q 128, CTA_K 64 (SageAttention1, the sm89
# SageAttention2 kernels), CTA_Q 64, CTA_K 128 (sm90); SageAttention3: launch.h Flash_fwd_kernel_traits 128 x 128.
MODERN_PRESETS: dict[str, KernelPreset] = {
    "fa4-bf16": KernelPreset(
        "fa4-bf16", "flash-attn 4 (B200), 16-bit: emulated exp2, rescale threshold 8, rcp.approx",
        _tiles(128, 128), fa4_bf16, exp2=True,
    ),
    "fa4-fp8": KernelPreset(
        "fa4-fp8", "flash-attn 4 (B200), FP8: per-tensor e4m3, P x 2^8 in e4m3, emulated exp2",
        _tiles(128, 128), fa4_fp8, exp2=True, default_format="fp8-e4m3",
    ),
    "fa4-fp4": KernelPreset(
        "fa4-fp4", "flash-attn 4 with NVFP4 Q, K, V (block-scaled MMA), P e4m3 x 2^8",
        _tiles(128, 128), fa4_fp4, exp2=True,
    ),
    "sage1": KernelPreset(
        "sage1", "SageAttention: smoothed K, INT8 per-block Q and K, fp16 P and V",
        _tiles(128, 64), sage1, exp2=True, default_format="fp16",
    ),
    "sage2-ada": KernelPreset(
        "sage2-ada", "SageAttention2 on Ada: INT8 per-thread Q (32-row warps), K (64-key groups); FP8 P, V; fp16 "
        "P·V accumulator per 64-key block, promoted to fp32", _tiles(128, 64), sage2_ada, exp2=True,
        default_format="fp16",
    ),
    "sage2-hopper": KernelPreset(
        "sage2-hopper", "SageAttention2 on Hopper: INT8 per-thread Q (16-row warps), K (128-key groups); FP8 P, V; "
        "FP22 accumulator per 128-key block, promoted to fp32", _tiles(64, 128), sage2_hopper, exp2=True,
        default_format="fp16",
    ),
    "sage2": KernelPreset(
        "sage2", "alias of sage2-hopper (the fp32+fp32 accumulation)", _tiles(64, 128), sage2_hopper, exp2=True,
        default_format="fp16",
    ),
    "sage2pp": KernelPreset(
        "sage2pp", "alias of sage2-ada (SageAttention2++'s fp16 accumulator, Ada's default)", _tiles(128, 64),
        sage2_ada, exp2=True, default_format="fp16",
    ),
    "sage2-4b": KernelPreset(
        "sage2-4b", "SageAttention2 4-bit: INT4 per-thread smoothed Q and K, FP8 P, V",
        _tiles(128, 64), sage2_4b, exp2=True, default_format="fp16",
    ),
    "sage3-fp4": KernelPreset(
        "sage3-fp4", "SageAttention3: smoothed Q (per 128 rows) and K, 1x16 FP4 with e4m3 scales, P at 448 x 6",
        _tiles(128, 128), sage3_fp4, exp2=True,
    ),
    "fa3-fp8-fp22": KernelPreset(
        "fa3-fp8-fp22", "flash-attn 3 FP8 with the FP22 tensor-core accumulator (13 mantissa bits)",
        fa3_fp8_tiles, fa3_fp8_fp22, exp2=True, default_format="fp8-e4m3",
    ),
}  # fmt: skip


def _policy_only(spec: str) -> Policy | None:
    found = preset_policy(spec)
    return None if found is None else found[0]


POLICY_LOOKUPS.append(_policy_only)  # parse_policy("sage2@fp16") without core importing kernels
