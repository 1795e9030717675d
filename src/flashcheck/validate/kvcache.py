"""`validate --kv-cache`: a decoder model generating with a quantised KV cache against the 16-bit (bf16) cache.

The cache format enters through a transformers attention implementation ("fckv") that stores and reads every
key and value as kernels.serving.kvcache does (and quantises Q where the attention runs in FP8), then computes the
attention exactly (float32 SDPA on the dequantised values): what is measured is the cache format, not a
kernel's accumulation. Quantising K/V at every call equals storing them quantised, since every scheme's scale
is per element group of one token (per-tensor scales are fixed once per layer on the first forward, as vLLM's
calc_kv_scales does).

Per format, over `prompts` prompts of `new_tokens` greedy steps: token agreement with the bf16 cache's
generation, the first divergent position, the mean KL(bf16 || format) of the next-token distributions
(teacher-forced on the bf16 cache's tokens), and prefill vs decode (the same tokens' logprobs from step-by-step
decoding and from one prefill rescore: max |difference| and the first position that differs).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import asdict, dataclass

import torch

from flashcheck.kernels.serving.kvcache import parse_kv_format, quantize_kv

IMPL = "fckv"
_STATE: dict = {"fmt": None, "scales": {}, "kernel": None}  # kernel: a sim_impl.SimKernel, None: exact attention


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention signature: query [B, H, Lq, D], key/value [B, Hkv, Lk, D] -> ([B, Lq, H, D], None)."""
    fmt = _STATE["fmt"]
    layer = getattr(module, "layer_idx", 0)
    scales = _STATE["scales"].get(layer)
    qq, kq, vq, used = quantize_kv(query, key, value, fmt, scales)
    _STATE["scales"].setdefault(layer, used)
    lq = query.shape[2]
    causal = lq > 1 and attention_mask is None and bool(is_causal if is_causal is not None else module.is_causal)
    if _STATE["kernel"] is not None:  # the cache's values through a simulated kernel (prefill and each decode step)
        from flashcheck.validate.sim_impl import run_kernel

        out = run_kernel(_STATE["kernel"], qq.to(query.dtype), kq.to(query.dtype), vq.to(query.dtype),
                         dtype=query.dtype, causal=causal, scale=scaling, mask=attention_mask)  # fmt: skip
        return out.transpose(1, 2).contiguous(), None
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(torch.float32)
    reps = query.shape[1] // key.shape[1]
    kq, vq = kq.repeat_interleave(reps, dim=1), vq.repeat_interleave(reps, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        qq.float(), kq.float(), vq.float(), attn_mask=mask, is_causal=causal, scale=scaling
    )
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the "fckv" attention implementation with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPL, _attention)
    AttentionMaskInterface.register(IMPL, sdpa_mask)


@dataclass(frozen=True, slots=True)
class KVRow:
    """One cache format's findings (see the module docstring); first_divergence: the earliest generated position
    (0-based, over prompts) where greedy tokens differ from the bf16 cache's (None: never)."""

    kv: str
    token_agreement: float
    first_divergence: int | None
    diverged_prompts: int
    kl_mean: float
    kl_max: float
    prefill_decode_max: float
    prefill_decode_first: int | None
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def _step_logits(model, prompt: torch.Tensor, new_tokens: int, forced: torch.Tensor | None = None):
    """Greedy decoding (or teacher-forced on `forced` [new_tokens]) with the cache: (tokens [n], logits [n, V])."""
    # transformers 5.x names the cache `cache` (in and out); earlier releases `past_key_values`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompt.unsqueeze(0), use_cache=True)
    past, logits, tokens = out[name], [out.logits[0, -1].float()], []
    for i in range(new_tokens):
        tok = forced[i] if forced is not None else logits[-1].argmax()
        tokens.append(int(tok))
        if i == new_tokens - 1:
            break
        out = model(input_ids=tok.view(1, 1), use_cache=True, **{name: past})
        past = out[name]
        logits.append(out.logits[0, -1].float())
    return torch.tensor(tokens), torch.stack(logits)


def _run_format(model, fmt: str, prompts: list[torch.Tensor], new_tokens: int, ref: list | None):
    _STATE["fmt"], _STATE["scales"] = parse_kv_format(fmt), {}
    gens, kls, pd = [], [], []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            _STATE["scales"] = {}  # scales calibrated on this request's first forward (its prefill)
            toks, _ = _step_logits(model, prompt, new_tokens)
            forced_toks = ref[i][0] if ref is not None else toks
            _, dec_logits = _step_logits(model, prompt, new_tokens, forced_toks)
            full = torch.cat([prompt, forced_toks])
            pre_logits = model(input_ids=full.unsqueeze(0)).logits[0, len(prompt) - 1 : -1].float()
            lp_dec = torch.log_softmax(dec_logits, -1).gather(-1, forced_toks.view(-1, 1)).squeeze(-1)
            lp_pre = torch.log_softmax(pre_logits, -1).gather(-1, forced_toks.view(-1, 1)).squeeze(-1)
            gens.append((toks, dec_logits))
            pd.append((lp_dec - lp_pre).abs())
            if ref is not None:
                p_ref = torch.log_softmax(ref[i][1], -1)
                kls.append((p_ref.exp() * (p_ref - torch.log_softmax(dec_logits, -1))).sum(-1))
    return gens, kls, pd


def _first(mask_rows: list[torch.Tensor]) -> int | None:
    firsts = [int(torch.nonzero(m)[0]) for m in mask_rows if bool(m.any())]
    return min(firsts) if firsts else None


def kv_cache_check(model, formats: list[str], prompts: list[torch.Tensor], new_tokens: int,
                   kernels: tuple = ()) -> list[KVRow]:  # fmt: skip
    """The bf16 cache's row, then one per format (see the module docstring); with `kernels` (sim_impl.SimKernel),
    the bf16 cache and every format again with each kernel as the attention ("fp8/calc + sim:fa3-fp8"), all
    against the bf16 cache with exact attention. `model` loaded with attn "fckv"."""
    rows, ref = [], None
    runs = [(None, f) for f in ["bf16", *formats]] + [(kn, f) for kn in kernels for f in ["bf16", *formats]]
    for kernel, fmt in runs:
        t0 = time.perf_counter()
        _STATE["kernel"] = kernel
        try:
            gens, kls, pd = _run_format(model, fmt, prompts, new_tokens, ref)
        finally:
            _STATE["kernel"] = None
        if ref is None:
            ref = gens
        differ = [g[0] != r[0] for g, r in zip(gens, ref, strict=True)]
        agree = float(torch.cat([~d for d in differ]).float().mean())
        kl = torch.cat(kls) if kls else torch.zeros(1)
        pdiff = torch.cat(pd)
        label = fmt if kernel is None else f"{fmt} + {kernel.impl}"
        rows.append(KVRow(label, agree, _first(differ), sum(bool(d.any()) for d in differ), float(kl.mean()),
                          float(kl.max()), float(pdiff.max()), _first([p != 0 for p in pd]),
                          time.perf_counter() - t0))  # fmt: skip
    return rows


def expand_formats(text: str) -> list[str]:
    """'fp8,fp4' -> the formats to run: a per-tensor FP8 format without a scale runs with scale 1.0 (static)
    and with vLLM's calibrated scales (calc) side by side. ValueError names a bad format."""
    out = []
    for name in (x.strip() for x in text.split(",")):
        fmt = parse_kv_format(name)
        if "/" not in name and fmt.scheme in ("fp8", "fp8k-nvfp4v"):
            out += [f"{fmt.scheme}/static", f"{fmt.scheme}/calc"]
        else:
            out.append(fmt.name)
    return out


def random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """n prompts of `length` token ids drawn uniformly (a model folder without a tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g) for _ in range(n)]


def fmt_row(r: KVRow) -> list[str]:
    """A table row: format, agreement, first divergence, KL, prefill-vs-decode, seconds."""
    first = "-" if r.first_divergence is None else str(r.first_divergence)
    pd_first = "-" if r.prefill_decode_first is None else str(r.prefill_decode_first)
    kl = "-" if r.kv == "bf16" else f"{r.kl_mean:.3g} (max {r.kl_max:.3g})"
    return [r.kv, f"{100 * r.token_agreement:.1f}%", first, kl, f"{r.prefill_decode_max:.3g} from {pd_first}",
            f"{r.seconds:.1f}" if math.isfinite(r.seconds) else "-"]  # fmt: skip
