"""Where a model diverges: the first layer, head and token positions where an attention implementation leaves
its budget, forward (the heads' outputs) and backward (dQ, dK, dV per head).

The attention function is hooked where transformers dispatches it (`ALL_ATTENTION_FUNCTIONS.get_interface`,
which every modeling file calls with its eager function as the default), so no module or projection name is
assumed. The batch runs once under eager and once under the implementation, recording per call (= per layer, in
order) the function, the module, Q/K/V [B, H(kv), L, D], the mask and the keyword arguments. Each layer is then
judged in isolation: eager's function and the implementation's run on eager's Q/K/V (each with its own mask
format), so an upstream divergence cannot hide or fake a downstream one; forward, the outputs [B, L, H, D];
backward, dQ, dK, dV for one seeded upstream gradient dO (zero on padded queries), through autograd.

Budget per layer and tensor: a head leaves it where its error (max |impl - eager| over its D values, at valid
tokens) passes k times the larger of the layer's typical head error (the median over heads: the
implementation's ordinary deviation there) and the dtype's rounding floor (the peers' 2 max |(r + 0.3 - 0.3) -
r|, times sqrt(L): rounding over a softmax sum and P V of L terms grows as a random walk), or where it is NaN /
Inf while eager's is finite. A model whose attention does not go through that dispatch falls back to forward
pre-hooks on the output projections (o_proj, out_proj, c_proj, attention.output.dense, dense, wo); a model with
neither raises LayoutUnknown, so that the report says so instead of "no divergence"."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from flashcheck.core.budget import rounding_floor

OUT_PROJECTION = re.compile(
    r"(^|\.)(attn|attention|self_attn|self_attention)\.(o_proj|out_proj|c_proj|dense|wo|output\.dense)$"
)
GRADS = ("dQ", "dK", "dV")


class LayoutUnknown(ValueError):
    """The model's attention was not seen: neither transformers' dispatch nor an output projection ran."""


@dataclass(frozen=True, slots=True)
class Where:
    """The first place out of budget: layer (1-based block), head (0-based; a K/V head for dK, dV), tokens
    (first, last) and what ("output NaN", "dQ Inf", "dV max |diff| 0.31 > bound 0.004")."""

    layer: int
    head: int
    tokens: tuple[int, int]
    what: str

    def __str__(self) -> str:
        a, b = self.tokens
        span = f"token {a}" if a == b else f"tokens {a}-{b}"
        return f"layer {self.layer}, head {self.head}, {span}, {self.what}"

    def to_dict(self) -> dict:
        return {"layer": self.layer, "head": self.head, "tokens": list(self.tokens), "what": self.what,
                "text": str(self)}  # fmt: skip


@dataclass(slots=True)
class Located:
    """What locate found: the forward and the backward divergence (None: within budget) and notes."""

    forward: Where | None = None
    backward: Where | None = None
    notes: list[str] = field(default_factory=list)
    via: str = "attention dispatch"

    @property
    def backward_nonfinite(self) -> bool:
        return self.backward is not None and self.backward.what.split()[-1] in ("NaN", "Inf")

    def text(self) -> str:
        found = [str(w) + (" (backward)" if w is self.backward else "") for w in (self.forward, self.backward) if w]
        if found:
            return "; ".join(found)
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"no attention head leaves its budget on the probe batch{notes}"

    def to_dict(self) -> dict:
        d = self.forward.to_dict() if self.forward else {"layer": None, "head": None, "tokens": None, "what": None}
        d |= {"text": self.text(), "forward": self.forward and self.forward.to_dict(), "via": self.via}
        d |= {"backward": self.backward and self.backward.to_dict(), "backward_nonfinite": self.backward_nonfinite}
        return d | {"notes": list(self.notes)}


@dataclass(slots=True)
class Call:
    """One call of an attention function: fn(module, query, key, value, attention_mask, **kwargs)."""

    fn: object
    module: torch.nn.Module
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    mask: torch.Tensor | None
    kwargs: dict


@contextmanager
def recorded():
    """Yield a list that receives a Call for every attention function transformers dispatches meanwhile."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as funcs

    calls: list[Call] = []
    dispatch = funcs.get_interface

    def get_interface(impl, default):
        fn = dispatch(impl, default)

        def record(module, query, key, value, attention_mask, *args, **kwargs):
            calls.append(Call(fn, module, (query, key, value), attention_mask, kwargs))
            return fn(module, query, key, value, attention_mask, *args, **kwargs)

        return record

    funcs.get_interface = get_interface  # an instance attribute: every modeling file holds this one object
    try:
        yield calls
    finally:
        del funcs.get_interface


def projections(model) -> list[torch.nn.Module]:
    """Each layer's attention output projection, in layer order (the fallback when no dispatch was seen)."""
    return [m for name, m in model.named_modules() if OUT_PROJECTION.search(name)]


def _record(model, batch, device: str) -> list[Call]:
    """The attention calls of one forward pass of `batch`, their tensors made ordinary (not inference) ones."""
    from flashcheck.validate.forward import run_batch

    with recorded() as calls:
        run_batch(model, batch, device)
    for c in calls:  # run_batch runs under inference_mode: clone outside it so that autograd can use them
        c.qkv = tuple(t.clone() for t in c.qkv)
        c.mask = None if c.mask is None else c.mask.clone()
        c.kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in c.kwargs.items()}
    return calls


def _attend(call: Call, qkv, mask, grad_out: torch.Tensor | None):
    """call.fn on `qkv` with `mask`: the output [B, L, H, D] and, with grad_out, (dQ, dK, dV) [B, L, H(kv), D]
    (None where the function runs without autograd)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(grad_out is not None) for t in qkv]
        out = call.fn(call.module, *leaves, mask, **call.kwargs)[0]
        if grad_out is None or not out.requires_grad:
            return out.detach(), None
        grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype), allow_unused=True)
    return out.detach(), [None if g is None else g.transpose(1, 2) for g in grads]


def layer_divergence(a: torch.Tensor, r: torch.Tensor, valid: torch.Tensor, k: float, dtype: torch.dtype,
                     terms: float = 0.0):  # fmt: skip
    """(head, (first, last token), what) where `a` leaves the budget against `r` ([B, L, H, D]; valid [B, L]
    bool), or None. `terms`: the floor also holds eps(dtype) * terms * max |r| (the rounding of sums of that
    many terms at the tensor's scale)."""
    a, r = a.double().cpu(), r.double().cpu()
    bad_nf = ~torch.isfinite(a) & torch.isfinite(r)
    err = torch.nan_to_num((a - r).abs(), nan=torch.inf).amax(dim=-1)  # [B, L, H]
    err = err.masked_fill(~valid[..., None], 0.0)
    per_head = err.amax(dim=(0, 1))
    finite = per_head[torch.isfinite(per_head)]
    typical = float(finite.median()) if finite.numel() else 0.0
    floor = 0.0
    if bool(valid.any()):
        scale = float(torch.nan_to_num(r[valid], nan=0.0, posinf=0.0, neginf=0.0).abs().max())
        floor = max(
            rounding_floor(r[valid], dtype) * math.sqrt(valid.shape[-1]), torch.finfo(dtype).eps * terms * scale
        )
    bound = k * max(typical, floor)
    out = err > bound
    if not bool(out.any()):
        return None
    head = int(per_head.argmax())
    tokens = out[..., head].any(dim=0).nonzero().flatten()
    nf = bad_nf[..., head, :].any(dim=-1) & valid
    what = ("NaN" if bool(torch.isnan(a[..., head, :][nf]).any()) else "Inf") if bool(nf.any()) else (
        f"max |diff| {float(per_head[head]):.3g} > bound {bound:.3g}")  # fmt: skip
    return head, (int(tokens[0]), int(tokens[-1])), what


def first_divergence(cand: list, ref: list, valid: torch.Tensor, k: float, dtype: torch.dtype, label: str = ""):
    """The first layer, head and tokens where `cand` leaves the budget against `ref` ([B, L, H, D] per layer;
    valid [B, L] bool); None where every head of every layer keeps within it."""
    for layer, (a, r) in enumerate(zip(cand, ref, strict=False), 1):
        if (found := layer_divergence(a, r, valid, k, dtype)) is not None:
            head, tokens, what = found
            return Where(layer, head, tokens, f"{label} {what}".strip())
    return None


def locate(model, impl: str, batch, device: str, k: float, dtype: torch.dtype, *, forward: bool = True) -> Located:
    """Run `batch` under eager and under `impl` on `model` (left under `impl`) and judge every layer's attention
    in isolation, forward (when `forward`) and backward. LayoutUnknown when no attention call is seen."""
    from flashcheck.validate.loading import switch_impl

    if why := switch_impl(model, "eager"):
        raise LayoutUnknown(f"cannot switch to 'eager': {why}")
    ref = _record(model, batch, device)
    if why := switch_impl(model, impl):
        raise LayoutUnknown(f"cannot switch to {impl!r}: {why}")
    cand = _record(model, batch, device)
    valid = batch.mask.bool().cpu()
    if not ref or len(ref) != len(cand):
        return _projection_fallback(model, impl, batch, device, k, dtype, len(ref), len(cand))
    found = Located()
    seed = torch.Generator().manual_seed(0)
    for layer, (e, c) in enumerate(zip(ref, cand, strict=True), 1):
        q = e.qkv[0]
        if q.shape[-2] != valid.shape[-1]:
            found.notes.append(f"layer {layer}: {q.shape[-2]} queries for {valid.shape[-1]} tokens; not judged")
            continue
        out_shape = (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
        d_out = torch.randn(out_shape, generator=seed, dtype=torch.float64) * valid[..., None, None]
        d_out = d_out.to(q.device)
        out_e, g_e = _attend(e, e.qkv, e.mask, d_out)
        out_c, g_c = _attend(c, e.qkv, c.mask, d_out)
        terms = valid.shape[-1]  # forward: a random walk over L terms; backward: sums of sums over L (dS K, P^T dO)
        if forward and found.forward is None and (hit := layer_divergence(out_c, out_e, valid, k, dtype, terms**0.5)):
            found.forward = Where(layer, hit[0], hit[1], f"output {hit[2]}")
        if g_c is None or g_e is None:
            if "backward" not in " ".join(found.notes):
                found.notes.append(f"backward not judged: {impl} runs without autograd")
        elif found.backward is None:
            for name, a, r in zip(GRADS, g_c, g_e, strict=True):
                if a is not None and r is not None and (hit := layer_divergence(a, r, valid, k, dtype, terms)):
                    found.backward = Where(layer, hit[0], hit[1], f"{name} {hit[2]}")
                    break
    return found


def _projection_fallback(model, impl, batch, device, k, dtype, n_ref: int, n_cand: int) -> Located:
    """Forward only, from the output projections' inputs [B, L, H * Dh]; LayoutUnknown without them."""
    from flashcheck.validate.forward import run_batch
    from flashcheck.validate.loading import switch_impl

    heads = int(getattr(model.config, "num_attention_heads", 0) or 0)
    projs = projections(model)
    if not projs or heads < 1:
        raise LayoutUnknown(
            f"layout not understood: {type(model).__name__}'s attention went through transformers' dispatch "
            f"{n_ref} times under eager and {n_cand} under {impl}, and no output projection "
            f"({OUT_PROJECTION.pattern}) was found")  # fmt: skip
    outs = []
    for name in ("eager", impl):
        switch_impl(model, name)
        seen: list[torch.Tensor] = []
        keep = seen.append
        hooks = [p.register_forward_pre_hook(lambda _m, args, keep=keep: keep(args[0].detach().double().cpu()))
                 for p in projs]  # fmt: skip
        try:
            run_batch(model, batch, device)
        finally:
            for h in hooks:
                h.remove()
        outs.append([t.view(*t.shape[:2], heads, -1) for t in seen])
    where = first_divergence(outs[1], outs[0], batch.mask.bool().cpu(), k, dtype, "output")
    note = "attention dispatch not seen: forward only, from the output projections (propagated, not isolated)"
    return Located(forward=where, notes=[note], via="output projections")
