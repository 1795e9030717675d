"""Any simulated kernel as a model's attention: `sim:NAME` (a kernel preset such as fa3-fp8, sage3-fp4, or a simulator
policy such as bf16-mixed) registered with transformers' AttentionInterface, so that `flashcheck validate --impls
eager,sim:fa3-fp8` runs every attention call of a real model (prefill and each decode step) through the simulator.

This is the one module of validate/ that imports the simulators (flashcheck.kernels). A preset runs exactly as
`flashcheck compare --preset NAME` runs it: its own input quantisation, its tiles for the call's (Lq, Lk, D) (a
decode step, Lq = 1, gets the preset's tiles for Lq = 1 over the whole cache), its accumulation and P format;
a policy runs the flash simulator with 128 x 128 tiles. The kernel's format: the model's dtype where the preset
takes it (FA4 FP4 and SageAttention take 16-bit inputs), else the preset's own (FP8 presets: e4m3).

transformers reads any implementation name containing "flash" as a request for its own FlashAttention kernels and
a name "org/repo:fn" as a Hub kernel (transformers 5.x: utils.generic.is_flash_attention_requested,
integrations.hub_kernels.is_kernel), so the name registered is "fcsim:" + NAME with "flash" written "FLASH".

Shapes: query [B, H, Lq, D], key/value [B, Hkv, Lk, D] as transformers hands them; output [B, Lq, H, D].
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import torch

from flashcheck.kernels import flash_attention, reference_attention
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.presets import KERNEL_PRESETS, resolve
from flashcheck.kernels.sim.quantized import uses_quantized_inputs

PREFIX = "sim:"
POLICY_TILES = (128, 128)  # Br x Bc of a bare policy (compare's default blocks)
_DTYPE_FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp32"}


def is_sim(impl: str) -> bool:
    return impl.startswith(PREFIX)


def valid_names() -> list[str]:
    """The names sim: takes: every kernel preset, then the named policies and the FMT / FMT-mixed forms."""
    from flashcheck.core.numerics import NAMED_POLICIES

    policies = [p for p in NAMED_POLICIES if p not in KERNEL_PRESETS]
    return [*KERNEL_PRESETS, *policies, "bf16-mixed", "fp16-mixed", "fp32", "bf16", "fp16"]


@dataclass(frozen=True, slots=True)
class SimKernel:
    """sim:NAME parsed: `preset` (a kernel preset) or `policy` (a simulator policy spec), one of them set."""

    name: str
    preset: str | None = None
    policy: str | None = None

    @property
    def impl(self) -> str:
        return PREFIX + self.name

    @property
    def registered(self) -> str:
        """The name transformers knows it by (see the module docstring)."""
        return "fcsim:" + self.name.replace("flash", "FLASH")

    def fmt(self, dtype: torch.dtype) -> str:
        """The kernel's input format in a model of `dtype`: that dtype where the preset takes it, else its own."""
        if self.preset is None:
            return _DTYPE_FORMAT[dtype]
        own = _DTYPE_FORMAT[dtype]
        try:
            KERNEL_PRESETS[self.preset].policy(_parse_format(own))
            return own
        except ValueError:
            return KERNEL_PRESETS[self.preset].default_format

    def config(self, dtype: torch.dtype, lq: int, lk: int, d: int, causal: bool) -> dict:
        """flash_attention's keyword arguments for one call."""
        if self.preset is not None:
            return resolve(self.preset, self.fmt(dtype), lq, lk, d, causal)
        from flashcheck.core.numerics import parse_policy

        return {"policy": parse_policy(self.policy), "block_q": POLICY_TILES[0], "block_k": POLICY_TILES[1]}

    def backward(self, dtype: torch.dtype) -> bool:
        """Whether the simulator can differentiate through this kernel (quantised-input presets run forward only)."""
        return not uses_quantized_inputs(self.config(dtype, 1, 1, 64, False)["policy"])


def _parse_format(text: str):
    from flashcheck.core.numerics import parse_format

    return parse_format(text)


def parse_sim(impl: str) -> SimKernel:
    """sim:NAME -> SimKernel; ValueError naming the value and the valid names."""
    name = impl[len(PREFIX) :].strip() if is_sim(impl) else impl
    if name in KERNEL_PRESETS:
        return SimKernel(name, preset=name)
    from flashcheck.core.numerics import parse_policy

    try:
        parse_policy(name)
        ok = bool(name)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"unknown simulated kernel {impl!r}; expected sim:NAME with NAME a kernel preset or a simulator policy: "
            + ", ".join(valid_names())
        )
    return SimKernel(name, policy=name)


def check_model(kernel: SimKernel, head_dim: int, dtype: torch.dtype, training: bool = False) -> None:
    """ValueError (one line) when the kernel cannot run this model: a head dim the preset does not take (tried
    on a tiny input), or a training-mode model under a kernel without a backward."""
    q = torch.zeros(1, 1, 2, head_dim, dtype=torch.float32)
    try:
        with torch.no_grad():
            flash_attention(q, q, q, **kernel.config(dtype, 2, 2, head_dim, False))
    except ValueError as e:
        raise ValueError(
            f"{kernel.impl} cannot run this model: head dim {head_dim} is not allowed ({_allowed(str(e))})"
        ) from None
    if training and not kernel.backward(dtype):
        raise ValueError(
            f"{kernel.impl} has no backward (it quantises its inputs: forward only) and the model is in training "
            "mode; call model.eval() or choose a kernel with a backward (bf16-mixed, fa3-fp8, fa4-bf16, ...)"
        )


def _allowed(message: str) -> str:
    """The simulator's reason plus what is allowed, in words."""
    text = message.strip().splitlines()[0] if message.strip() else "refused"
    if "power-of-two" in text:
        return f"{text}: its Hadamard rotation takes power-of-two head dims (16, 32, 64, 128, 256)"
    return text


@dataclass(slots=True)
class SimAttention:
    """The attention function transformers calls for one sim kernel. `only`: run the kernel at this attention
    layer alone and the model's own eager attention elsewhere (the isolated error); `capture`: layer -> the
    first (query, key, value, mask, causal) the layer saw (fp32 copies), filled while not None."""

    kernel: SimKernel
    only: int | None = None
    capture: dict | None = None
    fmt_dtype: torch.dtype | None = None  # the dtype whose kernel format runs (None: the call's own dtype)
    _order: dict = field(default_factory=dict)  # id(module) -> layer, for modules without layer_idx

    def layer(self, module) -> int:
        idx = getattr(module, "layer_idx", None)
        return int(idx) if isinstance(idx, int) else self._order.setdefault(id(module), len(self._order))

    def __call__(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        lq = query.shape[2]
        # as transformers' sdpa_attention_forward: causal only without a mask and with more than one query
        causal = lq > 1 and attention_mask is None and bool(is_causal if is_causal is not None else module.is_causal)
        if causal and key.shape[2] > lq:
            key, value = key[:, :, :lq], value[:, :, :lq]
        layer = self.layer(module)
        if self.capture is not None and layer not in self.capture and self.only in (None, layer):
            mask = None if attention_mask is None else attention_mask.detach().clone()
            qkv = (t.detach().float().clone() for t in (query, key, value))
            self.capture[layer] = (*qkv, mask, causal, scaling)
        if self.only is not None and layer != self.only:
            return _model_eager(module, query, key, value, attention_mask, scaling, causal, **kw)
        if dropout:
            raise ValueError(f"{self.kernel.impl} serves inference here: dropout={dropout} (call model.eval())")
        dtype = self.fmt_dtype or query.dtype
        if module.training and torch.is_grad_enabled() and not self.kernel.backward(dtype):
            raise ValueError(f"{self.kernel.impl} has no backward (it quantises its inputs): call model.eval()")
        out = run_kernel(self.kernel, query, key, value, dtype=dtype, causal=causal, scale=scaling,
                         mask=attention_mask)  # fmt: skip
        return out.transpose(1, 2).contiguous(), None


def run_kernel(kernel: SimKernel, q, k, v, *, dtype: torch.dtype, causal: bool, scale: float | None, mask):
    """The simulated kernel on q [B, H, Lq, D], k, v [B, Hkv, Lk, D] (any float dtype; simulated from float32,
    which holds bf16 / fp16 / fp32 values exactly) -> [B, H, Lq, D] in q's dtype."""
    cfg = kernel.config(dtype, q.shape[2], k.shape[2], q.shape[3], causal)
    # a forward-only kernel asked for gradients in eval mode (locate's backward check) runs without autograd
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) and kernel.backward(dtype)
    with torch.set_grad_enabled(grads):
        out = flash_attention(q.float(), k.float(), v.float(), causal=causal, scale=scale, mask=mask, **cfg)
    return out.to(q.dtype)


def _model_eager(module, query, key, value, mask, scaling, causal: bool, **kw):
    """The model's own eager attention (its modeling file's eager_attention_forward) with transformers' additive
    mask: what eager fp32 computes at this layer, bit for bit."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min
        )
    elif mask is None and causal:
        lq, lk = query.shape[2], key.shape[2]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(lk - lq)
        mask = torch.zeros(lq, lk, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill(~keep, torch.finfo(query.dtype).min)
    if fn is None:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
        s = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
        s = s if mask is None else s + mask
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(p, value).transpose(1, 2).contiguous(), None
    out = fn(module, query, key, value, mask, scaling=scaling, dropout=0.0, **kw)
    return out[0], None


_REGISTERED: dict[str, SimAttention] = {}  # registered name -> its attention function


def register(impl: str) -> SimAttention:
    """Register sim:NAME with transformers (attention and SDPA-style bool mask); its SimAttention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    kernel = parse_sim(impl)
    fn = _REGISTERED.get(kernel.registered) or SimAttention(kernel)
    AttentionInterface.register(kernel.registered, fn)
    AttentionMaskInterface.register(kernel.registered, sdpa_mask)
    _REGISTERED[kernel.registered] = fn
    return fn


def attention_of(impl: str) -> SimAttention:
    """The registered SimAttention of sim:NAME (registered now when it was not)."""
    return _REGISTERED.get(parse_sim(impl).registered) or register(impl)


def head_dim_of(cfg: dict) -> int | None:
    """The attention head dim from a model's config.json (head_dim, else hidden_size / num_attention_heads; None
    when it names neither)."""
    d = cfg.get("head_dim")
    if isinstance(d, int) and d > 0:
        return d
    h, n = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return h // n if isinstance(h, int) and isinstance(n, int) and n > 0 else None


def check_config(impls, cfg: dict, dtypes: list[torch.dtype]) -> None:
    """Register every sim: implementation of `impls` and check it takes the head dim of the model configured by
    `cfg` in each dtype (ValueError, one line: the kernel, the head dim and what is allowed)."""
    d = head_dim_of(cfg)
    for impl in (i for i in impls if is_sim(i)):
        register(impl)
        for dtype in dtypes if d else ():
            check_model(parse_sim(impl), d, dtype)


def attention_rel_l2(kernel: SimKernel, dtype: torch.dtype, q, k, v, mask, causal: bool, scale: float | None) -> float:
    """The kernel's own error on these inputs, as predict defines it: relative L2 of its output against the FP64
    reference of its rounded (quantised) inputs."""
    d = q.shape[-1]
    cfg = kernel.config(dtype, q.shape[2], k.shape[2], d, causal)
    with torch.no_grad():
        out = flash_attention(q, k, v, causal=causal, mask=mask, scale=scale, **cfg).double()
        kr = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        vr = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        qx, kx, vx = round_inputs(q.double(), kr.double(), vr.double(), cfg["policy"], block_q=cfg["block_q"],
                                  block_k=cfg["block_k"])[:3]  # fmt: skip
        ref = reference_attention(qx, kx, vx, causal=causal, mask=mask, scale=scale or d**-0.5)
    live = torch.isfinite(ref)
    num = float((out - ref)[live].square().sum())
    den = float(ref[live].square().sum())
    return math.sqrt(num / den) if den > 0 else 0.0
