"""Deterministic training data: a seeded synthetic language, or any local text file at character level.
Batches are a pure function of (data seed, step), so a resumed run sees the same order."""

from __future__ import annotations

from pathlib import Path

import torch


class TokenStream:
    """A long token sequence [N] and batches of windows x, y [B, T] drawn by (seed, step)."""

    def __init__(self, tokens: torch.Tensor, vocab: int) -> None:
        if tokens.numel() < 2:
            raise ValueError("the data needs at least 2 tokens")
        self.tokens, self.vocab = tokens.long(), vocab

    def batch(self, step: int, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tokens.numel() <= seq_len + 1:
            raise ValueError(f"the data has {self.tokens.numel()} tokens; seq_len {seq_len} needs more")
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, self.tokens.numel() - seq_len - 1, (batch,), generator=g)
        idx = starts.unsqueeze(1) + torch.arange(seq_len + 1)
        win = self.tokens[idx]
        return win[:, :-1], win[:, 1:]


def synthetic(vocab: int = 64, length: int = 100_000, seed: int = 0) -> TokenStream:
    """A seeded order-2 Markov language with sparse, peaked transitions (learnable, not trivial)."""
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    cdf = torch.softmax(torch.randn(vocab, vocab, vocab, generator=g) * 3.0, dim=-1).cumsum(-1).numpy()
    u = torch.rand(length, generator=g).numpy()
    toks = np.empty(length, dtype=np.int64)
    toks[:2] = torch.randint(0, vocab, (2,), generator=g).numpy()
    for i in range(2, length):
        toks[i] = min(int(np.searchsorted(cdf[toks[i - 2], toks[i - 1]], u[i])), vocab - 1)
    return TokenStream(torch.from_numpy(toks), vocab)


def lookback(vocab: int = 64, length: int = 100_000, seed: int = 0, noise: float = 0.2) -> TokenStream:
    """A seeded skip-bigram language: x[t+1] = perm(x[t-1]) with probability 1 - noise, else uniform. The next token
    is (almost) independent of the current one, so a model without attention stays near log(vocab) nats; looking
    back one position (a positional attention head) takes it to the noise floor (lookback_floor)."""
    if not 0 <= noise <= 1:
        raise ValueError(f"noise={noise!r} is not allowed; it must lie in [0, 1]")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    noisy = torch.rand(length, generator=g) < noise
    uniform = torch.randint(0, vocab, (length,), generator=g)
    toks, pm, keep = uniform.tolist(), perm.tolist(), (~noisy).tolist()
    for i in range(2, length):  # a plain loop over 1e5 tokens: ~30 ms, once per run
        if keep[i]:
            toks[i] = pm[toks[i - 2]]
    return TokenStream(torch.tensor(toks, dtype=torch.long), vocab)


def text_file(path: str | Path) -> TokenStream:
    """Character-level tokens of a local UTF-8 text file (vocabulary = its sorted distinct characters)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"text file {str(p)!r} does not exist") from None
    except UnicodeDecodeError:
        raise ValueError(f"text file {str(p)!r} is not UTF-8 text") from None
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    return TokenStream(torch.tensor([lookup[c] for c in text], dtype=torch.long), len(chars))
