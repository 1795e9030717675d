"""Kernel presets of the attention run in 2026: FlashAttention-4 (Blackwell; bf16, FP8, FP4), SageAttention 1 /
2 / 2++ / 3, and FA3's FP8 path with the FP22 tensor-core accumulator. Each preset's docstring cites what it
follows; where the source leaves a choice open the docstring says which choice the preset makes."""

from __future__ import annotations

from collections.abc import Callable

from flashcheck.core.numerics import FP8_FORMATS, POLICY_LOOKUPS, Format, Policy, mixed_policy
from flashcheck.kernels.preset_type import KernelPreset, fa3_fp8_tiles

FA4_EX2_EMU = {"exp2_emu": 10, "exp2_emu_res": 4, "exp2_emu_start": 1}
# The FP8/FP4 MMAs as kernels.mma computes them: Blackwell's tcgen05 (late c, 25 fraction bits), Hopper's wgmma and
# Ada's mma.sync (FP22: 13 fraction bits, c in the alignment). NVFP4 operands (block scales inside the MMA) enter
# the model as dequantised values (kernels.mma_ops), an approximation no oracle checks.
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
    """FlashAttention-4 forward, 16-bit inputs (flash-attention flash_attn/cute/flash_fwd_sm100.py and
    softmax.py SoftmaxSm100): fp32 statistics and TMEM accumulator, P cast to the input dtype; part of the
    exp2s emulated in software (ex2_emu_freq 10, ex2_emu_res 4, ex2_emu_start_frg 1: the tuning of hdim 128,
    non-causal, 2-CTA); conditional rescaling with rescale_threshold 8.0 (16-bit inputs); 1/l by
    rcp.approx."""
    _need("fa4-bf16", fmt, (Format.BF16, Format.FP16))
    return mixed_policy(fmt).replace(
        name=f"fa4-bf16@{fmt.value}", rescale_threshold=8.0, approx_recip=True, **FA4_EX2_EMU
    )


def fa4_fp8(fmt: Format) -> Policy:
    """FlashAttention-4 forward, FP8 inputs (flash_fwd_sm100.py: max_offset 8 for 1-byte inputs, so P is
    scaled by 2^8 before its e4m3 cast; rescale_threshold 0; descale factors per tensor): e4m3 Q, K, V with
    per-tensor scales, P e4m3 x 256, fp32 statistics and accumulator (Blackwell's tcgen05 accumulates FP8 MMA
    in full fp32), emulated exp2 as fa4-bf16, rcp.approx; bf16 output."""
    _need("fa4-fp8", fmt, tuple(sorted(FP8_FORMATS)))
    base = _fp8_base(fmt, f"fa4-fp8@{fmt.value}")
    return base.replace(name=base.name, p_scale=256.0, approx_recip=True, **B200_MMA, **FA4_EX2_EMU)


def fa4_fp4(fmt: Format) -> Policy:
    """FlashAttention-4 with NVFP4 operands. The fetched flash-attention snapshot has no sm100 FP4 forward
    (no flash_fwd_sm100_fp4.py), so this preset models Blackwell's block-scaled MMA (tcgen05 kind mxf4nvf4):
    Q, K, V as NVFP4 (e2m1, 16-element blocks along the product's reduction dim, e4m3 block scales, an
    fp32 tensor scale), P as in fa4-fp8 (e4m3 x 2^8), fp32 accumulator, FA4's softmax. `fmt` is the
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
    """SageAttention (arXiv 2410.02367; thu-ml/SageAttention sageattn_qk_int8_pv_fp16_triton): K smoothed
    (its mean over the tokens subtracted), Q and K INT8 per block (128 query, 64 key rows; scale amax/127,
    rounding half away from zero), P and V in fp16, P·V accumulated in fp32, output in the input dtype."""
    _need("sage1", fmt, HALF)
    pol = mixed_policy(Format.INT8).replace(p=Format.FP16, output=fmt, name=f"sage1@{fmt.value}")
    return pol.replace(name=pol.name, qk_scaling="block", smooth_k=True, v_format=Format.FP16)


def _sage2_common(fmt: Format, name: str) -> Policy:
    # thu-ml/SageAttention core.py sageattn_qk_int8_pv_fp8_cuda: qk_quant_gran per_thread (WARPQ 32,
    # BLKK 64), smooth_k, V per-channel e4m3, P e4m3 with the static scale 448 (arXiv 2411.10958 section 4)
    pol = mixed_policy(Format.INT8).replace(p=Format.FP8_E4M3, output=fmt, name=name)
    return pol.replace(
        name=name,
        qk_scaling="thread",
        smooth_k=True,
        v_format=Format.FP8_E4M3,
        v_scaling="channel",
        p_scale=448.0,
    )


def sage2(fmt: Format) -> Policy:
    """SageAttention2 (arXiv 2411.10958; the released kernel's default on Ada/Hopper, pv_accum_dtype
    "fp32+fp32"): INT8 per-thread Q and K with K smoothed, FP8 P (x 448) and V (per channel), the FP8 MMA's
    FP22 accumulator (13 mantissa bits, truncating) promoted to fp32 after every 64-key block (its two-level
    accumulation), computed by the Hopper model of kernels.mma (pv_mma; acc_bits states its width to the error
    model). The paper's 4-bit variant is `sage2-4b`."""
    _need("sage2", fmt, HALF)
    pol = _sage2_common(fmt, f"sage2@{fmt.value}")
    return pol.replace(name=pol.name, acc_bits=13, acc_promote=64, pv_mma="hopper")


def sage2_4b(fmt: Format) -> Policy:
    """SageAttention2's 4-bit variant (arXiv 2411.10958): Q and K INT4 per thread, Q smoothed (each query
    block's mean subtracted and added back in the fp32 scores) and K smoothed, the rest as sage2."""
    _need("sage2-4b", fmt, HALF)
    pol = sage2(fmt)
    return pol.replace(name=f"sage2-4b@{fmt.value}", input=Format.INT4, smooth_q=True)


def sage2pp(fmt: Format) -> Policy:
    """SageAttention2++ (arXiv 2505.21136; core.py pv_accum_dtype "fp32+fp16"): as sage2, but the FP8 P·V MMA
    accumulates in fp16 (10 mantissa bits, round to nearest) inside each block, promoted to fp32 after it;
    V's per-channel scale maps its amax to 2.25 instead of 448 so the fp16 sums stay in range."""
    _need("sage2pp", fmt, HALF)
    pol = _sage2_common(fmt, f"sage2pp@{fmt.value}")
    return pol.replace(
        name=pol.name, acc_bits=10, acc_nearest=True, acc_promote=64, v_scale_max=2.25, pv_mma="ada"
    )  # Ada's mma.sync with an fp16 accumulator register (kernels.mma, acc "fp16")


def sage3_fp4(fmt: Format) -> Policy:
    """SageAttention3 (arXiv 2505.11594): NVFP4 (1 x 16 microscaling, e4m3 block scales) Q, K and V, and P
    with its two-level quantisation (each row's max mapped to 448 x 6 by an fp32 scale, then NVFP4 blocks of
    16 keys); fp32 accumulator (Blackwell); output in the input dtype. Block scales without a floor (nvfp4_floor
    off: the e4m3 cast of amax / 6 may give a subnormal or zero scale)."""
    _need("sage3-fp4", fmt, HALF)
    base = mixed_policy(Format.FP4_E2M1).replace(p=Format.FP4_E2M1, output=fmt)
    return base.replace(
        name=f"sage3-fp4@{fmt.value}", qk_scaling="nvfp4", v_scaling="nvfp4", p_scaling="nvfp4", **B200_MMA
    )


def fa3_fp8_fp22(fmt: Format) -> Policy:
    """FlashAttention-3's FP8 path (as preset fa3-fp8: e4m3 block scales, Hadamard, P e4m3) with the FP8
    MMA's real accumulator: about 13-14 mantissa bits on Ada/Hopper (SageAttention2, arXiv 2411.10958: FP22,
    1 sign, 8 exponent, 13 mantissa bits; DeepSeek-V3, arXiv 2412.19437, section 3.3.2), truncating. FA3
    accumulates P·V into O inside the MMA with no promotion, so O itself is held in FP22; Q K^T, an FP8 MMA
    too, sums in FP22 over D. Both MMAs run kernels.mma's Hopper model (qk_mma, pv_mma: blocks of 32 products
    aligned to their largest exponent, terms truncated to 13 bits below it, as the H100 does); acc_bits and
    qk_acc_bits state the width to the error model. (SageAttention's Q K^T is an INT8 MMA: exact int32 sums.)"""
    _need("fa3-fp8-fp22", fmt, tuple(sorted(FP8_FORMATS)))
    from flashcheck.core.numerics import NAMED_POLICIES

    base = NAMED_POLICIES["fa3-fp8"]
    pol = base.replace(input=fmt, p=fmt, fp8_scaling="block", hadamard=True)
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


# FA4 sm100: m_block_size 128 per CTA, n_block_size 128. Sage: CTA_Q 128, CTA_K 64 (SageAttention2 kernels,
# the triton per-block kernel BLKQ 128, BLKK 64); SageAttention3 (Blackwell) modelled with 128 x 128 tiles.
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
    "sage2": KernelPreset(
        "sage2", "SageAttention2: INT8 per-thread Q, K; FP8 P, V; FP22 accumulator, promoted per block",
        _tiles(128, 64), sage2, exp2=True, default_format="fp16",
    ),
    "sage2-4b": KernelPreset(
        "sage2-4b", "SageAttention2 4-bit: INT4 per-thread smoothed Q and K, FP8 P, V",
        _tiles(128, 64), sage2_4b, exp2=True, default_format="fp16",
    ),
    "sage2pp": KernelPreset(
        "sage2pp", "SageAttention2++: as sage2 with an fp16 P·V accumulator inside each block",
        _tiles(128, 64), sage2pp, exp2=True, default_format="fp16",
    ),
    "sage3-fp4": KernelPreset(
        "sage3-fp4", "SageAttention3: NVFP4 Q, K, V and two-level NVFP4 P",
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
