"""KV-cache formats of serving stacks: what a key or value is after the cache has stored and dequantised it.

Shapes: k, v, q [B, H, L, D]. Every quantiser returns the dequantised tensor (stored value times its scale) in
float64, so that the exact attention of the same cache is a plain FP64 softmax over it.

Schemes (`KV_SCHEMES`) and their sources:
- `bf16`, `fp16`: the 16-bit cache (rounding only).
- `fp8`: e4m3 with one k_scale and one v_scale per tensor (vLLM `--kv-cache-dtype fp8`): stored e4m3(x / s),
  saturating at +-448 (vLLM's scaled_fp8_conversion clamps before the cast), read back as e4m3 * s. The scale
  comes from `scale` (SCALE_MODES): `static` 1.0 (vLLM's default when the checkpoint has none), `calc`
  vLLM's on-the-fly calibration `calc_kv_scales` (amax(|k|) / K_SCALE_CONSTANT = 200, amax(|v|) / 100, amax(|q|)
  / 200, vllm/attention/layer.py and vllm/envs.py), `amax` a checkpoint calibrated to the format's range
  (amax / 448, as llm-compressor and ModelOpt write k_scale).
- `fp8-head`, `fp8-token`: e4m3 with one amax / 448 scale per head (over B, L, D) or per token and head (over D).
- `fp4`: SGLang's fp4_e2m1 KV cache (sglang python/sglang/srt/layers/quantization/kvfp4_tensor.py,
  FP4MXBlock16KVQuantizeUtil, commit 0dae407b): blocks of 16 along D, each with a power-of-two scale
  2^ceil(log2(amax_block / 6)) (so no element exceeds 6), elements rounded to e2m1 by the midpoints with ties
  *away from zero* (a value on a midpoint takes the larger magnitude), not ties-to-even.
- `nvfp4`: NVFP4 (core.quant.quantize_nvfp4: e2m1 in blocks of 16, e4m3 block scale, fp32 tensor scale).
- `fp8k-nvfp4v`: FP8 keys (per tensor, as `fp8`) with NVFP4 values (vLLM's mixed KV test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.core.quant import quantize_nvfp4

KV_SCHEMES = ("bf16", "fp16", "fp8", "fp8-head", "fp8-token", "fp4", "nvfp4", "fp8k-nvfp4v")
SCALE_MODES = ("static", "calc", "amax")
FP8_MAX = 448.0
E2M1_MAX = 6.0
VLLM_SCALE_CONSTANT = {"q": 200.0, "k": 200.0, "v": 100.0}  # vllm/envs.py Q_/K_/V_SCALE_CONSTANT
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True, slots=True)
class KVCacheFormat:
    """A KV cache: `scheme` (KV_SCHEMES) and, for the per-tensor FP8 keys/values, `scale` (SCALE_MODES)."""

    scheme: str = "fp8"
    scale: str = "static"

    def __post_init__(self) -> None:
        if self.scheme not in KV_SCHEMES:
            raise ValueError(f"unknown KV-cache scheme {self.scheme!r}; expected one of {', '.join(KV_SCHEMES)}")
        if self.scale not in SCALE_MODES:
            raise ValueError(f"unknown KV scale {self.scale!r}; expected one of {', '.join(SCALE_MODES)}")

    @property
    def name(self) -> str:
        return self.scheme if self.scheme not in ("fp8", "fp8k-nvfp4v") else f"{self.scheme}/{self.scale}"

    @property
    def is_fp8_attention(self) -> bool:
        """Whether the attention itself runs in FP8 (Q quantised too, FA3's FP8 path): e4m3 keys."""
        return self.scheme.startswith("fp8")


def parse_kv_format(spec: str | KVCacheFormat) -> KVCacheFormat:
    """'fp8', 'fp8/calc', 'fp4', ... -> KVCacheFormat; ValueError names what is allowed."""
    if isinstance(spec, KVCacheFormat):
        return spec
    scheme, _, scale = str(spec).partition("/")
    return KVCacheFormat(scheme, scale or "static")


def round_fp(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x (float64) rounded once to fmt, in float64: through float32 when every value is an fp32 number (one
    rounding either way, and torch's float32 casts are fast), else core.numerics' exact float64 rounding."""
    x32 = x.to(torch.float32)
    if torch.equal(x32.to(torch.float64), x):
        return round_to(x32, fmt).to(torch.float64)
    return round_to(x, fmt)


def tensor_scale(x: torch.Tensor, mode: str, which: str) -> float:
    """The per-tensor scale of x for `mode`: static 1.0; calc amax / vLLM's constant for `which` (q, k, v);
    amax amax / 448. An all-zero tensor gets 1.0."""
    if mode == "static":
        return 1.0
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    if amax == 0.0 or not math.isfinite(amax):
        return 1.0
    return amax / (VLLM_SCALE_CONSTANT[which] if mode == "calc" else FP8_MAX)


def quantize_fp8(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """e4m3(x / scale) * scale in float64 (saturating at +-448); `scale` a number or a tensor broadcasting to x."""
    x64 = x.detach().to(torch.float64)
    s = torch.as_tensor(scale, dtype=torch.float64, device=x.device)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return round_fp(x64 / s, Format.FP8_E4M3) * s


def fp8_grouped(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """e4m3 with amax / 448 scales per head (`head`: over B, L, D) or per token and head (`token`: over D)."""
    dims = (0, 2, 3) if granularity == "head" else (-1,)
    amax = x.detach().to(torch.float64).abs().amax(dim=dims, keepdim=True)
    return quantize_fp8(x, torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)))


def round_e2m1_away(x: torch.Tensor) -> torch.Tensor:
    """x (already scaled into [-6, 6]) to the nearest e2m1 value, ties away from zero (SGLang's bound test)."""
    grid = torch.tensor(E2M1_GRID, dtype=x.dtype, device=x.device)
    bounds = (grid[1:] + grid[:-1]) / 2
    idx = (x.abs().unsqueeze(-1) >= bounds).sum(dim=-1)
    return torch.sign(x) * grid[idx]


def quantize_fp4_block16(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """SGLang's fp4_e2m1 KV cache (see the module docstring): blocks of `block` along D. x [..., D], D % block == 0."""
    d = x.shape[-1]
    if d % block:
        raise ValueError(f"fp4 KV cache needs head_dim divisible by {block}; got {d}")
    xb = x.detach().to(torch.float32).reshape(*x.shape[:-1], d // block, block)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / E2M1_MAX, min=1e-10))))
    out = round_e2m1_away(xb / scale) * scale
    return out.reshape(x.shape).to(torch.float64)


def quantize_cache(
    x: torch.Tensor, scheme: str, scale_mode: str, which: str, scale: float | None = None
) -> torch.Tensor:
    """One cache tensor (`which`: k or v) as the scheme stores and reads it, in float64; `scale` fixes the
    per-tensor FP8 scale (one calibrated earlier) instead of computing it from x."""
    if scheme in ("bf16", "fp16"):
        return round_to(x.detach().to(torch.float32), Format(scheme)).to(torch.float64)
    if scheme in ("fp8-head", "fp8-token"):
        return fp8_grouped(x, scheme.removeprefix("fp8-"))
    if scheme == "fp4":
        return quantize_fp4_block16(x)
    if scheme == "nvfp4" or (scheme == "fp8k-nvfp4v" and which == "v"):
        return quantize_nvfp4(x.detach().to(torch.float32)).to(torch.float64)
    return quantize_fp8(x, tensor_scale(x, scale_mode, which) if scale is None else scale)


def quantize_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: KVCacheFormat | str, scales: dict[str, float] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """Q, K, V as the attention sees them with KV cache `fmt`, in float64, and the per-tensor scales used.

    K and V are stored and dequantised; Q is quantised to e4m3 too where the attention runs in FP8 (FA3's FP8
    path: q_scale as k_scale's mode, vLLM's query quantisation), else rounded to bf16 like the 16-bit model."""
    fmt = parse_kv_format(fmt)
    kq = quantize_cache(k, fmt.scheme, fmt.scale, "k")
    vq = quantize_cache(v, fmt.scheme, fmt.scale, "v")
    scales = {w: tensor_scale(t, fmt.scale, w) for w, t in (("q", q), ("k", k), ("v", v))}
    if fmt.is_fp8_attention:
        qq = quantize_fp8(q, scales["q"])
    else:
        qq = round_to(q.detach().to(torch.float32), Format.BF16).to(torch.float64)
    return qq, kq, vq, scales
