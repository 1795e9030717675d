"""Kernel presets: the flash simulator configured as a real kernel (tiles, algorithm, policy at a dtype)."""

from __future__ import annotations

from collections.abc import Callable

from flashcheck.core.numerics import FP8_FORMATS, NAMED_POLICIES, Format, Policy, mixed_policy, parse_format
from flashcheck.kernels.sim.preset_type import KernelPreset, fa3_fp8_tiles
from flashcheck.kernels.sim.presets_modern import MODERN_PRESETS

__all__ = ["KERNEL_PRESETS", "KernelPreset", "default_format", "kernel_preset", "resolve"]


def _cpu_tiles(lq: int, lk: int, d: int, causal: bool) -> tuple[int, int]:
    # aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: q split 32/64/256 by q_len, kv split 512
    return (32 if lq < 192 else 64 if lq < 768 else 256), 512


def _whole_tiles(lq: int, lk: int, d: int, causal: bool) -> tuple[int, int]:
    # an unfused kernel: all of a row's scores at once, one block
    return max(lq, 1), max(lk, 1)


def _fa2_tiles(lq: int, lk: int, d: int, causal: bool) -> tuple[int, int]:
    # flash-attn 2 forward on sm80 without dropout: 128 x 128 up to head dim 64, then 128 x 64
    return (128, 128) if d <= 64 else (128, 64)


FA3_P_SCALE = 256.0  # 2^Max_offset


def _fp8_policy(fmt: Format) -> Policy:
    """FlashAttention-3's FP8 forward (Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced):
    hopper/flash_fwd_kernel_sm90.h instantiates flash::Softmax with Max_offset 8 for FP8, so hopper/softmax.h
    scale_apply_exp2 subtracts 8 from the scaled row max: P = 2^8 exp(S - m) before its e4m3 cast, and
    finalize divides the row sum by 2^8. Key blocks run last to first (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp:
    n_block from n_block_max - 1 down). Q, K, V e4m3 with block scales and Hadamard incoherent processing
    (the paper's setting, arXiv 2407.08608 section 4.3), fp32 statistics and accumulator."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"preset fa3-fp8 runs fp8 inputs; got {fmt.value} (use fp8-e4m3)")
    base = NAMED_POLICIES["fa3-fp8"]
    pol = base.replace(input=fmt, p=fmt, fp8_scaling="block", hadamard=True, name=f"fa3-fp8@{fmt.value}")
    return pol.replace(name=pol.name, p_scale=FA3_P_SCALE, kv_order="reverse")


def _named_mixed(tag: str) -> Callable[[Format], Policy]:
    def make(fmt: Format) -> Policy:
        return mixed_policy(fmt).replace(name=f"{tag}@{fmt.value}")

    return make


def _p_in_fp32(tag: str) -> Callable[[Format], Policy]:
    def make(fmt: Format) -> Policy:
        pol = mixed_policy(fmt)
        return pol.replace(p=pol.accum, name=f"{tag}@{fmt.value}")

    return make


KERNEL_PRESETS: dict[str, KernelPreset] = {
    "torch-cpu-flash": KernelPreset(
        "torch-cpu-flash",
        "PyTorch's CPU flash kernel: fp32 accumulation, P rounded to the input dtype before P·V",
        _cpu_tiles,
        _named_mixed("torch-cpu-flash"),
    ),
    "jax-xla": KernelPreset(
        "jax-xla",
        "JAX's XLA attention (jax.nn.dot_product_attention, implementation='xla') as its CPU lowering rounds: "
        "unfused (one block), Q K^T accumulated and scaled in fp32, fp32 softmax, P in the input dtype, P·V in fp32 "
        "(jitted on the CPU: below 4096 query rows B*H*Lq at D=64)",
        _whole_tiles,
        _named_mixed("jax-xla"),
    ),
    "jax-xla-fused": KernelPreset(
        "jax-xla-fused",
        "jitted JAX XLA attention on the CPU from 4096 query rows B*H*Lq (D=64): XLA fuses softmax into P·V and the "
        "cast of P to the input dtype disappears, so P stays fp32; otherwise as jax-xla",
        _whole_tiles,
        _p_in_fp32("jax-xla-fused"),
    ),
    "fa2-gpu": KernelPreset(
        "fa2-gpu",
        "flash-attn 2 on A100: exp2 with log2(e) folded into the scale, fp32 statistics and accumulator",
        _fa2_tiles,
        _named_mixed("fa2-gpu"),
        exp2=True,
    ),
    "fa3-fp8": KernelPreset(
        "fa3-fp8",
        "flash-attn 3 FP8 on H100: e4m3 block scales, Hadamard, P x 2^8 in e4m3",
        fa3_fp8_tiles,
        _fp8_policy,
        exp2=True,
        default_format="fp8-e4m3",
    ),
    **MODERN_PRESETS,
}


def kernel_preset(name: str) -> KernelPreset:
    try:
        return KERNEL_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown kernel preset {name!r}; expected one of {', '.join(KERNEL_PRESETS)}") from None


def alias_of(name: str) -> str | None:
    """The preset that `name` is another name for (sage2 -> sage2-hopper: its policy is that preset's), else None."""
    pre = kernel_preset(name)
    canonical = pre.policy(parse_format(pre.default_format)).name.split("@")[0]
    return canonical if canonical != name and canonical in KERNEL_PRESETS else None


def resolve(name: str, fmt: Format | str, lq: int, lk: int, d: int, causal: bool) -> dict:
    """Keyword arguments of flash_attention for preset `name` at dtype fmt and this shape."""
    pre = kernel_preset(name)
    bq, bk = pre.tiles(lq, lk, d, causal)
    out = {
        "policy": pre.policy(parse_format(fmt)),
        "block_q": bq,
        "block_k": bk,
        "algorithm": pre.algorithm,
        "exp2": pre.exp2,
    }
    if pre.key_order != "forward":
        out["key_order"] = pre.key_order
    return out


def default_format(name: str | None, fallback: str = "bf16") -> str:
    """The input format preset `name` runs by default (fallback without a preset)."""
    return fallback if name is None else kernel_preset(name).default_format
