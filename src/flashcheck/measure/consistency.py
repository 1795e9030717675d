"""Consistency certificates: does one request get the same bits however the server runs it?

Four checks on a target f(q, k, v, causal) -> out (q [B, H, Lq, D], k, v [B, Hkv, Lk, D]; causal is bottom-right
aligned, so a decode step Lq = 1 sees the whole cache):
- determinism: the same batch `runs` times;
- batch: one request alone (batch 1) against the same request inside batches of 2 .. max_batch, at the first
  and the last slot, beside other random requests (two compositions per size);
- prefill-decode: row t of one causal prefill of L tokens against the decode step at KV length t + 1;
- chunked: the prefill computed chunk by chunk (queries c0 .. c1 against keys 0 .. c1) against one prefill.
Each certificate names the first run / batch size / KV length / position where bits differ and the largest
|difference| (0.0 and None when every bit agreed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
CHECKS = ("determinism", "batch", "prefill-decode", "chunked")


@dataclass(frozen=True, slots=True)
class Certificate:
    """One check's finding: `holds` (every compared bit equal), the first index that differed (what it counts
    is `unit`), the largest |difference| and how many comparisons were made."""

    check: str
    target: str
    holds: bool
    unit: str
    first: int | None
    max_abs: float
    compared: int
    differing: list[int] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def sentence(self) -> str:
        """The finding in words, e.g. 'prefill-decode: differs from KV length 97 on (max |diff| 0.0156)'."""
        if self.holds:
            return f"{self.check}: bit-identical over {self.compared} comparisons"
        return f"{self.check}: differs from {self.unit} {self.first} on (max |diff| {self.max_abs:.3g}; " \
               f"{len(self.differing)} of {self.compared} differ)"  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shape:
    """The request shape: heads, KV heads, head dim, decode KV length (batch, determinism) and prefill length."""

    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    kv_len: int = 512
    prefill_len: int = 160
    dtype: torch.dtype = torch.bfloat16


def _rand(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _request(sh: Shape, lq: int, lk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        _rand((1, sh.heads, lq, sh.head_dim), seed, sh.dtype),
        _rand((1, sh.kv_heads, lk, sh.head_dim), seed + 1, sh.dtype),
        _rand((1, sh.kv_heads, lk, sh.head_dim), seed + 2, sh.dtype),
    )


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in float64 (inf where one is NaN and the other is not); 0.0 when bit-identical."""
    if torch.equal(a.view(torch.int16) if a.dtype in (torch.bfloat16, torch.float16) else a,
                   b.view(torch.int16) if b.dtype in (torch.bfloat16, torch.float16) else b):  # fmt: skip
        return 0.0
    d = (a.to(torch.float64) - b.to(torch.float64)).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def _certify(check: str, target: str, unit: str, pairs: list[tuple[int, float]], note: str = "") -> Certificate:
    bad = sorted({i for i, d in pairs if d != 0.0})
    worst = max((d for _, d in pairs), default=0.0)
    return Certificate(check, target, not bad, unit, bad[0] if bad else None, worst, len(pairs), bad, note)


def determinism(f: AttentionFn, name: str, sh: Shape, *, runs: int = 5, batch: int = 4) -> Certificate:
    """The same decode batch `runs` times: run i (2 ..) against run 1."""
    q, k, v = (torch.cat(t) for t in zip(*(_request(sh, 1, sh.kv_len, 10 + 3 * i) for i in range(batch)), strict=True))
    first = f(q, k, v, True)
    pairs = [(i, _diff(first, f(q, k, v, True))) for i in range(2, runs + 1)]
    return _certify("determinism", name, "run", pairs)


def batch_invariance(f: AttentionFn, name: str, sh: Shape, *, max_batch: int = 16, lq: int = 1) -> Certificate:
    """Request 0 alone against request 0 at slot 0 and at the last slot of batches 2 .. max_batch (others random)."""
    req = _request(sh, lq, sh.kv_len, 0)
    alone = f(*req, True)
    pairs = []
    for b in range(2, max_batch + 1):
        diffs = []
        for slot, seed in ((0, 1000), (b - 1, 2000)):
            others = [_request(sh, lq, sh.kv_len, seed + 3 * i) for i in range(b - 1)]
            parts = [*others[:slot], req, *others[slot:]]
            q, k, v = (torch.cat(t) for t in zip(*parts, strict=True))
            diffs.append(_diff(alone[0], f(q, k, v, True)[slot]))
        pairs.append((b, max(diffs)))
    return _certify("batch", name, "batch size", pairs, note=f"decode, KV length {sh.kv_len}" if lq == 1 else "")


def prefill_decode(f: AttentionFn, name: str, sh: Shape) -> Certificate:
    """Row t of one causal prefill of prefill_len tokens against the decode step at KV length t + 1."""
    q, k, v = _request(sh, sh.prefill_len, sh.prefill_len, 7)
    full = f(q, k, v, True)
    pairs = []
    for t in range(sh.prefill_len):
        step = f(q[..., t : t + 1, :], k[..., : t + 1, :], v[..., : t + 1, :], True)
        pairs.append((t + 1, _diff(full[..., t, :], step[..., 0, :])))
    return _certify("prefill-decode", name, "KV length", pairs)


def chunked_prefill(f: AttentionFn, name: str, sh: Shape, *, chunk: int = 32) -> Certificate:
    """One causal prefill against the same prefill in chunks of `chunk` queries (each against keys 0 .. c1)."""
    q, k, v = _request(sh, sh.prefill_len, sh.prefill_len, 7)
    full = f(q, k, v, True)
    pairs = []
    for c0 in range(0, sh.prefill_len, chunk):
        c1 = min(sh.prefill_len, c0 + chunk)
        part = f(q[..., c0:c1, :], k[..., :c1, :], v[..., :c1, :], True)
        pairs.extend((c0 + i, _diff(full[..., c0 + i, :], part[..., i, :])) for i in range(c1 - c0))
    return _certify("chunked", name, "position", pairs, note=f"chunks of {chunk}")


def certify(f: AttentionFn, name: str, sh: Shape, *, checks: tuple[str, ...] = CHECKS, max_batch: int = 16,
            runs: int = 5, chunk: int = 32) -> list[Certificate]:  # fmt: skip
    """The certificates of `checks` (CHECKS) for target f."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; expected one of {', '.join(CHECKS)}")
    run = {
        "determinism": lambda: determinism(f, name, sh, runs=runs),
        "batch": lambda: batch_invariance(f, name, sh, max_batch=max_batch),
        "prefill-decode": lambda: prefill_decode(f, name, sh),
        "chunked": lambda: chunked_prefill(f, name, sh, chunk=chunk),
    }
    return [run[c]() for c in checks]
