"""What each implementation returns on a padded batch's rows that see no key (NaN, zeros, other): a result.

The batch: B = 3 sequences of `seq_len` tokens (self-attention, Lq = Lk), lengths [L, L - pad, 0], padded on
the left or right; with grouped-query K/V heads. Rows with no visible key: every row of the empty sequence,
and with left padding and a causal mask the padded rows of the second. Errors against the FP64 reference
count only the query rows that are real tokens (padded positions excluded, as the peers do).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from flashcheck.core.inputs import InputSpec, make_grad, make_qkv
from flashcheck.core.metrics import rel_l2
from flashcheck.core.numerics import info, parse_format
from flashcheck.kernels import flash_attention, reference_attention, split_kv_attention, standard_attention
from flashcheck.kernels.sim.masks import key_padding_mask, rows_with_keys

OUTCOMES = ("nan", "zeros", "other")
MASK_STYLES = ("bool", "min")  # bool True = keep; "min": additive, finfo(dtype).min at padding (as HF builds it)


@dataclass(frozen=True, slots=True)
class PaddedOutcome:
    """One implementation on the padded batch. `outcome` on the rows with no visible key (nan / zeros /
    other; "" unless status is "ok"); `grad` whether the gradients stayed finite ("finite", "nan", or
    "n/a"); `rel_l2` the error on real-token rows against the FP64 reference; `reason` why skipped/failed."""

    name: str
    status: str
    outcome: str = ""
    grad: str = "n/a"
    max_abs_dead: float = math.nan
    rel_l2: float = math.nan
    reason: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """q [3, H, L, D], k/v [3, Hkv, L, D] float64; key_mask bool [3, 1, 1, L]; `real` bool [3, 1, L, 1]
    (query rows that are real tokens); `dead` bool [3, 1, L, 1] (rows that see no key)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    key_mask: torch.Tensor
    real: torch.Tensor
    dead: torch.Tensor
    causal: bool


def padded_batch(
    *, seq_len: int = 16, pad: int = 5, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
    side: str = "left", causal: bool = True, seed: int = 0,
) -> PaddedBatch:  # fmt: skip
    """The batch of the module docstring (lengths [seq_len, seq_len - pad, 0])."""
    if not 0 < pad < seq_len:
        raise ValueError(f"pad={pad!r} must be in [1, seq_len - 1] = [1, {seq_len - 1}]")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads!r} must divide heads={heads}")
    q, k, v = make_qkv(InputSpec(batch=3, heads=heads, seq_len=seq_len, head_dim=head_dim, seed=seed))
    k, v = k[:, :kv_heads].contiguous(), v[:, :kv_heads].contiguous()
    keep = key_padding_mask([seq_len, seq_len - pad, 0], seq_len, side=side)
    real = keep.transpose(-1, -2)
    seen = torch.broadcast_to(rows_with_keys(seq_len, seq_len, causal=causal, mask=keep), real.shape)
    return PaddedBatch(q, k, v, keep, real & seen, ~seen, causal)


def classify(rows: torch.Tensor) -> str:
    """nan if any value is NaN, zeros if every value is exactly 0, else other."""
    if bool(torch.isnan(rows).any()):
        return "nan"
    return "zeros" if bool((rows == 0).all()) else "other"


def _implementations(fmt: str, device: str) -> list[tuple[str, object, str | None, bool]]:
    """(name, fn(q, k, v, mask, causal) -> out, why it cannot run or None, whether it has a backward)."""
    pol = f"{fmt}-mixed"
    sims = [
        ("reference:fp64", lambda q, k, v, m, c: reference_attention(q, k, v, mask=m, causal=c), None, True),
        (
            "standard:" + pol,
            lambda q, k, v, m, c: standard_attention(q, k, v, policy=pol, mask=m, causal=c),
            None,
            True,
        ),
        (
            "flash:" + pol,
            lambda q, k, v, m, c: flash_attention(q, k, v, policy=pol, mask=m, causal=c, block_k=8),
            None,
            True,
        ),
        (
            "splitkv:" + pol,
            lambda q, k, v, m, c: split_kv_attention(q, k, v, policy=pol, mask=m, causal=c, block_k=4, splits=3),
            None,
            False,
        ),
    ]
    from flashcheck.backends import all_backends

    dtype = info(fmt).dtype
    out = []
    for b in all_backends():
        if b.name.startswith("sim-"):
            continue  # the simulators above
        avail = b.available(dtype, device)
        why = None if avail.ok else avail.reason
        if why is None and not b.supports_mask:
            why = "takes no padding mask (its variable-length API is not wrapped)"
        out.append((f"{b.name}:{fmt}", _backend_fn(b, device), why, b.backward_reason(device) is None))
    return sims + out


def _backend_fn(b, device: str):
    return lambda q, k, v, m, c: b.run(q, k, v, device=device, causal=c, mask=m)


def padding_mask_as(keep: torch.Tensor, style: str, fmt: str) -> torch.Tensor:
    """The key-padding mask `keep` (bool) in `style` (MASK_STYLES); "min" is float64 holding FMT's finfo.min."""
    if style not in MASK_STYLES:
        raise ValueError(f"unknown mask style {style!r}; expected one of {', '.join(MASK_STYLES)}")
    if style == "bool":
        return keep
    low = torch.finfo(info(fmt).dtype).min
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, low)


def padded_row_outcomes(
    *, fmt: str = "bf16", device: str = "cpu", backward: bool = True, mask_style: str = "bool", **batch_options
) -> list[PaddedOutcome]:
    """Run the FP64 reference, the simulators (standard, flash, splitkv under FMT-mixed) and every real
    backend at FMT on `device` on padded_batch(**batch_options) with its padding mask in `mask_style`; one
    PaddedOutcome each (a backend that cannot run here is "skipped" with the reason; one that raises is
    "failed" with the error). Errors are against the FP64 reference with the bool mask."""
    fmt = parse_format(fmt).value
    pb = padded_batch(**batch_options)
    mask = padding_mask_as(pb.key_mask, mask_style, fmt)
    ref = reference_attention(pb.q, pb.k, pb.v, mask=pb.key_mask, causal=pb.causal)
    do = make_grad(ref.shape, 1) * pb.real  # the loss ignores padded rows
    rows = []
    for name, fn, why, has_backward in _implementations(fmt, device):
        if why is not None:
            rows.append(PaddedOutcome(name, "skipped", reason=why))
            continue
        try:
            rows.append(_measure(name, fn, pb, mask, ref, do if backward and has_backward else None, fmt))
        except Exception as exc:  # a failure on padded rows is a reported result
            rows.append(PaddedOutcome(name, "failed", reason=f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def _measure(name: str, fn, pb: PaddedBatch, mask, ref, do: torch.Tensor | None, fmt: str) -> PaddedOutcome:
    native = name.split(":")[0] not in ("reference", "standard", "flash", "splitkv")
    dtype = info(fmt).dtype if native else torch.float64
    q, k, v = (t.to(dtype) if native else t.clone() for t in (pb.q, pb.k, pb.v))
    grad_ok = do is not None
    for t in (q, k, v):
        t.requires_grad_(grad_ok)
    with torch.set_grad_enabled(grad_ok):
        out = fn(q, k, v, mask, pb.causal)
    dead = out.detach().double()[torch.broadcast_to(pb.dead, out.shape)]
    grad = "n/a"
    if grad_ok:
        out.backward(do.to(out.dtype))
        grad = "nan" if any(bool(torch.isnan(t.grad).any()) for t in (q, k, v)) else "finite"
    err = rel_l2(out.detach(), ref, mask=pb.real)
    dead_max = float(dead.abs().max()) if dead.numel() else math.nan
    return PaddedOutcome(name, "ok", classify(dead), grad, dead_max, err)


def outcome_table(rows: list[PaddedOutcome]) -> list[str]:
    """Plain-text lines, one per implementation: name, what its no-key rows hold, gradients, error."""
    lines = [f"{'implementation':<24} {'no-key rows':<12} {'gradients':<10} {'rel_l2 (real rows)':<18}"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"{r.name:<24} {r.status}: {r.reason}")
            continue
        lines.append(f"{r.name:<24} {r.outcome:<12} {r.grad:<10} {r.rel_l2:<18.3e}")
    return lines
