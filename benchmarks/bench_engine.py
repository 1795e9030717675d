"""Speed and peak memory of the flash simulator against torch SDPA (math and CPU flash), same run.

Each measurement runs in a fresh process so that its peak memory is its own. B=1 H=8 D=64.
    python benchmarks/bench_engine.py            # L = 2048, 8192; flash and reference at 16384
    python benchmarks/bench_engine.py --quick    # L = 2048 only
Targets (issue 2): flash fwd at 8192 no slower than SDPA math fp32 and within 5x of SDPA's CPU flash;
peak memory < 1 GB at 8192 and < 1.5 GB at 16384; FP64 reference at 16384 < 4 GB; backward at 2048
within 3x of autograd through SDPA math.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(2)
from flashcheck.core.inputs import InputSpec, make_qkv, make_grad
from flashcheck.kernels import flash_attention, reference_attention
from torch.nn.attention import SDPBackend, sdpa_kernel

impl, L, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
backward, repeats = sys.argv[4] == "1", int(sys.argv[5])
dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}[dtype]
q, k, v = (t.to(dt) for t in make_qkv(InputSpec(batch=1, heads=8, seq_len=L, head_dim=64)))
do = make_grad(q.shape, 0).to(dt)

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

def run():
    qq, kk, vv = (t.detach().requires_grad_(backward) for t in (q, k, v))
    if impl == "flash-sim":
        out = flash_attention(qq, kk, vv, policy="bf16-mixed", block_q=128, block_k=128)
    elif impl == "reference":
        out = reference_attention(qq, kk, vv, chunk=1024)
    else:
        backend = SDPBackend.MATH if impl == "sdpa-math" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
    if backward:
        out.backward(do.to(out.dtype))

base = rss_mb()
times = []
for _ in range(repeats):
    t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
# VmHWM, not ru_maxrss: ru_maxrss carries the parent's high-water mark across fork + exec
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] / 1024
print(json.dumps({"seconds": min(times), "peak_mb": peak, "increment_mb": peak - base}))
"""


def measure(impl: str, seq_len: int, dtype: str, backward: bool = False) -> dict[str, float]:
    repeats = 3 if seq_len <= 2048 else 1
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, impl, str(seq_len), dtype, str(int(backward)), str(repeats)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L = 2048 only")
    args = parser.parse_args()
    lengths = [2048] if args.quick else [2048, 8192]
    rows = []
    for L in lengths:
        res = {
            name: measure(*spec)
            for name, spec in {
                "flash-sim bf16-mixed": ("flash-sim", L, "fp32"),
                "sdpa-math fp32": ("sdpa-math", L, "fp32"),
                "sdpa-flash fp32": ("sdpa-flash", L, "fp32"),
                "sdpa-flash bf16": ("sdpa-flash", L, "bf16"),
            }.items()
        }
        rows.append((f"forward L={L}", res, "sdpa-math fp32", "sdpa-flash fp32"))
    bwd = {
        "flash-sim bf16-mixed": measure("flash-sim", 2048, "fp32", True),
        "sdpa-math fp32": measure("sdpa-math", 2048, "fp32", True),
    }
    rows.append(("fwd+bwd L=2048", bwd, "sdpa-math fp32", None))
    if not args.quick:
        rows.append(
            (
                "forward L=16384",
                {
                    "flash-sim bf16-mixed": measure("flash-sim", 16384, "fp32"),
                    "reference fp64": measure("reference", 16384, "fp64"),
                    "sdpa-flash fp32": measure("sdpa-flash", 16384, "fp32"),
                },
                None,
                "sdpa-flash fp32",
            )
        )
    for title, res, peer_a, peer_b in rows:
        print(f"\n{title}")
        print(f"  {'impl':<22}{'seconds':>10}{'peak MB':>10}{'+MB':>9}")
        for name, r in res.items():
            if "error" in r:
                print(f"  {name:<22} error: {r['error']}")
                continue
            print(f"  {name:<22}{r['seconds']:>10.2f}{r['peak_mb']:>10.0f}{r['increment_mb']:>9.0f}")
        sim = res.get("flash-sim bf16-mixed", {})
        for peer in (peer_a, peer_b):
            if peer and "seconds" in sim and "seconds" in res.get(peer, {}):
                print(f"  time ratio flash-sim / {peer}: {sim['seconds'] / res[peer]['seconds']:.2f}x")


if __name__ == "__main__":
    main()
