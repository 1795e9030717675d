"""The tensor-core MMA model (kernels.tensorcore.mma) against mmaemu 0.1.0's hardware model, on attention-shaped FP8
products.

Table 1 (issue 30's table, redone): P·V of e4m3 P (softmax numerators of N(0, sigma^2) scores, x 2^8 as FA3 casts
them) and e4m3 V (N(0, 1), per-tensor scale), 16 rows x 64 columns (4 x 16 from 8k keys), seed 0: the relative
L2 error against the exact product of mmaemu's `hopper` model, of kernels.tensorcore.mma's HOPPER, and of the old
FP22 accumulator (kernels.formats.fastmath.mm_accumulate, bits 13, chunk 32), and the share of outputs bit-equal to
mmaemu.
Table 2: bit-equal outputs per model (ada, hopper, b200), product and length, one level and promoted every 64 keys.
    python benchmarks/bench_mma.py            # keys 128, 1k, 8k, 64k; table 2 up to 131,072 keys
    python benchmarks/bench_mma.py --quick    # keys 128, 1k; table 2 up to 8k
Needs mmaemu (the test extra)."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flashcheck.kernels.formats.fastmath import mm_accumulate
from flashcheck.kernels.tensorcore.mma import ADA, B200, HOPPER, mma_matmul
from test_mma import _bits_equal, oracle, p_and_v, q_and_kt


def _rel(x: torch.Tensor, exact: torch.Tensor) -> float:
    return float((x.double() - exact).norm() / exact.norm())


def table1(keys_list: tuple[int, ...]) -> None:
    print("keys    hardware(mmaemu)  tensorcore.mma   old FP22   mma/hw  FP22/hw  bit-equal mma  bit-equal FP22")
    fmts = ("e4m3", "e4m3")
    for keys in keys_list:
        rows, dv = (16, 64) if keys <= 1024 else (4, 16)
        p, v = p_and_v(rows, keys, dv, fmts, seed=0, zeros=0.0)
        exact = p @ v
        hw = oracle(p, v, HOPPER, fmts)
        ours = mma_matmul(p, v, HOPPER, fmt=fmts)
        old = mm_accumulate(p, v, 13, chunk=32)
        e_hw, e_ours, e_old = _rel(hw, exact), _rel(ours, exact), _rel(old, exact)
        same = _bits_equal(ours, hw)
        same_old = _bits_equal(old.to(torch.float32), hw)
        print(
            f"{keys:>6}  {e_hw:>15.3e}  {e_ours:>11.3e}  {e_old:>9.3e}  {e_ours / e_hw:>6.2f}  {e_old / e_hw:>7.2f}"
            f"  {same[0]:>6}/{same[1]:<6}  {same_old[0]:>6}/{same_old[1]:<6}"
        )


def table2(longest: int) -> None:
    print("\nmodel   product  fmts        length  levels       bit-equal")
    total = [0, 0]
    for model in (ADA, HOPPER, B200):
        cases = []
        for keys, rows, dv in ((32, 48, 64), (1024, 16, 32), (8192, 4, 16), (131_072, 1, 8)):
            if keys <= longest:
                for fmts in (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e5m2")):
                    p, v = p_and_v(rows, keys, dv, fmts, seed=keys)
                    for promote in (None, 64) if keys <= 8192 else (None,):
                        cases.append(("P·V", fmts, keys, promote, p, v))
        for d in (64, 128, 256):
            for fmts in (("e4m3", "e4m3"), ("e5m2", "e5m2")):
                q, kt = q_and_kt(2, min(longest, 16384), d, fmts, seed=d)
                cases.append(("Q·K^T", fmts, d, None, q, kt))
        for what, fmts, length, promote, a, b in cases:
            ours = mma_matmul(a, b, model, promote_every=promote, fmt=fmts)
            same = _bits_equal(ours, oracle(a, b, model, fmts, promote))
            total[0] += same[0]
            total[1] += same[1]
            levels = "one" if promote is None else f"two ({promote})"
            print(f"{model.name:<7} {what:<8} {'/'.join(fmts):<11} {length:>6}  {levels:<10} {same[0]:>7}/{same[1]}")
    print(f"total bit-equal: {total[0]} of {total[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    table1((128, 1024) if args.quick else (128, 1024, 8192, 65536))
    table2(8192 if args.quick else 131_072)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
