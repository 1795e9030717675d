"""JAX's jax.nn.dot_product_attention behind the backend signature: implementation="xla" (any JAX device) and
"cudnn" (a CUDA JAX). JAX is an optional extra (`flashcheck[jax]`), imported only when asked.

Layout: flashcheck's q [B, H, Lq, D], k, v [B, Hkv, Lk, D] become JAX's [B, L, H, D] (K/V heads native: JAX
groups the query heads when Hkv divides H); causal is bottom-right aligned (JAX's is_causal is top-left, so
an explicit mask is passed when Lq != Lk); a bool mask goes in as `mask`, an additive one as `bias` (fp32,
added to the fp32 logits). The backward is jax.vjp through the same function (a torch.autograd.Function)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass

import torch

from flashcheck.backends.base import Availability, Backend

EXTRA = "jax"
_PLATFORM = {"cpu": "cpu", "cuda": "gpu"}


def missing_jax() -> str | None:
    """Why JAX cannot be imported here (None: it can); names the extra to install."""
    try:
        if importlib.util.find_spec("jax") is None:
            raise ImportError("No module named 'jax'")
        importlib.import_module("jax")
    except Exception as exc:  # None in sys.modules (ImportError), or an installed but broken jaxlib
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        from flashcheck.core.extras import install_hint

        return f"JAX is not installed or fails to import ({why}); install the extra: {install_hint(EXTRA)}"
    return None


def jax_version() -> str | None:
    """jax and jaxlib versions as one string (None: not importable)."""
    if missing_jax():
        return None
    import jax
    import jaxlib

    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"


def _jax_device(device: str):
    """The first JAX device of `device`'s platform; RuntimeError when JAX has none."""
    import jax

    return jax.devices(_PLATFORM[device])[0]


def _to_jax(t: torch.Tensor, dev):
    """A torch tensor as a JAX array of the same dtype on JAX device `dev` (bf16 through float32, exactly)."""
    import jax
    import jax.numpy as jnp

    dtype = {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16, torch.float32: jnp.float32}[t.dtype]
    arr = t.detach().cpu().to(torch.float32 if t.dtype == torch.bfloat16 else t.dtype).numpy()
    return jax.device_put(jnp.asarray(arr).astype(dtype), dev)


def _to_torch(a, dtype: torch.dtype) -> torch.Tensor:
    import jax.numpy as jnp
    import numpy as np

    return torch.from_numpy(np.array(a.astype(jnp.float32))).to(dtype)


def _masks(mask: torch.Tensor | None, causal: bool, lq: int, lk: int):
    """(bool mask, additive fp32 bias, is_causal) for JAX, each 4-D [B|1, H|1, Lq, Lk] or None."""
    if not causal and mask is None:
        return None, None, False
    if causal and mask is None and lq == lk:
        return None, None, True
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        keep = torch.tril(keep, diagonal=lk - lq)  # bottom-right aligned
    if mask is None:
        return keep[None, None], None, False
    mask = mask.cpu()
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.dtype == torch.bool:
        return mask & keep, None, False
    return None, mask.float().masked_fill(~keep, float("-inf")), False


class _JaxAttention(torch.autograd.Function):
    """out = JAX attention(q, k, v) in [B, H, L, D]; backward through jax.vjp."""

    @staticmethod
    def forward(ctx, q, k, v, fn, dev):
        import jax

        args = [_to_jax(t.transpose(1, 2), dev) for t in (q, k, v)]
        if any(t.requires_grad for t in (q, k, v)):
            out, ctx.vjp = jax.vjp(fn, *args)
        else:
            out = fn(*args)
        ctx.dev, ctx.dtypes = dev, (q.dtype, k.dtype, v.dtype)
        return _to_torch(out, q.dtype).transpose(1, 2).to(q.device)

    @staticmethod
    def backward(ctx, dout):
        cot = _to_jax(dout.to(ctx.dtypes[0]).transpose(1, 2), ctx.dev)
        grads = ctx.vjp(cot)
        return (*(_to_torch(g, dt).transpose(1, 2).to(dout.device) for g, dt in zip(grads, ctx.dtypes, strict=True)),
                None, None)  # fmt: skip


@dataclass
class JaxBackend(Backend):
    """jax.nn.dot_product_attention with `implementation` ("xla" or "cudnn"), jitted (compiled once per setting
    and shape), except fp16 on the CPU (see _unjitted)."""

    implementation: str = "xla"
    supports_gqa: bool = True

    def available(self, dtype: torch.dtype | None = None, device: str | None = None) -> Availability:
        """As Backend.available; where no GPU is found, the reason names JAX's own devices (jax.devices())."""
        a = super().available(dtype, device)
        if a.ok or not a.reason.startswith("needs an NVIDIA GPU") or missing_jax():
            return a
        import jax

        devices = jax.devices()
        if any(d.platform in ("gpu", "cuda") for d in devices):  # JAX has a GPU: torch is what lacks one
            return a
        seen = ", ".join(f"{d.platform}:{d.id}" for d in devices)
        return Availability(False, f"needs an NVIDIA GPU: JAX {jax.__version__} sees only {seen} (jax.devices())")

    def _available(self, device: str) -> Availability:
        if why := missing_jax():
            return Availability(False, why)
        try:
            _jax_device(device)
        except RuntimeError:
            import jax

            return Availability(False, f"JAX {jax.__version__} has no {device} device here (platforms: "
                                       f"{', '.join(sorted({d.platform for d in jax.devices()}))})")  # fmt: skip
        return Availability(True)

    def missing_package(self) -> str | None:
        return missing_jax()

    def version(self) -> str | None:
        return jax_version()

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        import jax

        lq, lk = q.shape[-2], k.shape[-2]
        keep, bias, is_causal = _masks(mask, causal, lq, lk)
        dev = _jax_device(q.device.type)
        extra = [None if t is None else jax.device_put(t.numpy(), dev) for t in (keep, bias)]
        fn = _attention(self.implementation, scale, is_causal, not _unjitted(q.dtype, dev))
        return _JaxAttention.apply(q, k, v, functools.partial(fn, mask=extra[0], bias=extra[1]), dev)


@functools.cache
def _attention(implementation: str, scale: float | None, is_causal: bool, jit: bool):
    """fn(q, k, v, mask=, bias=) in JAX's layout; jitted once per setting (XLA caches each input shape)."""
    import jax

    def fn(a, b, c, mask=None, bias=None):
        return jax.nn.dot_product_attention(
            a, b, c, bias=bias, mask=mask, scale=scale, is_causal=is_causal, implementation=implementation
        )

    return jax.jit(fn) if jit else fn


def _unjitted(dtype: torch.dtype, dev) -> bool:
    """fp16 on the CPU runs op by op: under jit, XLA's CPU compiler rejects the F16_F16_F32 dot algorithm that
    dot_product_attention asks for (JAX falls back to the default precision only when the op runs eagerly)."""
    return dtype == torch.float16 and dev.platform == "cpu"


def jax_backends() -> list[Backend]:
    low = (torch.bfloat16, torch.float16)
    return [
        JaxBackend(
            "jax-xla",
            "JAX dot_product_attention, implementation='xla', jitted (fp16 on cpu op by op; extra flashcheck[jax])",
            dtypes=(torch.float32, *low),
        ),
        JaxBackend(
            "jax-cudnn",
            "JAX jax.nn.dot_product_attention, implementation='cudnn' (a CUDA JAX; extra flashcheck[jax])",
            dtypes=low,
            devices=("cuda",),
            implementation="cudnn",
        ),
    ]
