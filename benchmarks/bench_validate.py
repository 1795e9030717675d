"""`flashcheck validate` on the bundled all-MiniLM-L6-v2: 1000 texts, eager and sdpa, fp32 and bf16, at the
model's maximum length (256), end to end in a fresh process; then again with the reference runs cached.

    python benchmarks/bench_validate.py [--samples 1000] [--out /tmp/fc-validate-bench]
Target (issue 10): under 5 minutes the first time (reference included), under half of that the second.
Wall time depends on what else runs on the machine, so the children's CPU time and the load average are
reported beside it."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _run(out: Path, samples: int) -> dict:
    cmd = [sys.executable, "-m", "flashcheck.cli", "validate", "--impls", "eager,sdpa", "--dtypes", "fp32,bf16",
           "--samples", str(samples), "--out", str(out), "--quiet", "--json"]  # fmt: skip
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode not in (0, 1):
        raise SystemExit(f"validate exited {res.returncode}:\n{res.stderr[-2000:]}")
    summary = json.loads(res.stdout)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "load_avg_1min_at_start": round(load, 2),
        "pass": summary["pass"],
        "runs": {c["a"]: round(c["seconds"], 1) for c in summary["comparisons"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--out", default="/tmp/fc-validate-bench")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    first = _run(out, args.samples)
    second = _run(out, args.samples)
    report = {
        "samples": args.samples,
        "cores": os.cpu_count(),
        "first (reference computed)": first,
        "second (reference cached)": second,
        "target": "first < 300 s, second < 150 s",
        "met": first["wall_s"] < 300 and second["wall_s"] < 150,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
