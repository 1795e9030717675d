"""Overhead of the guard over calling its preferred backend directly, on MiniLM-sized attention.

    python benchmarks/bench_guard.py [--batch 32 --heads 12 --seq-len 128 --head-dim 32] [--dtype float32]
        [--rounds 9 --every 100 --threads 2]
Targets (issue 11): under 5% with shadow checks off, under 15% with a shadow check every 100th call.

Two estimates. End to end: the variants (direct, guard, guard + shadow checking every `every`-th call, and
guard + shadow with the default overhead cap, which skips checks) take turns call by call, so that a busy
machine slows them alike; a round is `every` turns (exactly one check per shadow variant), its mean time
per call is divided by the direct one's, and the median over rounds reported.
By parts: the guard's own work per call (the guard around a backend that returns at once) and the time
of one shadow check, each the median of many repetitions, over the direct call's median time; less
sensitive to a machine shared with other jobs."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from flashcheck.backends import Backend, get_backend
from flashcheck.guard import Guard, ShadowConfig


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def end_to_end(preferred: str, qkv, rounds: int, every: int) -> dict[str, float]:
    """Median over rounds of (variant's time per call) / (direct time per call)."""
    backend = get_backend(preferred)
    variants = {
        "direct": lambda q, k, v: backend.forward(q, k, v),
        "guard": Guard(preferred, "sdpa-math"),
        # max_overhead=None: every `every`-th call is checked (the default cap would skip checks on a busy machine)
        "guard+shadow": Guard(preferred, "sdpa-math", shadow=ShadowConfig(every=every, max_overhead=None)),
        "guard+shadow capped": Guard(preferred, "sdpa-math", shadow=ShadowConfig(every=every)),  # default cap
    }
    for fn in variants.values():  # warm up, before the first shadow check (call `every`)
        for _ in range(min(3, every - 1)):
            fn(*qkv)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        total = dict.fromkeys(variants, 0.0)
        names = list(variants)
        for turn in range(every):  # one call of each variant in turn, the order rotating: no variant's slot
            for name in names[turn % len(names) :] + names[: turn % len(names)]:  # is favoured
                t0 = time.perf_counter()
                variants[name](*qkv)
                total[name] += time.perf_counter() - t0
        for name in variants:
            times[name].append(total[name] / every)
    out = {f"{n}_ms": 1e3 * statistics.median(t) for n, t in times.items()}
    for name in variants.keys() - {"direct"}:
        out[name] = statistics.median(t / d for t, d in zip(times[name], times["direct"], strict=True))
    out["checks"] = variants["guard+shadow"].stats().shadow.checks
    capped = variants["guard+shadow capped"].stats().shadow
    out["capped_checks"], out["capped_skipped"] = capped.checks, capped.skipped
    return out


class _Instant(Backend):
    """Returns a stored output at once: what remains of a guarded call is the guard's own work."""

    def __init__(self, out: torch.Tensor) -> None:
        super().__init__("instant", "benchmark stand-in")
        self.out = out

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        return self.out


def by_parts(preferred: str, qkv, reps: int, every: int) -> dict[str, float]:
    """The guard's work per call and one shadow check's time, over the direct call's time."""
    backend = get_backend(preferred)
    direct = _median_time(lambda: backend.forward(*qkv), reps)
    out = backend.forward(*qkv)
    instant = _Instant(out)
    guard = Guard(instant, "sdpa-math")
    own = _median_time(lambda: guard(*qkv), 10 * reps) - _median_time(lambda: instant.forward(*qkv), 10 * reps)
    shadowed = Guard(instant, "sdpa-math", shadow=ShadowConfig(every=1, max_overhead=None))
    check = _median_time(lambda: shadowed(*qkv), reps) - own
    return {
        "direct_ms": 1e3 * direct,
        "guard_ms": 1e3 * own,
        "check_ms": 1e3 * check,
        "guard": 1 + own / direct,
        "guard+shadow": 1 + (own + check / every) / direct,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--preferred", default="sdpa-flash")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--every", type=int, default=100, help="shadow check every N-th call")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    qkv = tuple(torch.randn(shape, generator=g).to(getattr(torch, args.dtype)) for _ in range(3))
    e2e = end_to_end(args.preferred, qkv, args.rounds, args.every)
    parts = by_parts(args.preferred, qkv, 15, args.every)
    print(f"shape {list(shape)} {args.dtype}, preferred {args.preferred}, {args.threads} threads")
    print(
        f"  end to end ({args.rounds} rounds x {args.every} calls; direct {e2e['direct_ms']:.2f} ms/call, "
        f"{e2e['checks']} checks):"
    )
    for name, target in (("guard", 5), ("guard+shadow", 15)):
        print(f"    {name:<13} {100 * (e2e[name] - 1):+6.2f}%  (target < {target}%)")
    print(
        f"    default cap (max_overhead={ShadowConfig().max_overhead:g}): "
        f"{100 * (e2e['guard+shadow capped'] - 1):+6.2f}% "
        f"({e2e['capped_checks']} checks, {e2e['capped_skipped']} skipped)"
    )
    print(
        f"  by parts (direct {parts['direct_ms']:.2f} ms, guard's own work {parts['guard_ms']:.3f} ms/call, "
        f"one check {parts['check_ms']:.1f} ms):"
    )
    for name, target in (("guard", 5), ("guard+shadow", 15)):
        print(f"    {name:<13} {100 * (parts[name] - 1):+6.2f}%  (target < {target}%)")
    print(json.dumps({"end_to_end": e2e, "by_parts": parts}))


if __name__ == "__main__":
    main()
