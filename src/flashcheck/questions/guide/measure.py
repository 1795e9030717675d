"""The production guide's measurements, one function per kind: cost (wall time and peak memory against the
length, forward and forward+backward), latency spread over many calls, the fp16 overflow boundaries (input
scale x length; keys at the maximum) and the stage attribution of the kernel-realistic policy.

Each function returns a plain dict (a JSON record). Legend: q [B, H, Lq, D]; k, v [B, H, Lk, D]."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch

from flashcheck.core.inputs import InputSpec, make_grad, make_qkv
from flashcheck.core.metrics import rel_l2
from flashcheck.measure.method import Method, parse_method

OCTAVE_STEPS = 8  # the scale search's resolution: sigma = 2 ** (i / 8), about 9% per step
SCALE_TOP = 16 * OCTAVE_STEPS  # sigma = 2**16 overflows every fp16 input
FP16_SUM_OVERFLOW = 65520  # keys at the row maximum from which an fp16 softmax sum (= the key count) is inf
WRONG = 0.5  # relative L2 error vs the exact output above which a finite output counts as wrong


def twin(method: str, fmt: str = "bf16") -> str:
    """The same method in another format: "flash:fp16-mixed" -> "flash:bf16-mixed"."""
    kernel, _, spec = method.partition(":")
    return f"{kernel}:{spec.replace('fp16', fmt)}"


def _method(text: str) -> Method:
    algo = "fa1" if text.endswith("@fa1") else "fa2"
    return parse_method(text.removesuffix("@fa1"), algorithm=algo)


def _call(m: Method, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None) -> Callable:
    """A no-argument function running m's forward (and backward with dO) on prepared inputs."""
    fn = m.runner()
    args = m.prepare(q, k, v)
    if do is None:

        def fwd() -> None:
            with torch.no_grad():
                fn(*args)

        return fwd
    leaves = [a.detach().requires_grad_(True) for a in args]

    def fwd_bwd() -> None:
        out = fn(*leaves)
        torch.autograd.grad(out, leaves, do.to(out.dtype))  # returned, not accumulated: no state between calls

    return fwd_bwd


def peak_bytes(fn: Callable[[], object]) -> int:
    """The peak of bytes held by tensors that fn allocates (torch.profiler's memory events; the inputs,
    allocated before, are not counted; outputs and gradients are)."""
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # no "USDT profiler_start" lines on stderr
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def cost(method: str, seq_len: int, *, backward: bool, heads: int, head_dim: int, repeats: int) -> dict:
    """Wall time of `repeats` calls (after one warm-up call) and the peak tensor memory of one call."""
    m = _method(method)
    spec = InputSpec(batch=1, heads=heads, seq_len=seq_len, head_dim=head_dim, seed=0)
    q, k, v = make_qkv(spec)
    fn = _call(m, q, k, v, make_grad(q.shape, 0) if backward else None)
    fn()
    mem = peak_bytes(fn)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"times": times, "peak_bytes": mem}


def latency(methods: tuple[str, ...], seq_len: int, *, heads: int, head_dim: int, calls: int, blocks: int) -> dict:
    """Per-call forward latency: `calls` calls per method in `blocks` blocks, the methods' blocks interleaved
    so that each block of one method shares its time window (and the machine's load) with the others'."""
    spec = InputSpec(batch=1, heads=heads, seq_len=seq_len, head_dim=head_dim, seed=0)
    q, k, v = make_qkv(spec)
    fns = {name: _call(_method(name), q, k, v, None) for name in methods}
    for fn in fns.values():
        fn()
    out: dict[str, list[list[float]]] = {name: [] for name in methods}
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for name, fn in fns.items():
            ts = []
            for _ in range(per_block):
                start = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - start)
            out[name].append(ts)
    return {"blocks": out}


def scaled_inputs(seq_len: int, i: int, *, head_dim: int = 64, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """N(0, 1) Q, K, V [1, 1, L, D] times sigma = 2 ** (i / OCTAVE_STEPS), float64."""
    q, k, v = make_qkv(InputSpec(batch=1, heads=1, seq_len=seq_len, head_dim=head_dim, seed=seed))
    sigma = 2.0 ** (i / OCTAVE_STEPS)
    return q * sigma, k * sigma, v * sigma


def finite_at_scale(method: str, seq_len: int, i: int, *, head_dim: int = 64, seed: int = 0) -> bool:
    """Whether `method`'s output is all finite on scaled_inputs(seq_len, i)."""
    out = _method(method).run(*scaled_inputs(seq_len, i, head_dim=head_dim, seed=seed))
    return bool(torch.isfinite(out).all())


def _bisect(ok: Callable[[int], bool], lo: int, hi: int, seen: dict[int, bool]) -> int:
    """The first index in (lo, hi] that is not ok, given ok(lo) and not ok(hi) (monotone between)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seen[mid] = ok(mid)
        lo, hi = (mid, hi) if seen[mid] else (lo, mid)
    return hi


def _search(ok: Callable[[int], bool], grid: list[int]) -> tuple[int | None, dict[int, bool], bool]:
    """(first failing index or None, every index tried and its outcome, monotone over the grid). The grid
    is tried first; the bisection runs between its last passing point and the next one."""
    seen = {i: ok(i) for i in grid}
    bad = [i for i in grid if not seen[i]]
    if not bad:
        return None, seen, True
    first = bad[0]
    monotone = all(not seen[i] for i in grid if i >= first)
    before = [i for i in grid if i < first]
    found = first if not before else _bisect(ok, before[-1], first, seen)
    return found, seen, monotone


def scale_boundary(method: str, seq_len: int, *, head_dim: int = 64, seed: int = 0) -> dict:
    """The smallest input scale sigma = 2 ** (i / 8) (i in 0..128) at which `method`'s output is not all
    finite at this length: every 4 octaves tried, then a bisection to one step. boundary_i None: finite
    up to sigma = 2**16."""
    grid = list(range(0, SCALE_TOP + 1, 4 * OCTAVE_STEPS))
    found, seen, monotone = _search(lambda i: finite_at_scale(method, seq_len, i, head_dim=head_dim, seed=seed), grid)
    return {
        "boundary_i": found,
        "inputs_overflow_i": fp16_input_overflow_i(seq_len, head_dim=head_dim, seed=seed),
        "boundary_sigma": None if found is None else 2.0 ** (found / OCTAVE_STEPS),
        "points": {str(i): v for i, v in sorted(seen.items())},
        "monotone": monotone,
    }


def tied_inputs(seq_len_k: int, *, queries: int = 16, head_dim: int = 64, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every key the same vector (so every score of a row is its maximum), Q and V N(0, 1): float64,
    q [1, 1, queries, D], k and v [1, 1, Lk, D]. The exact output of every row is the mean of V."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, queries, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, head_dim, generator=g, dtype=torch.float64).expand(1, 1, seq_len_k, head_dim)
    v = torch.randn(1, 1, seq_len_k, head_dim, generator=g, dtype=torch.float64)
    return q, k.contiguous(), v


def tied_outcome(method: str, seq_len_k: int, *, queries: int = 16, head_dim: int = 64, seed: int = 0) -> str:
    """ "ok", "wrong" (finite, relative L2 error vs the exact mean of V above WRONG) or "non-finite"."""
    q, k, v = tied_inputs(seq_len_k, queries=queries, head_dim=head_dim, seed=seed)
    out = _method(method).run(q, k, v)
    if not bool(torch.isfinite(out).all()):
        return "non-finite"
    exact = v.mean(dim=-2, keepdim=True).expand_as(out)
    return "wrong" if rel_l2(out, exact) > WRONG else "ok"


def sum_boundary(method: str, lo: int, hi: int, *, queries: int = 16, head_dim: int = 64) -> dict:
    """The smallest number of keys, all at the row maximum, in [lo, hi] at which the output is wrong or not
    finite (bisection to one key; None: ok up to hi), and what it turned into there."""
    outcome: dict[int, str] = {}

    def ok(n: int) -> bool:
        outcome[n] = tied_outcome(method, n, queries=queries, head_dim=head_dim)
        return outcome[n] == "ok"

    found, seen, monotone = _search(ok, [lo, (lo + hi) // 2, hi])
    return {
        "boundary_keys": found,
        "outcome": None if found is None else outcome[found],
        "points": {str(n): outcome[n] for n in sorted(seen)},
        "monotone": monotone,
        "searched": True,
    }


def sum_points(method: str, keys: list[int], *, queries: int = 16, head_dim: int = 64) -> dict:
    """The outcome with `keys` keys all at the row maximum, at each given number of keys (no search): the
    same record as sum_boundary, the first bad point standing for the boundary."""
    outcome = {n: tied_outcome(method, n, queries=queries, head_dim=head_dim) for n in sorted(keys)}
    bad = [n for n, o in outcome.items() if o != "ok"]
    return {
        "boundary_keys": bad[0] if bad else None,
        "outcome": outcome[bad[0]] if bad else None,
        "points": {str(n): o for n, o in outcome.items()},
        "monotone": all(outcome[n] != "ok" for n in outcome if bad and n >= bad[0]),
        "searched": False,
    }


def fp16_input_overflow_i(seq_len: int, *, head_dim: int = 64, seed: int = 0) -> int | None:
    """The first scale index at which an input entry itself rounds to inf in fp16 (|sigma x| >= 65520)."""
    biggest = max(float(t.abs().max()) for t in scaled_inputs(seq_len, 0, head_dim=head_dim, seed=seed))
    return next((i for i in range(SCALE_TOP + 1) if 2.0 ** (i / OCTAVE_STEPS) * biggest >= 65520.0), None)


def fp16_score_boundary_i(seq_len: int, *, head_dim: int = 64, seed: int = 0) -> int | None:
    """Closed form for the uniform fp16 policy: the first scale index at which a score, formed in fp32 from
    the fp16-rounded inputs and scaled by 1/sqrt(D), rounds to +inf in fp16 (>= 65520), so the running max
    is inf and inf - inf gives NaN. None when no index up to SCALE_TOP overflows the scores."""
    from flashcheck.core.numerics import Format, round_to

    for i in range(SCALE_TOP + 1):
        q, k, _ = scaled_inputs(seq_len, i, head_dim=head_dim, seed=seed)
        qr, kr = (round_to(t, Format.FP16).float() for t in (q, k))
        if not (torch.isfinite(qr).all() and torch.isfinite(kr).all()):
            return i  # the inputs themselves overflow first
        s = (qr @ kr.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
        if float(s.max()) >= 65520.0:
            return i
    return None


def explain(seq_len: int, *, heads: int, head_dim: int, policy: str = "bf16-mixed") -> dict:
    """The stage attribution (measure.attribution) of the kernel-realistic policy at one length."""
    from flashcheck.core.numerics import parse_policy
    from flashcheck.measure.attribution import attribute

    spec = InputSpec(batch=1, heads=heads, seq_len=seq_len, head_dim=head_dim, seed=0)
    return attribute(parse_policy(policy), spec, block_q=128, block_k=128, algorithm="fa2").to_dict()


def gpu_same(*, seq_len: int = 2048, heads: int = 8, head_dim: int = 64) -> dict:
    """On a CUDA GPU: are SDPA's flash backend and flash-attn bit-identical on the same fp16 inputs?"""
    from flashcheck.backends import get_backend

    q, k, v = (t.to(torch.float16) for t in make_qkv(InputSpec(batch=1, heads=heads, seq_len=seq_len, seed=0)))
    fa = get_backend("flash-attn")
    avail = fa.available(torch.float16, "cuda")
    if not avail.ok:
        return {"available": False, "reason": avail.reason}
    a = get_backend("sdpa-flash").run(q, k, v, device="cuda")
    b = fa.run(q, k, v, device="cuda")
    diff = float((a.double() - b.double()).abs().max())
    return {"available": True, "identical": bool(torch.equal(a, b)), "max_abs": diff, "seq_len": seq_len}


def gpu_deterministic(*, seq_len: int = 4096, heads: int = 16, head_dim: int = 64, calls: int = 50) -> dict:
    """On a CUDA GPU: SDPA's default forward timed with torch.backends.cudnn.deterministic off and on, in
    interleaved blocks of `calls` calls (CUDA-synchronised), five blocks each."""
    spec = InputSpec(batch=1, heads=heads, seq_len=seq_len, head_dim=head_dim, seed=0)
    q, k, v = (t.to("cuda", torch.bfloat16) for t in make_qkv(spec))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    prev = torch.backends.cudnn.deterministic
    out: dict[str, list[list[float]]] = {"off": [], "on": []}
    try:
        for _ in range(5):
            for name, flag in (("off", False), ("on", True)):
                torch.backends.cudnn.deterministic = flag
                sdpa(q, k, v)
                torch.cuda.synchronize()
                ts = []
                for _ in range(calls):
                    start = time.perf_counter()
                    sdpa(q, k, v)
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - start)
                out[name].append(ts)
    finally:
        torch.backends.cudnn.deterministic = prev
    return {"blocks": out, "seq_len": seq_len}
