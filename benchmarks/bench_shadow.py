"""The guard's shadow check on correct kernels (false alarms) and on the mutants (catches), before and after
the rounding allowance (flashcheck/guard/allowance.py).

    python benchmarks/bench_shadow.py [--checks 10000] [--mutant-seeds 3] [--json out.json]

False alarms: `--checks` shadow checks per dtype (fp32, bf16, fp16) of correct kernels served as the
preferred backend (SDPA math, SDPA's CPU flash kernel, the mutants' clean FA2-style kernel, and for bf16/fp16
SDPA math in true low precision, counted apart), spread over the small shapes a service meets (a decode step,
short prompts, odd lengths, grouped K/V heads), causal and not, over five input distributions; each check is
the guard's own (the steps of ShadowChecker.check with ShadowConfig's defaults: rule peers, k = 2, fp64 reference). The
"before" verdict is the peers' rule with its own floor only, on the same tensors.

Catches: every forward mutant of `flashcheck mutants` (flashcheck.testing.mutants) at each of its dtypes, on
shapes with several key blocks (the block bugs need them) and the small ones, causal and not, normal and tied
inputs, `--mutant-seeds` seeds; a case counts where the bug changes the output (bitwise, against the clean
kernel); a mutant is caught when at least one of its cases fails the check. The backward-only mutants are
not listed: the shadow check sees the forward output only.

Measured 2026-12-04, torch 2.13.0+cpu, 2 shared cores (`--checks 10000 --part false-alarms` per dtype, the
low-precision kernel alone with `--kernels sdpa-math-lowp`; `--mutant-seeds 2 --part mutants`):
  fp32  10032 checks of sdpa-math, sdpa-flash, clean-fa2: failed before 50 (5.0e-3), after 0 (worst 0.12)
  bf16  7524 checks of the three: before 0, after 0 (worst 0.46); sdpa-math-lowp 10010: before 56, after 0
  fp16  7524 checks of the three: before 0, after 0 (worst 0.49); sdpa-math-lowp 10010: before 52, after 0
  mutants x dtypes caught 35 / 38 before and after (accum-lowp bf16/fp16 and scale-0.5% bf16 never); cases
  caught 656 / 835 before, 653 after (fp32: one case each of scale-1%, scale-3%, no-rescale-block-1 at
  errors of 1e-6 to 1e-5 on tied inputs, inside what a correct fp32 kernel may round)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections import defaultdict

import torch

from flashcheck.backends import get_backend
from flashcheck.core.inputs import DISTRIBUTIONS, InputSpec, make_qkv
from flashcheck.guard import adapters
from flashcheck.guard.allowance import rounding_allowance
from flashcheck.guard.config import ShadowConfig
from flashcheck.testing.mutants import MUTANTS, correct_kernel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (batch, heads, kv heads, Lq, Lk, head dim): the shape, a decode step, short and odd prompts, GQA
SERVICE_SHAPES = (
    (1, 2, 2, 16, 16, 8),
    (1, 8, 2, 1, 77, 64),
    (2, 4, 4, 7, 7, 16),
    (1, 4, 2, 33, 33, 32),
    (1, 2, 2, 64, 64, 64),
    (1, 12, 12, 128, 128, 32),
)
MUTANT_SHAPES = ((1, 4, 2, 97, 97, 40), (1, 2, 2, 257, 257, 64), (1, 2, 2, 16, 16, 8), (1, 4, 2, 33, 33, 32))


def _sdpa(name: str):
    b = get_backend(name)
    return lambda q, k, v, causal: b.run(q, k, v, device="cpu", causal=causal)


def correct_kernels(dtype: torch.dtype) -> dict:
    kernels = {
        "sdpa-math": _sdpa("sdpa-math"),
        "sdpa-flash": _sdpa("sdpa-flash"),
        "clean-fa2": lambda q, k, v, causal: correct_kernel(q, k, v, causal=causal),
    }
    if dtype != torch.float32:
        kernels["sdpa-math-lowp"] = _sdpa("sdpa-math-lowp")
    return kernels


def _inputs(shape, dist: str, seed: int, dtype: torch.dtype):
    b, h, hkv, lq, lk, d = shape
    spec = InputSpec(batch=b, heads=h, seq_len=lq, seq_len_k=lk, head_dim=d, distribution=dist, seed=seed)
    q, k, v = make_qkv(spec)  # every distribution draws K/V per query head: keep hkv of them (GQA)
    return q.to(dtype), k[:, :hkv].to(dtype), v[:, :hkv].to(dtype)


def _check(q, k, v, out, causal: bool, working: torch.dtype | None = None) -> tuple[bool, bool, float]:
    """(passed before, passed after, after's max error / bound) of one check of `out`: the guard's own steps
    (ShadowChecker.check), with the peers' floor alone (before) and raised to the allowance (after)."""
    if k.shape[1] != q.shape[1]:  # the guard repeats grouped K/V heads before it checks
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    with torch.no_grad():
        ref = get_backend("sdpa-math").run(q.double(), k.double(), v.double(), device="cpu", causal=causal)
        base = get_backend("eager").run(q, k, v, device="cpu", causal=causal)
    cfg = ShadowConfig(every=1)
    before = adapters.budget(out, ref, base, cfg.k, cfg.rule)
    allowance = rounding_allowance(q, k, v, ref, out.dtype, None, causal=causal, working=working)
    after = adapters.budget(out, ref, base, cfg.k, cfg.rule, floor=allowance)
    mx = after.checks[0]
    return before.passed, after.passed, mx.value / mx.bound


def false_alarms(checks: int, dtypes: list[str], only: list[str] | None = None) -> dict:
    """Per dtype and kernel: checks, failures before and after, the worst ratio after."""
    out: dict = {}
    for name in dtypes:
        dtype = DTYPES[name]
        kernels = {n: fn for n, fn in correct_kernels(dtype).items() if not only or n in only}
        combos = [(s, c) for s in SERVICE_SHAPES for c in (False, True) if not (c and s[3] == 1)]
        per = math.ceil(checks / (len(combos) * len(kernels)))
        tally = defaultdict(lambda: {"checks": 0, "failed_before": 0, "failed_after": 0, "worst_ratio_after": 0.0})
        for (shape, causal), seed in itertools.product(combos, range(per)):
            q, k, v = _inputs(shape, DISTRIBUTIONS[seed % len(DISTRIBUTIONS)], 10_000 + seed, dtype)
            for kname, fn in kernels.items():
                with torch.no_grad():
                    served = fn(q, k, v, causal)
                working = adapters.working_dtype(get_backend(kname), dtype) if kname.startswith("sdpa") else None
                ok_before, ok_after, ratio = _check(q, k, v, served, causal, working)
                t = tally[kname]
                t["checks"] += 1
                t["failed_before"] += not ok_before
                t["failed_after"] += not ok_after
                t["worst_ratio_after"] = max(t["worst_ratio_after"], ratio)
        out[name] = dict(tally)
    return out


def catches(seeds: int) -> dict:
    """Per forward mutant and dtype: active cases, caught before and after."""
    out: dict = {}
    for mname, m in MUTANTS.items():
        if m.backward:
            continue
        for dtype in m.dtypes:
            row = {"active": 0, "caught_before": 0, "caught_after": 0}
            for shape, causal, dist, seed in itertools.product(
                MUTANT_SHAPES, (True,) if m.causal_only else (False, True), ("normal", "tied"), range(seeds)
            ):
                q, k, v = _inputs(shape, dist, 20_000 + seed, dtype)
                with torch.no_grad():
                    bad = m.fn(q, k, v, causal=causal)
                    good = correct_kernel(q, k, v, causal=causal)
                if torch.equal(bad, good):
                    continue
                ok_before, ok_after, _ = _check(q, k, v, bad, causal)
                row["active"] += 1
                row["caught_before"] += not ok_before
                row["caught_after"] += not ok_after
            out[f"{mname} {_short(dtype)}"] = row
    return out


def _short(dtype: torch.dtype) -> str:
    return next(n for n, d in DTYPES.items() if d == dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=10_000, help="shadow checks of correct kernels per dtype")
    ap.add_argument("--mutant-seeds", type=int, default=3)
    ap.add_argument("--dtypes", default="fp32,bf16,fp16", help="of the false-alarm part (comma-separated)")
    ap.add_argument("--kernels", default=None, help="of the false-alarm part: only these (comma-separated)")
    ap.add_argument("--part", choices=("both", "false-alarms", "mutants"), default="both")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    fa = (
        false_alarms(args.checks, args.dtypes.split(","), args.kernels and args.kernels.split(","))
        if args.part != "mutants"
        else {}
    )
    print("false alarms on correct kernels (failed checks / checks)")
    for dtype, rows in fa.items():
        n = sum(r["checks"] for r in rows.values())
        before, after = (sum(r[f"failed_{w}"] for r in rows.values()) for w in ("before", "after"))
        print(f"  {dtype}: {n} checks, before {before} ({before / n:.2e}), after {after} ({after / n:.2e})")
        for kname, r in rows.items():
            print(
                f"    {kname:<15} {r['checks']:>6}  before {r['failed_before']:>4}  after {r['failed_after']:>4}  "
                f"worst ratio after {r['worst_ratio_after']:.3f}"
            )
    ca = catches(args.mutant_seeds) if args.part != "false-alarms" else {}
    print("mutants (forward): cases caught / cases where the bug changes the output")
    for name, r in ca.items():
        print(
            f"  {name:<26} before {r['caught_before']:>3}/{r['active']:<3} after {r['caught_after']:>3}/{r['active']}"
        )
    caught = {w: sum(r[f"caught_{w}"] > 0 for r in ca.values() if r["active"]) for w in ("before", "after")}
    active = sum(r["active"] > 0 for r in ca.values())
    print(f"mutant x dtype caught: before {caught['before']}/{active}, after {caught['after']}/{active}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"false_alarms": fa, "catches": ca}, f, indent=2)


if __name__ == "__main__":
    main()
