"""The guard inside models: a transformers attention implementation, and a module for code calling SDPA itself."""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashcheck.guard.guard import Guard

_UNSUPPORTED = ("softcap", "s_aux", "position_bias")


def site_name(module: torch.nn.Module) -> str:
    """A call site for a transformers attention module: "layer<idx>" (".cross" for cross-attention)."""
    idx = getattr(module, "layer_idx", None)
    base = f"layer{idx}" if idx is not None else type(module).__name__
    cross = getattr(module, "is_cross_attention", False) or "Cross" in type(module).__name__
    return base + ".cross" if cross else base


def attention_function(guard: Guard, site: Callable[[torch.nn.Module], str] = site_name) -> Callable:
    """transformers' attention signature around `guard`: fn(module, query, key, value, attention_mask,
    **kwargs) -> (attn_output [B, L, H, D], None); query/key/value arrive as [B, H, L, D]."""

    def flashcheck_attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        if dropout:
            raise ValueError(f"the flashcheck guard serves inference only: dropout={dropout} (call model.eval())")
        given = [k for k in _UNSUPPORTED if kwargs.get(k) is not None]
        if given:
            raise ValueError(f"the flashcheck guard does not support {', '.join(given)}; use eager or sdpa")
        lq = query.shape[2]
        # As transformers' sdpa_attention_forward: causal only without a mask and with more than one query;
        # a longer (static) cache is cut to the queries, so causal alignment cannot differ.
        causal = (
            lq > 1
            and attention_mask is None
            and bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        )
        if causal and key.shape[2] > lq:
            key, value = key[:, :, :lq], value[:, :, :lq]
        out = guard(query, key, value, causal=causal, scale=scaling, mask=attention_mask, site=site(module))
        return out.transpose(1, 2).contiguous(), None

    return flashcheck_attention


DEFAULT_NAME = "fcguard"


def register_transformers(
    guard: Guard | None = None,
    name: str = DEFAULT_NAME,
    *,
    site: Callable[[torch.nn.Module], str] = site_name,
    **guard_kwargs,
) -> Guard:
    """Register `guard` (or a new Guard(**guard_kwargs)) as transformers attention implementation `name`,
    with transformers' SDPA mask function (a boolean [B, 1, Lq, Lk] mask, True = attend), so that
    `from_pretrained(..., attn_implementation=name)` and `model.set_attn_implementation(name)` use it.
    Returns the guard; its sites are "layer<idx>".

    transformers treats every implementation whose name contains "flash" as a FlashAttention kernel to load
    (so "flashcheck" cannot be used): such names raise ValueError."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    _check_name(name)
    if guard is not None and guard_kwargs:
        raise ValueError(f"pass either a guard or Guard arguments, not both (got {sorted(guard_kwargs)})")
    guard = guard if guard is not None else Guard(**guard_kwargs)
    AttentionInterface.register(name, attention_function(guard, site))
    AttentionMaskInterface.register(name, sdpa_mask)
    return guard


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name={name!r} is not allowed; expected a non-empty name without '/', e.g. {DEFAULT_NAME!r}")
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:  # older transformers: the same substring rule
        flash = "flash" in name
    else:
        flash = is_flash_attention_requested(requested_attention_implementation=name)
    if flash:
        raise ValueError(
            f"name={name!r} is not allowed: transformers loads any implementation named like 'flash...' as a "
            f"FlashAttention kernel; choose a name without 'flash', e.g. {DEFAULT_NAME!r}"
        )


class GuardedAttention(torch.nn.Module):
    """`torch.nn.functional.scaled_dot_product_attention` through a guard, for models that call SDPA directly:
    replace `F.scaled_dot_product_attention(q, k, v, ...)` with `self.attn(q, k, v, ...)`.

    Same arguments and conventions as SDPA (q [B, H, Lq, D]; `attn_mask` bool True = attend or additive;
    `is_causal` top-left aligned); dropout is not supported. Each module is one `site`."""

    def __init__(self, guard: Guard | None = None, site: str = "attention", **guard_kwargs) -> None:
        super().__init__()
        if guard is not None and guard_kwargs:
            raise ValueError(f"pass either a guard or Guard arguments, not both (got {sorted(guard_kwargs)})")
        self.guard = guard if guard is not None else Guard(**guard_kwargs)
        self.site = site

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """[B, H, Lq, D] x [B, Hkv, Lk, D] -> [B, H, Lq, Dv]."""
        if dropout_p:
            raise ValueError(f"dropout_p={dropout_p} is not supported by the guard (inference only); expected 0")
        if is_causal and attn_mask is not None:
            raise ValueError("attn_mask and is_causal=True cannot both be given (as in SDPA)")
        if not enable_gqa and key.dim() == 4 and query.dim() == 4 and key.shape[1] != query.shape[1]:
            raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True")
        lq, lk = query.shape[-2], key.shape[-2]
        mask, causal = attn_mask, is_causal
        if is_causal and lq != lk:  # SDPA's causal mask is top-left aligned; the backends' bottom-right
            mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril()
            causal = False
        return self.guard(query, key, value, causal=causal, scale=scale, mask=mask, site=self.site)

    def extra_repr(self) -> str:
        return f"site={self.site!r}, preferred={self.guard.preferred.name!r}, fallback={self.guard.fallback.name!r}"
