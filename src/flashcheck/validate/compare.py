"""Deviation of one run from another: per layer and per text, embeddings, retrieval rankings, logits and
greedy generations; and the factor k that the format's own deviation spread gives.

Shapes: Ly layers (hidden-state index 0 = embeddings), T probe tokens, n probe texts, N texts, H hidden,
Q queries, C corpus texts, V vocabulary.
"""

from __future__ import annotations

import math

import torch

from flashcheck.core.metrics import wasserstein1

K_MIN = 2.0  # the peers' factor (flash-attention's tests): k is never below it
SPLITS = 200  # random halvings of the probe texts that estimate the format's own spread
SPLIT_QUANTILE = 0.95


def per_text_layer_max(a: list[torch.Tensor], b: list[torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """[Ly, n] max |a - b| per layer and probe text over its valid tokens (a, b: per layer [T, H]; ids [T]);
    inf where either side is non-finite. Columns follow torch.unique(ids)."""
    _, col = torch.unique(ids, return_inverse=True)
    n = int(col.max()) + 1 if col.numel() else 0
    out = torch.zeros(len(a), n, dtype=torch.float64)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        d = (x.to(torch.float64) - y.to(torch.float64)).abs().nan_to_num(nan=math.inf).amax(-1)
        out[i].scatter_reduce_(0, col, d, reduce="amax")
    return out


def spread_k(dev_f: torch.Tensor, seed: int = 0) -> float:
    """How much the worst format-only deviation changes with which texts are measured: the 95th percentile
    over SPLITS random halvings of the texts and over layers of max(half A) / max(half B) (dev_f [Ly, n]),
    at least 1. Layers where the format causes no deviation are left out."""
    dev = dev_f[(dev_f.amax(-1) > 0) & torch.isfinite(dev_f).all(-1)]
    n = dev.shape[-1]
    if n < 4 or dev.shape[0] == 0:
        return 1.0
    g = torch.Generator().manual_seed(seed)
    ratios = []
    for _ in range(SPLITS):
        perm = torch.randperm(n, generator=g)
        ma, mb = dev[:, perm[: n // 2]].amax(-1), dev[:, perm[n // 2 :]].amax(-1)
        ratios.append(torch.maximum(ma, mb) / torch.minimum(ma, mb).clamp(min=1e-300))
    return max(1.0, float(torch.quantile(torch.cat(ratios), SPLIT_QUANTILE)))


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """2 max |(r + 0.3 - 0.3) - r| with r the reference rounded to `dtype` (flash-attention's atol), for
    finite r; fp64 counts as fp32 (the floor of the format that is being judged)."""
    if dtype == torch.float64:
        dtype = torch.float32
    r = ref[torch.isfinite(ref)].to(dtype)
    return 2.0 * float(((r + 0.3 - 0.3) - r).abs().max().to(torch.float64)) if r.numel() else 0.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2 of the format (fp64 counts as fp32)."""
    return torch.finfo(torch.float32 if dtype == torch.float64 else dtype).eps / 2


def embedding_stats(a: torch.Tensor, ref: torch.Tensor, norms_a: torch.Tensor, norms_ref: torch.Tensor) -> dict:
    """Cosine (min, mean, percentiles), max relative L2 error and the 1-D Wasserstein distance between the
    norm distributions, for embeddings a and ref [N, H] (row-aligned)."""
    cos = torch.nn.functional.cosine_similarity(a, ref, dim=-1, eps=1e-300).nan_to_num(nan=-1.0)
    rel = torch.linalg.vector_norm(a - ref, dim=-1) / torch.linalg.vector_norm(ref, dim=-1).clamp(min=1e-300)
    rel = rel.nan_to_num(nan=math.inf)
    finite = torch.isfinite(norms_a)
    w1 = wasserstein1(norms_a, norms_ref) if bool(finite.all()) else math.inf
    qs = torch.quantile(cos, torch.tensor([0.01, 0.05, 0.5], dtype=cos.dtype)).tolist()
    return {
        "min_cosine": float(cos.min()),
        "mean_cosine": float(cos.mean()),
        "cosine_percentiles": {"p1": qs[0], "p5": qs[1], "p50": qs[2]},
        "max_rel_error": float(rel.max()),
        "norm_wasserstein": w1,
        "cosines": cos,
    }


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=1e-300)


def similarities(emb: torch.Tensor, n_queries: int) -> torch.Tensor:
    """[Q, C] cosine similarity of the first n_queries embeddings (queries) with the rest (corpus)."""
    e = _unit(emb.to(torch.float64))
    return (e[:n_queries] @ e[n_queries:].T).nan_to_num(nan=-2.0)


def kendall_tau_b(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b between each row of x and y ([Q, C]) -> [Q] (1 when a row has no untied pair):
    scipy's O(C log C) per row when installed, else the O(C^2) pairwise count."""
    try:
        from scipy.stats import kendalltau
    except ImportError:
        return kendall_tau_b_pairwise(x, y)
    xs, ys = x.to(torch.float64).numpy(), y.to(torch.float64).numpy()
    taus = [kendalltau(a, b).statistic for a, b in zip(xs, ys, strict=True)]
    # scipy's float arithmetic leaves 1 - 3e-16 for identical rankings; tau's resolution is 2 / C^2, far coarser
    return torch.tensor(taus, dtype=torch.float64).nan_to_num(nan=1.0).round(decimals=12)


def kendall_tau_b_pairwise(x: torch.Tensor, y: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """kendall_tau_b by counting concordant and discordant pairs ([Q, C, C] in chunks of rows)."""
    out = []
    for s in range(0, x.shape[0], chunk):
        a, b = x[s : s + chunk], y[s : s + chunk]
        sa = torch.sign(a[:, :, None] - a[:, None, :]).to(torch.float32)
        sb = torch.sign(b[:, :, None] - b[:, None, :]).to(torch.float32)
        # sums of +-1 are exact in fp32 up to 2**24 terms; the ratio in fp64
        num = (sa * sb).sum((1, 2)).to(torch.float64)
        den = torch.sqrt((sa * sa).sum((1, 2)).to(torch.float64) * (sb * sb).sum((1, 2)).to(torch.float64))
        out.append(torch.where(den > 0, num / den.clamp(min=1), torch.ones_like(num)))
    return torch.cat(out)


def topk_overlap(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """[Q] share of each row's top-k items (by x) that are also in its top-k by y."""
    k = min(k, x.shape[-1])
    tx, ty = x.topk(k, -1).indices, y.topk(k, -1).indices
    return (tx[:, :, None] == ty[:, None, :]).any(-1).to(torch.float64).mean(-1)


def retrieval_agreement(sim: torch.Tensor, sim_ref: torch.Tensor, k: int) -> dict:
    """Mean top-k overlap and mean Kendall tau-b of each query's ranking against the reference's."""
    return {
        "topk_overlap": float(topk_overlap(sim_ref, sim, k).mean()),
        "kendall_tau": float(kendall_tau_b(sim, sim_ref).mean()),
    }


def retrieval_floors(sim_ref: torch.Tensor, delta: float, k: int) -> dict:
    """Disagreement that similarity errors up to `delta` can cause on the reference's near ties: top-k
    items within 2 delta of the (k+1)-th similarity (share of k, mean over queries) and, for tau, twice
    the share of pairs closer than 2 delta (each flip lowers tau-a by 2 / pairs)."""
    s, _ = sim_ref.sort(-1, descending=True)
    c = s.shape[-1]
    k = min(k, c)
    if c <= k:
        over = torch.zeros(s.shape[0], dtype=torch.float64)
    else:
        over = ((s[:, :k] - s[:, k : k + 1]) < 2 * delta).to(torch.float64).mean(-1)
    asc = s.flip(-1).contiguous()
    hi = torch.searchsorted(asc, asc + 2 * delta)  # items below value + 2 delta
    close = (hi - torch.arange(c)[None, :] - 1).clamp(min=0).sum(-1).to(torch.float64)
    pairs = max(c * (c - 1) / 2, 1)
    return {"topk_overlap": float(over.mean()), "kendall_tau": float((2 * close / pairs).clamp(max=2).mean())}


def logits_stats(
    a_last: torch.Tensor, ref_last: torch.Tensor, a_argmax: torch.Tensor | None, ref_argmax: torch.Tensor | None
) -> dict:
    """Top-1 agreement over every valid position (None without both argmax [T_all]), KL(ref || a) and
    max |a - ref| of the last-token logits [P, V]."""
    lp_ref = torch.log_softmax(ref_last.to(torch.float64), -1)
    lp_a = torch.log_softmax(a_last.to(torch.float64), -1)
    kl = (lp_ref.exp() * (lp_ref - lp_a)).sum(-1).nan_to_num(nan=math.inf)
    return {
        "top1_agreement": None
        if a_argmax is None or ref_argmax is None
        else float((a_argmax == ref_argmax).to(torch.float64).mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "max_abs": float((a_last.to(torch.float64) - ref_last.to(torch.float64)).abs().nan_to_num(nan=math.inf).max()),
    }


def generation_agreement(gen: list[dict], ref: list[dict]) -> dict:
    """Greedy sequences against the reference's: per prompt the first position where they differ (None:
    identical) and whether each side's token there is in the other's top-5 (vLLM's check_logprobs_close);
    `close` holds when that is so for every prompt."""
    prompts, same, kls = [], [], []
    for g, r in zip(gen, ref, strict=True):
        pos = next((i for i, (a, b) in enumerate(zip(g["tokens"], r["tokens"], strict=False)) if a != b), None)
        ok = pos is None or (g["tokens"][pos] in r["top5"][pos] and r["tokens"][pos] in g["top5"][pos])
        prompts.append({"first_divergence": pos, "close": ok, "tokens": g["tokens"], "ref_tokens": r["tokens"]})
        same += [a == b for a, b in zip(g["tokens"], r["tokens"], strict=False)]
        if g.get("logprobs") is not None and r.get("logprobs") is not None:
            lr, lg = r["logprobs"].to(torch.float64), g["logprobs"].to(torch.float64)
            kls.append((lr.exp() * (lr - lg)).sum(-1).nan_to_num(nan=math.inf))  # [G] KL(ref || run)
    firsts = [p["first_divergence"] for p in prompts if p["first_divergence"] is not None]
    kl = torch.stack(kls) if kls and len({k.numel() for k in kls}) == 1 else None
    return {
        "prompts": prompts,
        "identical": sum(p["first_divergence"] is None for p in prompts),
        "close": all(p["close"] for p in prompts),
        "token_agreement": sum(same) / len(same) if same else None,
        "first_divergence": min(firsts) if firsts else None,
        "kl_per_position": None if kl is None else kl.mean(0).tolist(),
        "kl_mean": None if kl is None else float(kl.mean()),
        "kl_max": None if kl is None else float(kl.max()),
    }
