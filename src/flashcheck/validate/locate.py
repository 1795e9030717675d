"""Where a model diverges: the first layer, the head and the token positions where an attention implementation
leaves its budget, from per-head attention outputs captured through hooks.

Each layer's attention output projection (o_proj, out_proj, c_proj, BERT's attention.output.dense) receives the
heads' outputs side by side, [B, L, H * Dh]; a forward pre-hook records that input. The same batch runs through
the same model twice, under eager and under the implementation, so that the heads see the same inputs up to the
first divergence. Per layer, each head's error is max |impl - eager| over its Dh values, at valid tokens; a
head leaves its budget where that error passes k times the larger of the layer's typical head error (the
median over heads: the implementation's ordinary deviation at that layer) and the rounding floor of the dtype
(the peers' 2 max |(r + 0.3 - 0.3) - r|, times sqrt(L): rounding over a softmax sum and P V of L terms grows as
a random walk), or where it is NaN / Inf while eager's is finite."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from flashcheck.core.budget import rounding_floor

OUT_PROJECTION = re.compile(r"(^|\.)(o_proj|out_proj|c_proj|attention\.output\.dense)$")


@dataclass(frozen=True, slots=True)
class Where:
    """The first place out of budget: layer (1-based block), head (0-based), tokens (first, last) and what."""

    layer: int
    head: int
    tokens: tuple[int, int]
    what: str  # "NaN", "Inf" or "max |diff| 0.31 > bound 0.004"

    def __str__(self) -> str:
        a, b = self.tokens
        span = f"token {a}" if a == b else f"tokens {a}-{b}"
        return f"layer {self.layer}, head {self.head}, {span}, {self.what}"

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "head": self.head,
            "tokens": list(self.tokens),
            "what": self.what,
            "text": str(self),
        }


def projections(model) -> list[torch.nn.Module]:
    """Each layer's attention output projection, in layer order."""
    return [m for name, m in model.named_modules() if OUT_PROJECTION.search(name)]


@contextmanager
def captured(model):
    """Yield a list that receives each output projection's input [B, L, H * Dh] (float64, CPU) per call."""
    seen: list[torch.Tensor] = []
    hooks = [p.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().double().cpu()))
             for p in projections(model)]  # fmt: skip
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def head_outputs(model, batch, device: str, heads: int) -> list[torch.Tensor]:
    """[B, L, H, Dh] per layer for `batch` under the model's current attention implementation."""
    from flashcheck.validate.forward import run_batch

    with captured(model) as seen:
        run_batch(model, batch, device)
    return [t.view(*t.shape[:2], heads, -1) for t in seen]


def first_divergence(cand: list, ref: list, valid: torch.Tensor, k: float, dtype: torch.dtype) -> Where | None:
    """The first layer, head and tokens where `cand` leaves the budget against `ref` ([B, L, H, Dh] per layer;
    valid [B, L] bool); None where every head of every layer keeps within it."""
    for layer, (a, r) in enumerate(zip(cand, ref, strict=False), 1):
        bad_nf = ~torch.isfinite(a) & torch.isfinite(r)
        err = torch.nan_to_num((a - r).abs(), nan=torch.inf).amax(dim=-1)  # [B, L, H]
        err = err.masked_fill(~valid[..., None], 0.0)
        per_head = err.amax(dim=(0, 1))
        typical = float(per_head[torch.isfinite(per_head)].median()) if bool(torch.isfinite(per_head).any()) else 0.0
        floor = rounding_floor(r[valid], dtype) * math.sqrt(max(1, valid.shape[-1]))
        bound = k * max(typical, floor)
        out = err > bound
        if not bool(out.any()):
            continue
        head = int(per_head.argmax())
        tokens = out[..., head].any(dim=0).nonzero().flatten()
        nf = bad_nf[..., head, :].any(dim=-1) & valid
        what = ("NaN" if bool(torch.isnan(a[..., head, :][nf]).any()) else "Inf") if bool(nf.any()) else (
            f"max |diff| {float(per_head[head]):.3g} > bound {bound:.3g}")  # fmt: skip
        return Where(layer, head, (int(tokens[0]), int(tokens[-1])), what)
    return None


def locate(model, impl: str, batch, device: str, k: float, dtype: torch.dtype) -> Where | None:
    """Run `batch` under eager and under `impl` on `model` (left under `impl`) and find the first divergence."""
    from flashcheck.validate.loading import switch_impl

    heads = int(model.config.num_attention_heads)
    if not projections(model) or switch_impl(model, "eager"):
        return None
    ref = head_outputs(model, batch, device, heads)
    if switch_impl(model, impl):
        return None
    cand = head_outputs(model, batch, device, heads)
    return first_divergence(cand, ref, batch.mask.bool().cpu(), k, dtype)
