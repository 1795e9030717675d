"""A small GPT (nanoGPT-sized) whose attention is pluggable: a simulator under a policy, or a real backend.

Shapes: idx [B, T] token ids -> logits [B, T, V]; attention sees q, k, v [B, H, T, Dh]."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True, kw_only=True)
class GPTConfig:
    vocab: int = 64
    seq_len: int = 128
    layers: int = 2
    heads: int = 4
    dim: int = 128


def make_attention(spec: str, block: int = 32) -> AttentionFn:
    """Causal attention from a spec: "flash:POLICY", "standard:POLICY" (simulators; e.g. flash:bf16-mixed),
    "sagebwd" (SageBwd-like 8-bit attention, forward and backward: kernels.sim.sagebwd), "none" (each position
    sees only itself: no look-back, the attention-free control), or a backend name
    (sdpa-math, sdpa-flash, eager, ...). Output in q's dtype."""
    kind, _, policy = spec.partition(":")
    if spec == "none":  # each position attends to itself only: an attention-free control with the same weights
        return lambda q, k, v: v
    if spec == "sagebwd":
        from flashcheck.kernels.sim.sagebwd import sagebwd_attention

        return lambda q, k, v: sagebwd_attention(q, k, v, causal=True).to(q.dtype)
    if kind == "flash":
        from flashcheck.kernels import flash_attention

        return lambda q, k, v: flash_attention(
            q, k, v, policy=policy or "fp32", block_q=block, block_k=block, causal=True
        ).to(q.dtype)
    if kind == "standard":
        from flashcheck.kernels import standard_attention

        return lambda q, k, v: standard_attention(q, k, v, policy=policy or "fp32", causal=True).to(q.dtype)
    from flashcheck.backends import get_backend

    backend = get_backend(spec)
    avail = backend.available()
    if not avail.ok:
        raise ValueError(f"attention backend {spec!r} cannot run here: {avail.reason}")
    return lambda q, k, v: backend.forward(q, k, v, causal=True)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: AttentionFn) -> None:
        super().__init__()
        self.heads, self.attention = cfg.heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.qkv, self.proj = nn.Linear(cfg.dim, 3 * cfg.dim), nn.Linear(cfg.dim, cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = self.attention(q, k, v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: AttentionFn) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.ln, self.head = nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 1))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss
