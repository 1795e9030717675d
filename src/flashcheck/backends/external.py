"""Adapters for packages that may be missing: flash-attn (FA2), flash-attn 3, xformers, FlexAttention."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashcheck.backends.base import Availability, Backend, cuda_capability
from flashcheck.kernels.sim.validation import expand_kv_heads


def _module(name: str) -> object | None:
    try:
        return importlib.import_module(name) if importlib.util.find_spec(name.split(".")[0]) else None
    except Exception:  # an installed but broken package (ABI mismatch) is unavailable, not a crash
        return None


@dataclass
class FlashAttnBackend(Backend):
    """flash_attn_func from flash-attn 2 (module flash_attn) or 3 (flash_attn_interface); [B, L, H, D]."""

    module: str = "flash_attn"
    min_arch: tuple[int, int] = (8, 0)
    supports_gqa: bool = True  # native: K/V [B, L, Hkv, D]

    def _available(self, device: str) -> Availability:
        cap = cuda_capability()
        if cap is not None and cap < self.min_arch:
            return Availability(False, f"GPU sm{cap[0]}{cap[1]} too old; needs sm{self.min_arch[0]}{self.min_arch[1]}+")
        if _module(self.module) is None:
            pkg = "flash-attn" if self.module == "flash_attn" else "flash-attn 3 (hopper/ build)"
            return Availability(False, f"{pkg} is not installed or fails to import (see `flashcheck doctor`)")
        return Availability(True)

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        if mask is not None:
            raise ValueError(f"{self.name} takes no arbitrary mask; use causal")
        fn = _module(self.module).flash_attn_func
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)


@dataclass
class XformersBackend(Backend):
    supports_gqa: bool = True  # K/V heads repeated (its native grouped layout is 5-D)

    def _available(self, device: str) -> Availability:
        if _module("xformers.ops") is None:
            return Availability(False, "xformers is not installed or fails to import")
        return Availability(True)

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        xops = _module("xformers.ops")
        bias = None
        if causal:
            bias = xops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
        if mask is not None:
            raise ValueError("xformers adapter takes causal only, no arbitrary mask")
        k, v = expand_kv_heads(q, k, v)
        out = xops.memory_efficient_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, scale=scale
        )
        return out.transpose(1, 2)


@functools.cache
def _compiled_flex() -> Callable:
    """flex_attention through torch.compile (Inductor's fused Triton kernel); compiled on first call."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_function(device_type: str) -> Callable:
    """The FlexAttention entry point for tensors on `device_type`: compiled on cuda (the fused kernel
    users run), eager on cpu (the unfused reference path; the CPU has no backward either way)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if device_type == "cuda" else flex_attention


@dataclass
class FlexBackend(Backend):
    """torch.nn.attention.flex_attention: eager on the CPU, torch.compile'd on CUDA."""

    supports_gqa: bool = True  # enable_gqa

    def _available(self, device: str) -> Availability:
        if _module("torch.nn.attention.flex_attention") is None:
            return Availability(False, f"torch {torch.__version__} has no FlexAttention")
        return Availability(True)

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        flex = _module("torch.nn.attention.flex_attention")
        lq, lk = q.shape[-2], k.shape[-2]
        score_mod = None
        if mask is not None:
            add = mask.to(q.device)
            if add.dtype == torch.bool:
                add = torch.zeros_like(add, dtype=q.dtype).masked_fill(~add, -math.inf)
            add = add.to(q.dtype).expand(q.shape[0], q.shape[1], lq, lk)

            def score_mod(score, b, h, i, j):
                return score + add[b, h, i, j]

        block_mask = None
        if causal:

            def causal_mask(b, h, i, j):
                return j <= i + (lk - lq)  # bottom-right aligned

            block_mask = flex.create_block_mask(causal_mask, None, None, lq, lk, device=str(q.device))
        # compiled: a recompile beyond dynamo's limit of 8 (shapes, masks) would fall back to eager silently
        patch = torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True)
        with warnings.catch_warnings(), patch:
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            fn = flex_function(q.device.type)
            gqa = q.shape[1] != k.shape[1]
            return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    def backward_reason(self, device: str | None = None) -> str | None:
        if (device or self.default_device()) == "cpu":
            return "FlexAttention has no backward on the CPU (torch raises NotImplementedError)"
        return None


# Proofs on CUDA are kernel names: flash-attn 2's `flash::flash_fwd_kernel` / `flash_fwd_splitkv_kernel`
# (not PyTorch's vendored copy in namespace `pytorch_flash`), flash-attn 3's `flash::FlashAttnFwdSm90`,
# xformers' CUTLASS `fmha_cutlassF...` or the flash kernels it dispatches to, and Inductor's Triton template
# kernel for compiled FlexAttention (`triton_tem_fused_flex_attention_0`). Eager FlexAttention on the CPU
# records its autograd op (`FlexAttentionAutogradOp`).
def external_backends() -> list[Backend]:
    return [
        FlashAttnBackend(
            "flash-attn",
            "flash-attn 2 flash_attn_func (Ampere+ GPU)",
            proof={"cuda": (r"(?<!pytorch_)flash::flash_fwd",)},
            dtypes=(torch.bfloat16, torch.float16),
            devices=("cuda",),
            supports_mask=False,
        ),
        FlashAttnBackend(
            "flash-attn-3",
            "flash-attn 3 flash_attn_interface (Hopper GPU)",
            proof={"cuda": (r"flash::FlashAttnFwdSm90",)},
            dtypes=(torch.bfloat16, torch.float16, torch.float8_e4m3fn),
            devices=("cuda",),
            supports_mask=False,
            module="flash_attn_interface",
            min_arch=(9, 0),
        ),
        XformersBackend(
            "xformers",
            "xformers memory_efficient_attention",
            proof={"cuda": (r"^(?!aten::).*(fmha_cutlassF|flash_fwd|FlashAttnFwdSm90)",)},
            devices=("cuda",),
            supports_mask=False,
        ),
        FlexBackend(
            "flex",
            "torch FlexAttention: eager (unfused, no backward) on cpu, torch.compile'd on cuda",
            proof={"cpu": (r"^FlexAttention",), "cuda": (r"triton_tem_fused\w*flex_(attention|decoding)",)},
            dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
            cuda_dtypes=(torch.float32, torch.bfloat16, torch.float16),
        ),
    ]
