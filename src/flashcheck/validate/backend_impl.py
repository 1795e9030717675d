"""Any flashcheck backend (jax-xla, onnxruntime, sdpa-flash, ...) as a transformers attention implementation of
the same name, so that `flashcheck validate --impls jax-xla` runs a real model through it."""

from __future__ import annotations

import torch

_REGISTERED: set[str] = set()  # the backends registered with transformers in this process


def backend_attention(name: str):
    """transformers' attention signature around backend `name`: fn(module, query, key, value, attention_mask,
    **kwargs) -> (attn_output [B, L, H, D], None); query/key/value arrive as [B, H, L, D], the mask as
    transformers' SDPA mask (bool [B, 1, Lq, Lk], True = attend) or None."""
    from flashcheck.backends import get_backend

    backend = get_backend(name)

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if dropout:
            raise ValueError(f"backend {name!r} serves inference only here: dropout={dropout} (call model.eval())")
        lq = query.shape[2]
        # as transformers' sdpa_attention_forward: causal only without a mask and with more than one query
        causal = lq > 1 and attention_mask is None and bool(is_causal if is_causal is not None else module.is_causal)
        if causal and key.shape[2] > lq:
            key, value = key[:, :, :lq], value[:, :, :lq]
        with torch.no_grad():
            out = backend.run(query, key, value, device=query.device.type, causal=causal, scale=scaling,
                              mask=attention_mask)  # fmt: skip
        return out.transpose(1, 2).contiguous(), None

    return attention


def register_backend(name: str) -> None:
    """Register backend `name` with transformers (attention and SDPA-style mask); ValueError when its optional
    package is missing (naming the extra) or transformers would read the name as a FlashAttention kernel."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from flashcheck.backends import get_backend

    if why := get_backend(name).missing_package():
        raise ValueError(f"--impls {name}: {why}")
    if "flash" in name:
        raise ValueError(f"--impls {name}: transformers loads names like 'flash...' as its own kernels; use sdpa")
    AttentionInterface.register(name, backend_attention(name))
    AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED.add(name)


def cannot_run(name: str, model) -> str | None:
    """Why registered backend `name` cannot run `model` here (its dtype and device); None: it can, or `name` is
    not a flashcheck backend registered with transformers."""
    if name not in _REGISTERED:
        return None
    from flashcheck.backends import get_backend

    p = next(model.parameters())
    avail = get_backend(name).available(p.dtype, p.device.type)
    return None if avail.ok else avail.reason
