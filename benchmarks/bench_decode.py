"""Split-KV decoding on the CPU simulator: the error of Lq = 1 and 16 query rows against KV caches of 1k-32k
keys, by number of splits S and by the merge's format (fp32 as FA2's combine kernel, or bf16), against the
FP64 reference of the bf16-rounded inputs. B=1, 8 query heads on 2 K/V heads (GQA), D=128, causal, blocks
128, bf16-mixed, N(0, 1) inputs, seeds 0-2 (mean relative L2 error; S=1 is the flash kernel).
    python benchmarks/bench_decode.py            # Lk 1024, 4096, 16384, 32768
    python benchmarks/bench_decode.py --quick    # Lk 1024, 4096
"""

from __future__ import annotations

import argparse

import torch

from flashcheck.core.metrics import rel_l2
from flashcheck.core.numerics import round_to
from flashcheck.kernels import reference_attention, split_kv_attention

SPLITS = (1, 4, 16)
MERGES = ("bf16-mixed", "bf16-mixed,merge=bf16")


def errors(lq: int, lk: int, seed: int) -> dict[tuple[int, str], float]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 8, lq, 128, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, lk, 128, generator=g, dtype=torch.float64) for _ in range(2))
    q, k, v = (round_to(t, "bf16") for t in (q, k, v))
    ref = reference_attention(q, k, v, causal=True)
    with torch.no_grad():
        return {
            (s, pol): rel_l2(split_kv_attention(q, k, v, policy=pol, splits=s, block_k=128, causal=True), ref)
            for s in SPLITS
            for pol in MERGES
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lengths = (1024, 4096) if args.quick else (1024, 4096, 16384, 32768)
    cols = [f"S={s} {'fp32' if pol == MERGES[0] else 'bf16'}" for s in SPLITS for pol in MERGES]
    print(f"{'Lq':>3} {'Lk':>6} " + " ".join(f"{c:>12}" for c in cols))
    for lq in (1, 16):
        for lk in lengths:
            runs = [errors(lq, lk, seed) for seed in range(3)]
            mean = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
            print(f"{lq:>3} {lk:>6} " + " ".join(f"{mean[(s, pol)]:>12.3e}" for s in SPLITS for pol in MERGES))


if __name__ == "__main__":
    main()
