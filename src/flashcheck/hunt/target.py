"""What is hunted: a backend, a simulator preset or a user's callable, behind one call, with what it takes.

A target is called as forward(q, k, v, *, causal, scale, mask[, sink]) with q [B, H, Lq, D], k, v
[B, Hkv, Lk, D] in the run dtype on its device, and returns [B, H, Lq, D]: the signature of flashcheck's
backends (backends/base.py). It is called directly, never through Backend.run, so that what the target
itself does with an empty key set is what the semantics table sees. A target without a `sink` parameter
gets a sink as one extra key (K and V rows of zeros) whose score is the sink logit, given through the
additive mask with the causal triangle folded in: exactly the sink's softmax column. FP8 targets (the FP8
kernel presets, a callable named with :fp8-e4m3 or :fp8-e5m2) get Q, K, V in that format, the mask in fp32, and
are judged forward only: FA3's and FA4's FP8 paths are forward (inference) kernels."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashcheck.hunt.case import DTYPES, FP8

_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(:[\w-]+)?$")
FP8_NOTE = "FP8 inputs, judged forward only (the FP8 kernels have no backward)"
QUANT_NOTE = "quantized inputs (INT8 / FP4): judged forward only, as the simulator runs them"


class TargetCrashed(RuntimeError):
    """The target's process died on a case (hunt.isolate): `signal` ('SIGABRT', or 'exit code N'), `line`: what
    its stderr said last of why ('' when nothing)."""

    def __init__(self, signal: str, line: str = "") -> None:
        super().__init__(f"the target's process died of {signal}" + (f": {line}" if line else ""))
        self.signal, self.line = signal, line


class TargetRaised(RuntimeError):
    """The target raised in its worker process; the message is 'Type: message' as the worker reported it."""


class BadOutput(ValueError):
    """The target returned something that is not a tensor of [B, H, Lq, D]: a finding of kind `output`."""


def checked_output(out: object, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`out` when it is a tensor of q's [B, H, Lq] and v's D; BadOutput saying what it is otherwise."""
    if not isinstance(out, torch.Tensor):
        raise BadOutput(f"the target returned a {type(out).__name__}, not a tensor")
    want = (*q.shape[:-1], v.shape[-1])
    if tuple(out.shape) != tuple(want):
        raise BadOutput(f"the target returned shape {list(out.shape)}; expected {list(want)} ([B, H, Lq, D])")
    return out


@dataclass(frozen=True)
class Target:
    """A hunted implementation. `dtypes`: the case dtypes it takes (names of case.DTYPES); `masks`: it takes a
    mask; `native_sink`: it has a `sink` parameter; `backward`: gradients flow through it; `float64_io`: a
    simulator, given float64 tensors (already rounded) and returning float64."""

    name: str
    kind: str  # backend | preset | callable
    fn: Callable[..., torch.Tensor]
    dtypes: tuple[str, ...]
    device: str = "cpu"
    masks: bool = True
    gqa: bool = True
    native_sink: bool = False
    backward: bool = True
    float64_io: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    pow2_head_dim: bool = False  # it takes power-of-two head dims only (FA3 FP8's Hadamard rotation)
    api: str = "public"  # public, or "private: OP" (a private op users cannot call), or "simulated" (a preset)
    via: str = ""  # the call, in words: what a finding's reproducer calls

    def run_dtype(self, dtype: str) -> torch.dtype:
        return torch.float64 if self.float64_io else DTYPES[dtype]

    def call(self, q, k, v, *, dtype: str, causal: bool, scale: float, mask, sink: float | None) -> torch.Tensor:
        """The target's output for float64 CPU inputs (autograd flows back to them), as float64 on the CPU."""
        dt, dev = self.run_dtype(dtype), torch.device(self.device)
        q, k, v = (t.to(dev, dt) for t in (q, k, v))
        mdt = torch.float32 if dt.itemsize == 1 else dt  # FP8 kernels hold scores (and so the mask) in fp32
        mask = None if mask is None else mask.to(dev, mdt if mask.is_floating_point() else torch.bool)
        kw = {"causal": causal, "scale": scale, "mask": mask} | ({"dtype": dtype} if self.kind == "preset" else {})
        if sink is not None and self.native_sink:
            kw["sink"] = sink
        elif sink is not None:
            k, v, kw["mask"] = sink_as_key(q, k, v, mask, causal, sink)
            kw["causal"] = False
        return checked_output(self.fn(q, k, v, **kw), q, v).to("cpu", torch.float64)


def sink_as_key(q, k, v, mask, causal: bool, sink: float):
    """K, V with one zero row appended and the additive mask [B|1, 1, Lq, Lk + 1] whose last column is the
    sink logit (causal bottom-right over the real keys folded in); the mask in q's dtype, fp32 for FP8 q."""
    b, hkv, lk, d = k.shape
    lq = q.shape[-2]
    zeros = k.new_zeros(b, hkv, 1, d)
    mdt = torch.float32 if q.dtype.itemsize == 1 else q.dtype
    bias = torch.zeros(1, 1, lq, lk, dtype=mdt, device=q.device)
    if mask is not None:
        bias = bias + (mask.to(mdt) if mask.is_floating_point() else torch.where(mask, 0.0, -math.inf).to(mdt))
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        bias = bias.masked_fill(~keep, -math.inf)
    column = torch.full((*bias.shape[:-1], 1), sink, dtype=mdt, device=q.device)
    return (
        torch.cat([k, zeros], dim=-2),
        torch.cat([v, v.new_zeros(b, hkv, 1, v.shape[-1])], dim=-2),
        torch.cat([bias, column], dim=-1),
    )


def _backend_target(text: str, device: str) -> Target:
    from flashcheck.backends import get_backend

    name, _, fmt = text.partition(":")
    b = get_backend(name)
    if why := b.missing_package():
        raise ValueError(f"target {text!r}: {why}")
    if device not in b.devices:
        raise ValueError(f"target {text!r} runs on {' or '.join(b.devices)}, not on {device}")
    names = {v: k for k, v in DTYPES.items()}
    dtypes = tuple(names[d] for d in b.dtypes_on(device) if d in names)
    if fmt:
        if fmt not in DTYPES:
            raise ValueError(f"target {text!r}: format {fmt!r} is not allowed; expected one of {', '.join(DTYPES)}")
        if fmt not in dtypes:
            raise ValueError(f"target {text!r}: {name} does not take {fmt} on {device}; it takes {', '.join(dtypes)}")
        dtypes = (fmt,)
    fn, api, via = b.forward, *_api(name)
    if name in PUBLIC_SDPA:
        fn = _public_sdpa(PUBLIC_SDPA[name])
    return Target(
        text,
        "backend",
        fn,
        dtypes,
        device,
        masks=b.supports_mask,
        gqa=b.supports_gqa,
        backward=b.backward_reason(device) is None,
        api=api,
        via=via,
    )


# torch's SDPA backends hunted through the call users make: F.scaled_dot_product_attention under sdpa_kernel([B]),
# a process-wide switch: backend targets run in the hunt's worker process (isolate.isolates; the CLI always
# isolates them), where no one else's thread sees it; a caller of hunt.search with isolate=False lets its own
# threads see the pinned backend for the duration of each call
PUBLIC_SDPA = {
    "sdpa-math": "MATH",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}
_VIA = {
    "jax-xla": "jax.nn.dot_product_attention(implementation='xla'), jitted",
    "jax-cudnn": "jax.nn.dot_product_attention(implementation='cudnn'), jitted",
    "onnxruntime": "an ONNX model of one Attention node (opset 23) in onnxruntime.InferenceSession",
}
_PRIVATE = {
    "sdpa-math-lowp": "aten::_scaled_dot_product_attention_math's steps in the input format (flashcheck's own)",
}


def _api(name: str) -> tuple[str, str]:
    """('public' or 'private: OP', the call in words) of backend `name`."""
    if name in PUBLIC_SDPA:
        return "public", f"torch.nn.functional.scaled_dot_product_attention under sdpa_kernel([{PUBLIC_SDPA[name]}])"
    if name in _PRIVATE:
        return f"private: {_PRIVATE[name]}", _PRIVATE[name]
    return "public", _VIA.get(name, f"the {name} backend's forward")


def _public_sdpa(which: str):
    def forward(q, k, v, *, causal=False, scale=None, mask=None):
        """F.scaled_dot_product_attention pinned to one backend; causal bottom-right as an explicit mask where
        Lq != Lk or a mask is given (SDPA's is_causal is top-left)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from flashcheck.backends.sdpa import _sdpa_mask

        attn = _sdpa_mask(mask, causal, q, k)
        gqa = q.shape[1] != k.shape[1]
        with sdpa_kernel([getattr(SDPBackend, which)]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attn, is_causal=causal and attn is None, scale=scale, enable_gqa=gqa
            )

    return forward


def _preset_target(text: str, device: str) -> Target:
    from flashcheck.backends import get_backend

    name, _, fmt = text.partition(":")
    if device != "cpu":
        raise ValueError(f"target {text!r} is a simulator preset: it runs on cpu only")
    sim = get_backend("sim-flash")
    dtypes = preset_dtypes(name)
    if not dtypes:
        raise ValueError(
            f"target {text!r}: preset {name} takes none of the hunt's inputs ({', '.join(DTYPES)}); "
            f"judge it with flashcheck compare --preset {name}"
        )
    if fmt and fmt not in dtypes:
        raise ValueError(f"target {text!r}: preset {name} does not take {fmt}; it takes {', '.join(dtypes)}")
    dtypes = (fmt,) if fmt else dtypes

    def forward(q, k, v, *, dtype: str, **kw):
        return sim.configured(preset=name, fmt=dtype).forward(q, k, v, **kw)

    fp8, quantized = dtypes[0] in FP8, _quantizes(name, dtypes[0])
    notes = ("simulated on the CPU", *((FP8_NOTE,) if fp8 else (QUANT_NOTE,) if quantized else ()))
    back = not (fp8 or quantized)
    pow2 = _hadamard(name, dtypes[0])
    return Target(
        text, "preset", forward, dtypes, device, backward=back, float64_io=True, notes=notes, pow2_head_dim=pow2,
        api="simulated", via=f"flashcheck's simulator, preset {name}",
    )  # fmt: skip


def _hadamard(name: str, dtype: str) -> bool:
    """Whether preset `name` rotates Q and K by a Hadamard matrix (FA3's FP8): power-of-two head dims only."""
    from flashcheck.core.numerics import parse_format
    from flashcheck.kernels.sim.presets import kernel_preset

    return bool(kernel_preset(name).policy(parse_format(dtype)).hadamard)


def _quantizes(name: str, dtype: str) -> bool:
    """Whether preset `name` quantizes its inputs (SageAttention, the FP4 presets): the simulator runs those
    forward only (kernels.sim.flash refuses autograd through them)."""
    from flashcheck.core.numerics import parse_format
    from flashcheck.kernels.sim.presets import kernel_preset
    from flashcheck.kernels.sim.quantized import uses_quantized_inputs

    return uses_quantized_inputs(kernel_preset(name).policy(parse_format(dtype)))


def preset_dtypes(name: str) -> tuple[str, ...]:
    """The hunt's case dtypes that kernel preset `name` runs: of bf16, fp16 and fp32 those its policy accepts;
    a preset whose own format is FP8 (fa3-fp8, fa4-fp8, fa3-fp8-fp22, as compare runs it) its FP8 formats
    instead, its own first."""
    from flashcheck.core.numerics import parse_format
    from flashcheck.kernels.sim.presets import kernel_preset

    preset, taken = kernel_preset(name), []
    own = preset.default_format
    order = (own, *(f for f in FP8 if f != own)) if own in FP8 else ("bf16", "fp16", "fp32")
    for dtype in order:
        try:
            preset.policy(parse_format(dtype))
        except ValueError:
            continue
        taken.append(dtype)
    return tuple(taken)


def _callable_target(text: str, device: str, load: bool = True) -> Target:
    mod, _, attr = text.partition(":")
    attr, _, fmt = attr.partition(":")
    if fmt and fmt not in DTYPES:
        raise ValueError(f"target {text!r}: format {fmt!r} is not allowed; expected one of {', '.join(DTYPES)}")
    dtypes, fp8 = ((fmt,) if fmt else ("fp32", "bf16", "fp16", "fp64")), fmt in FP8
    if not load:  # named only: its module is imported in the hunt's worker (hunt.isolate), never here
        top = mod.partition(".")[0]
        if importlib.util.find_spec(top) is None:  # found without running it: a typo costs no worker's start
            raise ValueError(f"target {text!r}: cannot import {attr} from {mod} (No module named {top!r})")
        return Target(text, "callable", _not_here, dtypes, device, backward=not fp8, notes=(FP8_NOTE,) * fp8)
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"target {text!r}: cannot import {attr} from {mod} ({exc})") from None
    if not callable(fn):
        raise ValueError(f"target {text!r}: {attr} is a {type(fn).__name__}, not a function")
    params = inspect.signature(fn).parameters
    takes = {n for n in ("causal", "scale", "mask", "sink") if n in params}
    varkw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if not varkw and not {"causal", "scale", "mask"} <= takes:
        raise ValueError(f"target {text!r}: {attr} must take q, k, v and keywords causal, scale, mask (and sink)")
    sink = varkw or "sink" in takes
    return Target(text, "callable", fn, dtypes, device, native_sink=sink, backward=not fp8, notes=(FP8_NOTE,) * fp8)


def _not_here(*args, **kw):
    raise RuntimeError("this callable target is named only: it runs in the hunt's worker (hunt.isolate)")


def parse_target(text: str, device: str = "cpu", *, load: bool = True) -> Target:
    """A backend name (optionally NAME:FMT), a kernel preset of the simulator (PRESET or PRESET:FMT) or a user
    callable package.module:function (with :FMT, one format: fp8-e4m3 and fp8-e5m2 hand it FP8 tensors);
    ValueError names the value and what is allowed. `load=False`: a callable's module is not imported (the hunt's
    worker imports it: IsolatedTarget.load checks it there)."""
    from flashcheck.backends import backend_names
    from flashcheck.kernels.sim.presets import KERNEL_PRESETS

    text = str(text).strip()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r} is not allowed; expected cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: there is no CUDA device here; use --device cpu")
    head = text.partition(":")[0]
    if head.startswith("sim-"):
        raise ValueError(f"target {text!r}: hunt a simulator through its kernel preset ({', '.join(KERNEL_PRESETS)})")
    if head in backend_names():
        return _backend_target(text, device)
    if head in KERNEL_PRESETS:
        return _preset_target(text, device)
    if _CALLABLE.match(text):
        return _callable_target(text, device, load)
    import difflib

    allowed = [*backend_names(), *KERNEL_PRESETS]
    close = difflib.get_close_matches(head, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"unknown target {text!r}{hint}; expected a backend ({', '.join(backend_names())}), a simulator preset "
        f"({', '.join(KERNEL_PRESETS)}) or a callable package.module:function"
    )
