"""Overhead of the guard over calling its preferred backend directly, on MiniLM-sized attention.

    python benchmarks/bench_guard.py [--batch 32 --heads 12 --seq-len 128 --head-dim 32] [--dtype float32]
        [--rounds 15 --calls 20 --threads 2]
Targets (issue 11): under 5% with shadow checks off, under 15% with a shadow check every 100th call.
Rounds interleave the variants (direct, guard, guard + shadow) so that a busy machine slows them alike;
the ratio of each round's mean time per call is taken, and the median over rounds reported."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from flashcheck.backends import get_backend
from flashcheck.guard import Guard, ShadowConfig


def _per_call(fn, q, k, v, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--preferred", default="sdpa-flash")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=None, help="calls per variant per round (default: --every)")
    ap.add_argument("--every", type=int, default=100, help="shadow check every N-th call")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    calls = args.calls or args.every  # each round holds the same number of shadow checks
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(3))
    backend = get_backend(args.preferred)
    variants = {
        "direct": lambda q, k, v: backend.forward(q, k, v),
        "guard": Guard(args.preferred, "sdpa-math"),
        "guard+shadow": Guard(args.preferred, "sdpa-math", shadow=ShadowConfig(every=args.every)),
    }
    for fn in variants.values():  # warm up (no shadow check yet: the first is at call `every`)
        for _ in range(min(3, args.every - 1)):
            fn(q, k, v)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(_per_call(fn, q, k, v, calls))
    ratios = {
        name: statistics.median(t / d for t, d in zip(times[name], times["direct"], strict=True))
        for name in variants
        if name != "direct"
    }
    checks = variants["guard+shadow"].stats().shadow.checks
    print(
        f"shape {list(shape)} {args.dtype}, preferred {args.preferred}, {args.threads} threads, "
        f"{args.rounds} rounds x {calls} calls per variant"
    )
    for name in variants:
        print(f"  {name:<13} median {1e3 * statistics.median(times[name]):8.3f} ms/call")
    print(f"  guard overhead, shadow off:          {100 * (ratios['guard'] - 1):+6.2f}%  (target < 5%)")
    print(
        f"  guard overhead, shadow 1 in {args.every:<5}:  {100 * (ratios['guard+shadow'] - 1):+6.2f}%  "
        f"(target < 15%; {checks} checks ran)"
    )
    print(json.dumps({"ratio_guard": ratios["guard"], "ratio_guard_shadow": ratios["guard+shadow"], "checks": checks}))


if __name__ == "__main__":
    main()
