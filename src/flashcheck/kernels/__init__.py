"""Attention kernels: the FP64 oracle, and the standard, Flash and split-KV simulators under numerics policies."""

from flashcheck.kernels.sim.decode import split_kv_attention
from flashcheck.kernels.sim.flash import FlashConfig, flash_attention
from flashcheck.kernels.sim.presets_modern import MODERN_PRESETS as _MODERN  # noqa: F401  (registers their policy names)
from flashcheck.kernels.sim.reference import reference_attention
from flashcheck.kernels.sim.standard import standard_attention

SIMULATED_KERNELS = ("flash", "standard", "splitkv")


def simulate(
    kernel: str,
    q,
    k,
    v,
    *,
    policy,
    causal: bool = False,
    block_q: int = 128,
    block_k: int = 128,
    algorithm: str = "fa2",
    **flash_options,
):
    """Run simulator `kernel` ("flash", "standard" or "splitkv") on [B, H, L, D] inputs; block options apply
    to flash and splitkv (which also takes `splits`, and runs forward only)."""
    if kernel == "standard":
        return standard_attention(q, k, v, policy=policy, causal=causal)
    if kernel == "splitkv":
        return split_kv_attention(
            q, k, v, policy=policy, block_q=block_q, block_k=block_k, algorithm=algorithm, causal=causal,
            **flash_options,
        )  # fmt: skip
    if kernel == "flash":
        return flash_attention(
            q,
            k,
            v,
            policy=policy,
            block_q=block_q,
            block_k=block_k,
            algorithm=algorithm,
            causal=causal,
            **flash_options,
        )
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(SIMULATED_KERNELS)}")


__all__ = [
    "SIMULATED_KERNELS",
    "FlashConfig",
    "flash_attention",
    "reference_attention",
    "simulate",
    "split_kv_attention",
    "standard_attention",
]
