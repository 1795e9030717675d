"""The verdict rule. A run in dtype X is compared with the reference (eager, fp32) and judged against the
deviation the number format alone causes, D_f(X) (eager in X vs the reference; for fp32, the reference vs
an fp64 run):

    deviation <= k * D_f(X) + D_ref + floor(X)

per layer, for embeddings, norms, similarities, logits and the invariance checks. D_ref is the reference's
own deviation from fp64 (the triangle inequality: |run - ref| <= |run - exact| + |ref - exact|, so for
fp32 the bound is (k + 1) D_f, the peers' "k times the baseline's error against exact"); floor(X) is the
rounding floor of the format (flash-attention's atol rule); k comes from the spread of D_f over the texts
(compare.spread_k), at least 2. Retrieval rankings may change only where the allowed similarity deviation
explains it (near ties of the reference). NaN/Inf anywhere fails.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

import flashcheck.validate.compare as cmp
from flashcheck.validate.loading import DTYPES
from flashcheck.validate.result import Check, Comparison, LayerDeviation, layer_name
from flashcheck.validate.run import RunOutput

TOLERANCES = ("strict", "default", "loose")


def k_from_spread(spread: float, tolerance: str | float) -> float:
    """strict: the spread itself (>= 1); default: never below 2 (the peers' factor); loose: twice default;
    a number: that k."""
    if not isinstance(tolerance, str):
        return float(tolerance)
    base = max(1.0, spread)
    return {"strict": base, "default": max(cmp.K_MIN, base), "loose": 2 * max(cmp.K_MIN, base)}[tolerance]


@dataclass(slots=True)
class Context:
    """The format-only deviation of one dtype, the reference's own, and the bounds they set."""

    dtype: str
    k: float
    spread: float
    ref: RunOutput  # eager fp32
    base: RunOutput  # eager in this dtype (for fp32: the reference itself)
    layer_f: list[float]  # [Ly] format-only max deviation per layer
    bounds: list[float]  # [Ly] k * layer_f + layer_ref + floor
    emb_f: dict  # format-only embedding figures
    emb_bound: dict  # max_rel_error and norm_wasserstein bounds
    sim_bound: float  # allowed max |similarity - reference similarity|
    sim_f: float  # format-only max similarity deviation
    retrieval_f: dict | None  # format-only top-k overlap and tau (None: not measured, fp32)
    logits_f: dict | None
    logits_bound: float | None
    n_texts: int  # sample texts (the max-length rows follow them and take no part in retrieval)
    topk: int
    notes: tuple[str, ...] = ()

    @property
    def u(self) -> float:
        return cmp.unit_roundoff(DTYPES[self.dtype])


def _probe_dev(a: RunOutput, b: RunOutput) -> torch.Tensor:
    if not torch.equal(a.probe_ids, b.probe_ids):
        raise AssertionError("probe tokens of two runs differ; they must come from one plan")
    return cmp.per_text_layer_max(a.probe, b.probe, a.probe_ids)


def _aligned(a: RunOutput, b: RunOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into a and b of the texts both have."""
    ia = torch.isin(a.emb_ids, b.emb_ids).nonzero().flatten()
    return ia, torch.searchsorted(b.emb_ids, a.emb_ids[ia])


def _emb_pair(a: RunOutput, b: RunOutput) -> dict:
    """Embedding figures of a against b on the texts both have."""
    ia, ib = _aligned(a, b)
    return cmp.embedding_stats(a.emb[ia], b.emb[ib], a.norms[ia], b.norms[ib])


def _probe_sim_dev(a: RunOutput, b: RunOutput) -> float:
    """max |S_a - S_b| over all pairs of the texts both have (similarity matrices of unit embeddings)."""
    ia, ib = _aligned(a, b)
    ea, eb = (cmp.similarities(e, e.shape[0] // 2) for e in (a.emb[ia], b.emb[ib]))
    return float((ea - eb).abs().max()) if ea.numel() else 0.0


@dataclass(frozen=True, slots=True)
class _RefOwn:
    """The reference's own deviation from fp64 (zeros when no fp64 run)."""

    layers: list[float]
    rel: float
    w1: float
    sim: float
    logits: float

    @classmethod
    def of(cls, ref: RunOutput, fp64: RunOutput | None) -> _RefOwn:
        if fp64 is None:
            return cls([0.0] * len(ref.probe), 0.0, 0.0, 0.0, 0.0)
        e = _emb_pair(ref, fp64)
        lg = 0.0 if ref.last_logits is None else cmp.logits_stats(ref.last_logits, fp64.last_logits, None, None)
        return cls(
            [float(x) for x in _probe_dev(ref, fp64).amax(-1)],
            e["max_rel_error"],
            e["norm_wasserstein"],
            _probe_sim_dev(ref, fp64),
            lg if isinstance(lg, float) else lg["max_abs"],
        )


def make_context(
    dtype: str,
    ref: RunOutput,
    base: RunOutput | None,
    fp64: RunOutput | None,
    *,
    tolerance: str | float,
    n_texts: int,
    topk: int,
) -> Context:
    """The context of `dtype`: `base` is eager in dtype (ignored for fp32, whose format-only deviation is
    the reference's own against `fp64`; None when that could not run: the rounding floor alone)."""
    own = _RefOwn.of(ref, fp64)
    pair = (ref, fp64) if dtype == "fp32" else (base, ref)
    measured = pair[1] is not None
    dev = _probe_dev(*pair) if measured else torch.zeros(len(ref.probe), 1, dtype=torch.float64)
    spread = cmp.spread_k(dev)
    k = k_from_spread(spread, tolerance)
    u = cmp.unit_roundoff(DTYPES[dtype])
    layer_f = [float(x) for x in dev.amax(-1)]
    floors = [cmp.rounding_floor(h, DTYPES[dtype]) for h in ref.probe]
    bounds = [k * f + r + fl for f, r, fl in zip(layer_f, own.layers, floors, strict=True)]
    emb_f = _emb_pair(*pair) if measured else {"max_rel_error": 0.0, "norm_wasserstein": 0.0}
    emb_bound = {
        "max_rel_error": k * emb_f["max_rel_error"] + own.rel + 2 * u,
        "norm_wasserstein": k * emb_f["norm_wasserstein"] + own.w1 + 2 * u * float(ref.norms.mean()),
    }
    retrieval_f, sim_f = None, own.sim
    if dtype != "fp32":
        sims = [cmp.similarities(r.emb[:n_texts], n_texts // 2) for r in pair]
        retrieval_f = cmp.retrieval_agreement(sims[0], sims[1], topk)
        sim_f = float((sims[0] - sims[1]).abs().max())
    logits_f = logits_bound = None
    if ref.last_logits is not None:
        logits_f = cmp.logits_stats(pair[0].last_logits, pair[1].last_logits, None, None) if measured else None
        f_max = logits_f["max_abs"] if logits_f else 0.0
        logits_bound = k * f_max + own.logits + cmp.rounding_floor(ref.last_logits, DTYPES[dtype])
    notes = () if measured else (f"{dtype}: the format-only deviation was not measured; rounding floor only",)
    return Context(
        dtype,
        k,
        spread,
        ref,
        base if dtype != "fp32" else ref,
        layer_f,
        bounds,
        emb_f,
        emb_bound,
        k * sim_f + own.sim + 4 * u,
        sim_f,
        retrieval_f,
        logits_f,
        logits_bound,
        n_texts,
        topk,
        notes,
    )


def _worst_layer_check(name: str, devs: list[float] | None, ctx: Context) -> list[Check]:
    """The first layer over its bound, else the one closest to it (none when devs is None)."""
    if devs is None:
        return []
    margins = [d / b if b > 0 else (0.0 if d == 0 else math.inf) for d, b in zip(devs, ctx.bounds, strict=True)]
    bad = next((i for i, m in enumerate(margins) if not m <= 1), None)
    i = bad if bad is not None else max(range(len(margins)), key=lambda j: margins[j])
    detail = "first layer over its bound" if bad is not None else "layer closest to its bound"
    return [Check(f"{name} at {layer_name(i)}", devs[i], ctx.bounds[i], detail)]


def _embedding_checks(run: RunOutput, against: RunOutput, ctx: Context) -> tuple[dict, list[Check]]:
    emb = _emb_pair(run, against)
    return emb, [
        Check("embeddings: max relative error", emb["max_rel_error"], ctx.emb_bound["max_rel_error"]),
        Check("embedding norms: Wasserstein-1", emb["norm_wasserstein"], ctx.emb_bound["norm_wasserstein"]),
    ]


def _retrieval_checks(run: RunOutput, ctx: Context) -> tuple[dict, list[Check]]:
    """Similarity deviation within its bound; top-k overlap and Kendall tau against the reference's rankings,
    allowed to change only on the reference's near ties that the similarity bound explains."""
    n, nq = ctx.n_texts, ctx.n_texts // 2
    sim_ref = cmp.similarities(ctx.ref.emb[:n], nq)
    sim = cmp.similarities(run.emb[:n], nq)
    got = cmp.retrieval_agreement(sim, sim_ref, ctx.topk)
    explained = cmp.retrieval_floors(sim_ref, ctx.sim_bound, ctx.topk)
    fmt = ctx.retrieval_f or {}
    info = {
        **got,
        "similarity_max_abs": float((sim - sim_ref).abs().max()),
        "similarity_bound": ctx.sim_bound,
        "format_only_similarity_max_abs": ctx.sim_f,
        "format_only_topk_overlap": fmt.get("topk_overlap"),
        "format_only_kendall_tau": fmt.get("kendall_tau"),
        "explained_by_near_ties": explained,
        "queries": nq,
        "corpus": n - nq,
        "topk": ctx.topk,
    }
    return info, [
        Check("retrieval: similarity max abs", info["similarity_max_abs"], ctx.sim_bound),
        Check(
            f"retrieval: top-{ctx.topk} disagreement",
            1 - got["topk_overlap"],
            explained["topk_overlap"],
            "bound: top-k items the allowed similarity deviation can displace",
        ),
        Check(
            "retrieval: 1 - Kendall tau",
            1 - got["kendall_tau"],
            explained["kendall_tau"],
            "bound: pairs the allowed similarity deviation can swap",
        ),
    ]


def _causal_checks(run: RunOutput, against: RunOutput, ctx: Context) -> tuple[dict | None, dict | None, list[Check]]:
    if run.last_logits is None or against.last_logits is None or ctx.logits_bound is None:
        return None, None, []
    same = run.argmax is not None and against.argmax is not None and run.argmax.shape == against.argmax.shape
    logits = cmp.logits_stats(
        run.last_logits, against.last_logits, run.argmax if same else None, against.argmax if same else None
    )
    logits["format_only"] = ctx.logits_f
    checks = [Check("logits at the last token: max abs", logits["max_abs"], ctx.logits_bound)]
    gen = None
    if run.generation is not None and against.generation is not None:
        gen = cmp.generation_agreement(run.generation, against.generation)
        bad = sum(not p["close"] for p in gen["prompts"])
        checks.append(
            Check(
                "greedy generation: prompts not close",
                bad,
                0,
                "at the first differing token each side's token must be in the other's top-5",
            )
        )
    return logits, gen, checks


def _invariance_context(ctx: Context) -> Context:
    """The invariance checks' bounds: each layer's bound plus how far the reference itself (eager fp32) moves
    under the same change of batch or padding side. Batching changes the summation order of fp32 GEMMs (on one
    thread, batch 1 and batch N take other BLAS paths), so no run is held to more invariance than the reference
    has; where the format-only deviation could not be measured (no room for fp64) the floor alone was less."""
    ref_inv = ctx.ref.invariance
    own = [max(a, b) for a, b in zip(ref_inv.get("batch_size") or [0.0] * len(ctx.bounds),
                                     ref_inv.get("left_padding") or [0.0] * len(ctx.bounds), strict=True)]  # fmt: skip
    return dataclasses.replace(ctx, bounds=[b + o for b, o in zip(ctx.bounds, own, strict=True)])


def judge(run: RunOutput, ctx: Context, against: RunOutput | None = None) -> Comparison:
    """Compare `run` with `against` (default: the reference) in the context of run's dtype."""
    against = against or ctx.ref
    full = not (against.probe_only or run.probe_only)
    devs = [float(x) for x in _probe_dev(run, against).amax(-1)]
    layers = tuple(
        LayerDeviation(i, d, f, b) for i, (d, f, b) in enumerate(zip(devs, ctx.layer_f, ctx.bounds, strict=True))
    )
    emb, checks = _embedding_checks(run, against, ctx)
    checks = _worst_layer_check("hidden states", devs, ctx) + checks
    retrieval = {}
    if full:
        retrieval, more = _retrieval_checks(run, ctx)
        checks += more
    inv, inv_ctx = run.invariance, _invariance_context(ctx)
    checks += _worst_layer_check("batch invariance (batch vs batch size 1)", inv.get("batch_size"), inv_ctx)
    checks += _worst_layer_check("padding side (left vs right)", inv.get("left_padding"), inv_ctx)
    logits, gen, more = _causal_checks(run, against, ctx)
    impl_only = None
    if run.impl != "eager" and ctx.base.dtype == run.dtype:
        impl_only = float(_probe_dev(run, ctx.base)[-1].max())
    return Comparison(
        a=f"{run.impl}:{run.dtype}",
        b=f"{against.impl}:{against.dtype}",
        impl=run.impl,
        dtype=run.dtype,
        k=ctx.k,
        checks=tuple(checks + more),
        layers=layers,
        embeddings=emb,
        format_only=ctx.emb_f,
        retrieval=retrieval,
        impl_only_max_abs=impl_only,
        nonfinite=run.nonfinite or inv.get("nonfinite"),
        invariance=inv,
        logits=logits,
        generation=gen,
        seconds=run.seconds,
        kernels=tuple(run.kernels),
        spread=ctx.spread,
    )
