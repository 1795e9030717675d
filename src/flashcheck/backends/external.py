"""Adapters for packages that may be missing: flash-attn (FA2), flash-attn 3, xformers, FlexAttention."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

import torch

from flashcheck.backends.base import Availability, Backend, cuda_capability


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

    def _available(self) -> Availability:
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
    def _available(self) -> Availability:
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
        out = xops.memory_efficient_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, scale=scale
        )
        return out.transpose(1, 2)


@dataclass
class FlexBackend(Backend):
    """torch.nn.attention.flex_attention (eager on CPU here; compiled on CUDA)."""

    def _available(self) -> Availability:
        if _module("torch.nn.attention.flex_attention") is None:
            return Availability(False, f"torch {torch.__version__} has no FlexAttention")
        return Availability(True)

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        flex = _module("torch.nn.attention.flex_attention")
        offset = k.shape[-2] - q.shape[-2]
        score_mod = None
        if mask is not None:
            add = (
                mask
                if mask.dtype != torch.bool
                else torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            )
            add = add.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])

            def score_mod(score, b, h, i, j):
                return score + add[b, h, i, j]

        block_mask = None
        if causal:

            def causal_mask(b, h, i, j):
                return j <= i + offset

            block_mask = flex.create_block_mask(causal_mask, None, None, q.shape[-2], k.shape[-2], device=str(q.device))
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    def backward_reason(self) -> str | None:
        return None if torch.cuda.is_available() else "FlexAttention has no backward on CPU"


def external_backends() -> list[Backend]:
    return [
        FlashAttnBackend(
            "flash-attn",
            "flash-attn 2 flash_attn_func (Ampere+ GPU)",
            ops=("flash_attn", "flash_fwd"),
            dtypes=(torch.bfloat16, torch.float16),
            needs_cuda=True,
            supports_mask=False,
        ),
        FlashAttnBackend(
            "flash-attn-3",
            "flash-attn 3 flash_attn_interface (Hopper GPU)",
            ops=("flash_attn", "flash_fwd"),
            dtypes=(torch.bfloat16, torch.float16, torch.float8_e4m3fn),
            needs_cuda=True,
            supports_mask=False,
            module="flash_attn_interface",
            min_arch=(9, 0),
        ),
        XformersBackend(
            "xformers",
            "xformers memory_efficient_attention",
            ops=("fmha", "efficient_attention"),
            needs_cuda=True,
            supports_mask=False,
        ),
        FlexBackend(
            "flex",
            "torch FlexAttention (unfused eager path on CPU)",
            ops=("FlexAttention", "flex_attention"),
            dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
        ),
    ]
