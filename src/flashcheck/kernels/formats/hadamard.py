"""The Hadamard matrices of FlashAttention-3's incoherent processing (kernels.sim.fp8 rotates Q and K by them;
kernels.native.fp8's C rotation checks its matrix against them): a leaf module, so both import it."""

from __future__ import annotations

import torch


def hadamard_matrix(d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The Sylvester Hadamard matrix H [d, d] (entries +-1), d a power of two."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"Hadamard incoherent processing needs a power-of-two head dim; got {d}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def incoherence_matrix(d: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """M = diag(random +-1) H / sqrt(d) [d, d]: orthogonal, so (Q M)(K M)^T = Q K^T exactly."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=g).to(dtype) * 2 - 1
    return signs.unsqueeze(-1) * hadamard_matrix(d, dtype) / d**0.5
