"""Attention kernels: the FP64 oracle, and the standard and Flash simulators under numerics policies."""

from flashcheck.kernels.flash import FlashConfig, flash_attention
from flashcheck.kernels.reference import reference_attention
from flashcheck.kernels.standard import standard_attention

SIMULATED_KERNELS = ("flash", "standard")


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
    """Run simulator `kernel` ("flash" or "standard") on [B, H, L, D] inputs; block options apply to flash."""
    if kernel == "standard":
        return standard_attention(q, k, v, policy=policy, causal=causal)
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
    "standard_attention",
]
