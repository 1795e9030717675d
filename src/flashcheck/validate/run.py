"""One run: a model in one dtype with one attention implementation over the sample, kept as what the
comparisons need (embeddings, probe hidden states, logits summaries, generations, invariance checks).

Shapes: N texts, H hidden size, T probe tokens, P probe texts (the probe set plus the max-length rows),
V vocabulary, G generated tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashcheck.validate.forward import (
    Batch,
    accepts_position_ids,
    first_nonfinite,
    pad_batch,
    pool,
    run_batch,
    valid_tokens,
)

Advance = Callable[..., None]


@dataclass(slots=True)
class Plan:
    """The fixed inputs every run of one validation shares."""

    tok: object
    enc: list[dict]  # encodings: sample texts 0..N-1, then the max-length rows
    n_texts: int
    probe: list[int]  # encoded ids whose hidden states are kept (probe texts + max-length rows)
    batches: list[Batch]  # all N texts, length-sorted, right-padded
    probe_batches: list[Batch]  # the probe ids only (for probe-only runs)
    invariance_ids: list[int]
    invariance_singles: int  # how many of them also run at batch size 1
    prompts: list[list[int]]  # token ids of the generation prompts (causal LMs)
    pooling: str
    normalize: bool
    causal: bool
    new_tokens: int
    device: str
    ref_tokens: list[list[int]] | None = None  # the reference's greedy tokens per prompt (set once it has run)


@dataclass(slots=True)
class RunOutput:
    """What one (impl, dtype) run produced."""

    impl: str
    dtype: str
    emb_ids: torch.Tensor  # [N'] encoded ids of the rows of emb
    emb: torch.Tensor  # [N', H] float64, normalised when the model normalises
    norms: torch.Tensor  # [N'] float64 norms before normalisation
    probe: list[torch.Tensor]  # per layer [T, H] in the run's dtype, sorted by (probe id, position)
    probe_ids: torch.Tensor  # [T] encoded id of each probe token
    nonfinite: dict | None = None
    argmax: torch.Tensor | None = None  # [T_all] top-1 token at every valid position (causal LMs)
    last_logits: torch.Tensor | None = None  # [P, V] float32 logits at each probe text's last token
    generation: list[dict] | None = None
    invariance: dict = field(default_factory=dict)
    seconds: float = 0.0
    probe_only: bool = False  # the run covered the probe texts only (the fp64 context)
    kernels: list[str] = field(default_factory=list)  # attention ops the profiler saw on one text

    def to_state(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_state(cls, state: dict) -> RunOutput:
        return cls(**state)


def _collect(plan: Plan, model, batches: list[Batch], advance: Advance, label: str) -> dict:
    probe = set(plan.probe)
    acc: dict = {"ids": [], "emb": [], "pid": [], "pos": [], "layers": None, "argmax": [], "last": [], "bad": None}
    for batch in batches:
        hidden, logits = run_batch(model, batch, plan.device)
        mask = batch.mask.to(hidden[0].device)
        acc["bad"] = acc["bad"] or first_nonfinite(hidden, batch, "main run")
        acc["ids"] += batch.texts
        acc["emb"].append(pool(hidden[-1], mask, plan.pooling).cpu())
        keep = torch.tensor([t in probe for t in batch.texts], device=mask.device)
        pm = mask * keep[:, None]
        if pm.any():
            rows, pos = pm.nonzero(as_tuple=True)
            acc["pid"].append(torch.tensor(batch.texts, device=rows.device)[rows].cpu())
            acc["pos"].append(pos.cpu())
            layers = [valid_tokens(h, pm).cpu() for h in hidden]
            acc["layers"] = (
                layers if acc["layers"] is None else [torch.cat(p) for p in zip(acc["layers"], layers, strict=True)]
            )
        if logits is not None:
            acc["argmax"] += [(t, logits[r][mask[r].bool()].argmax(-1).cpu()) for r, t in enumerate(batch.texts)]
            last = mask.shape[1] - 1 - mask.flip(-1).to(torch.int64).argmax(-1)
            acc["last"] += [(t, logits[r, last[r]].float().cpu()) for r, t in enumerate(batch.texts) if t in probe]
        advance(1, label)
    return acc


def _assemble(plan: Plan, impl: str, dtype: str, acc: dict) -> RunOutput:
    ids = torch.tensor(acc["ids"])
    order = torch.argsort(ids)
    raw = torch.cat(acc["emb"])[order]
    norms = torch.linalg.vector_norm(raw, dim=-1)
    emb = raw / norms.clamp(min=1e-300)[:, None] if plan.normalize else raw
    pid, pos = torch.cat(acc["pid"]), torch.cat(acc["pos"])
    porder = torch.argsort(pid * (pos.max() + 1) + pos)
    out = RunOutput(impl, dtype, ids[order], emb, norms, [h[porder] for h in acc["layers"]], pid[porder])
    out.nonfinite = acc["bad"]
    if acc["argmax"]:
        out.argmax = torch.cat([a for _, a in sorted(acc["argmax"], key=lambda x: x[0])])
        out.last_logits = torch.stack([v for _, v in sorted(acc["last"], key=lambda x: x[0])])
    return out


def execute(plan: Plan, model, impl: str, dtype: str, *, probe_only: bool, advance: Advance) -> RunOutput:
    """Run the model (already in `dtype` with `impl` selected) over the plan; invariance and generation too
    unless probe_only (the fp64 context run)."""
    start = time.perf_counter()
    label = f"{impl}:{dtype}"
    acc = _collect(plan, model, plan.probe_batches if probe_only else plan.batches, advance, label)
    out = _assemble(plan, impl, dtype, acc)
    out.probe_only = probe_only
    out.kernels = attention_kernels(plan, model)
    if not probe_only:
        out.invariance = invariance_checks(plan, model)
        advance(1, label)
        if plan.causal and plan.new_tokens > 0:
            out.generation = greedy(plan, model)
        advance(1, label)
    out.seconds = time.perf_counter() - start
    return out


def attention_kernels(plan: Plan, model) -> list[str]:
    """The attention ops torch.profiler sees while the model encodes the first text: the proof of which
    kernel ran (e.g. aten::_scaled_dot_product_flash_attention_for_cpu for sdpa on a CPU; none for eager,
    whose attention is plain matmul and softmax)."""
    from flashcheck.backends.profiling import attention_ops

    batch = pad_batch(plan.tok, plan.enc, [0])
    return attention_ops(lambda: run_batch(model, batch, plan.device))


def _per_text_tokens(hidden: list[torch.Tensor], batch: Batch) -> dict[int, list[torch.Tensor]]:
    """text id -> per-layer [n_i, H] valid-token states (fully padded rows left out)."""
    out = {}
    for r, t in enumerate(batch.texts):
        if t >= 0:
            m = batch.mask[r].bool().to(hidden[0].device)
            out[t] = [h[r][m].cpu() for h in hidden]
    return out


def _layer_max(a: dict, b: dict) -> list[float]:
    """Per layer, max |a - b| over every text's valid tokens (inf where either is non-finite)."""
    n_layers = len(next(iter(a.values())))
    worst = [0.0] * n_layers
    for t, la in a.items():
        for i, (x, y) in enumerate(zip(la, b[t], strict=True)):
            d = (x.to(torch.float64) - y.to(torch.float64)).abs().nan_to_num(nan=float("inf"))
            worst[i] = max(worst[i], float(d.max()) if d.numel() else 0.0)
    return worst


def invariance_checks(plan: Plan, model) -> dict:
    """The invariance texts in one right-padded and one left-padded batch, each with a fully padded row
    added, and the first few of them at batch size 1: per-layer max deviation of the batch from batch
    size 1 and of left from right padding, and the first NaN/Inf anywhere (the padded row included)."""
    ids = plan.invariance_ids
    out: dict = {"texts": len(ids), "singles": min(plan.invariance_singles, len(ids)), "nonfinite": None}
    states = {}
    for side in ("right", "left"):
        if side == "left" and not accepts_position_ids(model):
            out["left_padding_note"] = "skipped: the model's forward takes no position_ids"
            continue
        batch = pad_batch(plan.tok, plan.enc, ids, side=side, full_pad_row=True, positions=side == "left")
        hidden, _ = run_batch(model, batch, plan.device)
        out["nonfinite"] = out["nonfinite"] or first_nonfinite(hidden, batch, f"{side}-padded batch")
        states[side] = _per_text_tokens(hidden, batch)
    singles: dict = {}
    for i in ids[: out["singles"]]:
        single = pad_batch(plan.tok, plan.enc, [i])
        hidden, _ = run_batch(model, single, plan.device)
        singles.update(_per_text_tokens(hidden, single))
    out["batch_size"] = _layer_max(singles, states["right"])
    out["left_padding"] = _layer_max(states["left"], states["right"]) if "left" in states else None
    return out


def greedy(plan: Plan, model) -> list[dict]:
    """Greedy decoding of plan.new_tokens tokens per prompt (batch size 1): tokens [G], top-5 [G, 5] and the
    next-token log-probabilities [G, V] teacher-forced on the reference's tokens (plan.ref_tokens, step by step
    through the cache: the decode path) for KL per position; on the run's own tokens where they are the same."""
    out = []
    for i, ids in enumerate(plan.prompts):
        x = torch.tensor([ids], device=plan.device)
        with torch.inference_mode():
            g = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=plan.new_tokens,
                min_new_tokens=plan.new_tokens,
                do_sample=False,
                num_beams=1,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=plan.tok.pad_token_id,
            )
        logits = torch.stack(g.logits).squeeze(1).float()  # [G, V]
        tokens = g.sequences[0, len(ids) :].tolist()
        forced = plan.ref_tokens[i] if plan.ref_tokens else tokens
        lp = logits if forced == tokens else _forced_logits(model, x[0], forced)
        out.append({"tokens": tokens, "top5": logits.topk(5, -1).indices.tolist(), "logprobs": lp.log_softmax(-1)})
    return out


def _forced_logits(model, prompt: torch.Tensor, forced: list[int]) -> torch.Tensor:
    """Next-token logits [G, V] (float32) decoding `forced` one token at a time through the KV cache."""
    from flashcheck.validate.kvcache import _step_logits

    with torch.inference_mode():
        _, logits = _step_logits(model, prompt, len(forced), torch.tensor(forced, device=prompt.device))
    return logits.float()
