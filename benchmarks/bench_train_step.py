"""CPU time per training step of each train-study run kind, for one source tree or two compared (before/after).

    python benchmarks/bench_train_step.py                                   # this tree (PYTHONPATH), paper's size
    python benchmarks/bench_train_step.py --trees /path/before/src src --rounds 3

Each (tree, kind) measurement runs in its own process (fresh torch state), trains `--steps` steps through
flashcheck.training.train.train at the paper preset's model size and reports CPU seconds per step (process time,
so a busy machine inflates it less than wall time); the trees alternate within every round and the median over
rounds is printed, with the load. Run benchmarks/train_bit_identity.py to show that a speed change moves no bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

KINDS = {
    "base": {},
    "flash": {"attention": "flash:bf16-mixed"},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "sage8": {"attention": "sagebwd"},
    "noattn": {"attention": "none"},
}

CHILD = """
import json, sys, tempfile, time
from flashcheck.training.model import GPTConfig
from flashcheck.training.train import RunConfig, train
kind, steps, warm = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
model = GPTConfig(vocab=64, seq_len=128, layers=3, heads=4, dim=64)
cfg = dict(name="b", attention="standard:bf16-mixed", data="lookback", batch=8, model=model, lr=5e-3) | kind
with tempfile.TemporaryDirectory() as tmp:
    train(RunConfig(**cfg, steps=warm, save_every=warm), tmp + "/warm")  # imports, first-call costs
    t0 = time.process_time()
    train(RunConfig(**cfg, steps=steps, save_every=steps), tmp + "/run")
    print(json.dumps((time.process_time() - t0) / steps))
"""


def measure(tree: str | None, kind: dict, steps: int, warm: int) -> float:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    res = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(kind), str(steps), str(warm)],
        env=env,
        capture_output=True,
        text=True,
    )
    if res.returncode:
        sys.exit(f"the measurement of {kind or 'base'} failed:\n{res.stderr}")
    return float(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="*", default=None, help="src folders to compare (default: PYTHONPATH as is)")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    trees = args.trees or [None]
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    times: dict = {(t, k): [] for t in trees for k in args.kinds}
    for r in range(args.rounds):
        for k in args.kinds:
            for t in trees if r % 2 == 0 else trees[::-1]:  # alternate which tree goes first
                times[(t, k)].append(measure(t, KINDS[k], args.steps, args.warm))
        print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    head = "kind".ljust(8) + "".join(f"{t or 'PYTHONPATH'}"[-28:].rjust(30) for t in trees)
    print(head + ("  after/before" if len(trees) == 2 else ""))
    for k in args.kinds:
        med = [statistics.median(times[(t, k)]) for t in trees]
        row = k.ljust(8) + "".join(f"{m * 1000:27.1f} ms" for m in med)
        print(row + (f"  {med[1] / med[0]:.3f}" if len(trees) == 2 else ""))
    print(f"load after: {os.getloadavg()[0]:.2f} (CPU seconds per step, median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
