"""Consistency certificates: does one request get the same bits however the server runs it?

Five checks on a target f(q, k, v, causal) -> out (q [B, H, Lq, D], k, v [B, Hkv, Lk, D]; causal is bottom-right
aligned, so a decode step Lq = 1 sees the whole cache); each names the phase it covers (PHASES):
- determinism (decode): the same batch `runs` times;
- batch (decode): one request alone (batch 1) against the same request inside batches of 2 .. max_batch, at the
  first and the last slot, beside other random requests (two compositions per size);
- batch-prefill (prefill): one causal prefill (Lq = Lk = L) alone against the same prefill inside batches of 2 and
  4, at the first and the last slot, beside prefills of the same length (uniform) and of other lengths (ragged:
  every request right-padded with random tokens to the longest; under a causal mask with Lq = Lk, row i < L sees
  keys 0 .. i only, so the padding is invisible to the request's rows), for L at tile boundaries (PREFILL_LENGTHS
  up to the prefill length, and the prefill length itself);
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
CHECKS = ("determinism", "batch", "batch-prefill", "prefill-decode", "chunked")
PHASES = {"determinism": "decode", "batch": "decode", "batch-prefill": "prefill", "prefill-decode": "prefill vs decode",
          "chunked": "prefill"}  # fmt: skip
# query/key tile edges of the kernels flashcheck models (64, 128; FA3's 176 / 192 tiles; the CPU flash kernel's 32)
PREFILL_LENGTHS = (31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193)
PREFILL_BATCHES = (2, 4)


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

    @property
    def phase(self) -> str:
        """Which phase of serving the certificate covers: decode, prefill, or prefill vs decode."""
        return PHASES.get(self.check, "")

    def to_dict(self) -> dict:
        return asdict(self) | {"phase": self.phase}

    def sentence(self) -> str:
        """The finding in words, e.g. 'prefill-decode: differs from KV length 97 on (max |diff| 0.0156)'."""
        if self.holds:
            return f"{self.check}: bit-identical over {self.compared} comparisons"
        if self.check == "batch-prefill":  # lengths are not an order in which a difference persists
            at = ", ".join(map(str, self.differing))
            return f"{self.check}: differs at {self.unit} {at} (max |diff| {self.max_abs:.3g}; " \
                   f"{len(self.differing)} of {self.compared} lengths differ)"  # fmt: skip
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


def prefill_lengths(prefill_len: int) -> list[int]:
    """The tile-boundary lengths up to prefill_len, and prefill_len itself."""
    return sorted({n for n in PREFILL_LENGTHS if n <= prefill_len} | {prefill_len})


def _padded(req: tuple, length: int, seed: int) -> tuple:
    """A causal prefill request (Lq = Lk) right-padded to `length` tokens with random ones."""
    n = req[0].shape[-2]
    if n == length:
        return req
    fill = _request(Shape(req[0].shape[1], req[1].shape[1], req[0].shape[-1], dtype=req[0].dtype), length - n,
                    length - n, seed)  # fmt: skip
    return tuple(torch.cat([t, x], dim=-2) for t, x in zip(req, fill, strict=True))


def batch_invariance_prefill(f: AttentionFn, name: str, sh: Shape, *, batches: tuple[int, ...] = PREFILL_BATCHES,
                             lengths: list[int] | None = None) -> Certificate:  # fmt: skip
    """Each prefill length L: request 0 alone against it at the first and last slot of batches of each size,
    beside prefills of length L (uniform) and of the other lengths (ragged, right-padded): rows 0 .. L - 1."""
    lengths = lengths or prefill_lengths(sh.prefill_len)
    pairs = []
    for i, n in enumerate(lengths):
        req = _request(sh, n, n, 0)
        alone = f(*req, True)[0]
        diffs = []
        for b in batches:
            for ragged in (False, True):
                sizes = [lengths[(i + j + 1) % len(lengths)] if ragged else n for j in range(b - 1)]
                others = [_request(sh, m, m, 3000 + 3 * j) for j, m in enumerate(sizes)]
                top = max([n, *sizes])
                for slot in (0, b - 1):
                    parts = [*others[:slot], req, *others[slot:]]
                    q, k, v = (torch.cat(t) for t in zip(*(_padded(p, top, 9000 + j) for j, p in enumerate(parts)),
                                                         strict=True))  # fmt: skip
                    diffs.append(_diff(alone, f(q, k, v, True)[slot][..., :n, :]))
        pairs.append((n, max(diffs)))
    sizes, lens = ", ".join(map(str, batches)), ", ".join(map(str, lengths))
    note = f"prefill lengths {lens}; batches of {sizes}, uniform and ragged"
    return _certify("batch-prefill", name, "prefill length", pairs, note=note)


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
        "batch-prefill": lambda: batch_invariance_prefill(f, name, sh),
        "prefill-decode": lambda: prefill_decode(f, name, sh),
        "chunked": lambda: chunked_prefill(f, name, sh, chunk=chunk),
    }
    return [run[c]() for c in checks]
