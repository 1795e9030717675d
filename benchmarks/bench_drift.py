"""`flashcheck drift` on two generated ~1 GB fp32 checkpoints (many tensors, one large) against a naive
load-everything-and-flatten comparison, each in a fresh process (time and peak RSS).

    python benchmarks/bench_drift.py [--gb 1.0] [--dir /tmp/fc-drift-bench]
Targets: peak memory under 2x the largest tensor (issue 15: tensors from training.drift.SPILL_BYTES up are
held one at a time, chunk buffers counted), and no slower than naive (issue 5)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from flashcheck.training.checkpoints import save_safetensors

CHILD = r"""
import json, sys, time
import numpy as np, torch
mode, a, b = sys.argv[1:4]
start = time.perf_counter()
if mode == "stream":
    from flashcheck.training.drift import compare_checkpoints
    r = compare_checkpoints(a, b)
    out = {"max_abs": r.max_abs, "wasserstein": r.wasserstein, "method": r.method, "bound": r.wasserstein_bound}
else:
    from flashcheck.training.checkpoints import open_checkpoint
    ra, rb = open_checkpoint(a), open_checkpoint(b)
    ta = {k: ra.tensor(k) for k in ra.keys()}
    tb = {k: rb.tensor(k) for k in rb.keys()}
    fa = torch.cat([t.flatten() for t in ta.values()])
    fb = torch.cat([tb[k].flatten() for k in ta])
    mx = float((fa - fb).abs().max())
    w = float((torch.sort(fa).values.double() - torch.sort(fb).values.double()).abs().mean())
    out = {"max_abs": mx, "wasserstein": w, "method": "naive exact"}
out["seconds"] = time.perf_counter() - start
# VmHWM, not ru_maxrss: ru_maxrss carries the parent's high-water mark across fork + exec
out["peak_mb"] = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] / 1024
print(json.dumps(out))
"""


def make(folder: Path, gb: float) -> tuple[Path, Path, int]:
    folder.mkdir(parents=True, exist_ok=True)
    n_large = int(gb * 0.4 * 2**30 / 4)
    n_small = int(gb * 0.6 * 2**30 / 4 / 150)
    paths = []
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        tensors = {"large.weight": torch.randn(n_large, generator=g)}
        for i in range(150):
            tensors[f"blocks.{i}.weight"] = torch.randn(n_small, generator=g) * (1 + seed * 0.01)
        path = folder / f"run{seed}.safetensors"
        save_safetensors(tensors, path)
        paths.append(path)
        del tensors
    return paths[0], paths[1], n_large * 4


def measure(mode: str, a: Path, b: Path) -> dict:
    base = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, numpy, flashcheck.training.drift; print([int(l.split()[1]) "
            "for l in open('/proc/self/status') if l.startswith('VmHWM')][0] / 1024)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(a), str(b)], capture_output=True, text=True, check=True
    )
    out = json.loads(proc.stdout)
    out["import_mb"] = float(base.stdout)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp/fc-drift-bench")
    parser.add_argument("--no-naive", action="store_true", help="streaming only (the memory ratio; no time peer)")
    args = parser.parse_args()
    folder = Path(args.dir)
    t0 = time.perf_counter()
    a, b, largest = make(folder, args.gb)
    print(
        f"generated 2 x {a.stat().st_size / 2**30:.2f} GB in {time.perf_counter() - t0:.0f} s; "
        f"largest tensor {largest / 2**20:.0f} MB"
    )
    try:
        res = {"stream": measure("stream", a, b)}
        if not args.no_naive:
            res["naive"] = measure("naive", a, b)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for mode, r in res.items():
        extra = r["peak_mb"] - r["import_mb"]
        print(
            f"{mode:<7} {r['seconds']:7.1f} s  peak {r['peak_mb']:7.0f} MB (+{extra:.0f} MB over imports, "
            f"{extra * 2**20 / largest:.2f}x the largest tensor)  W1 {r['wasserstein']:.6e} ({r['method']})  "
            f"max {r['max_abs']:.4f}" + (f"  bound ±{r['bound']:.1e}" if "bound" in r else "")
        )
    if args.no_naive:
        return
    s, n = res["stream"], res["naive"]
    print(
        f"time ratio stream/naive {s['seconds'] / n['seconds']:.2f}x; memory ratio "
        f"{(s['peak_mb'] - s['import_mb']) / (n['peak_mb'] - n['import_mb']):.2f}x"
    )


if __name__ == "__main__":
    main()
