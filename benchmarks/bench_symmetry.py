"""The arXiv 2609.34272 mechanism on the CPU: rounded dS row sums and flash's dQ/dK error under bf16-mixed,
against the norm of the mean key and the softmax sharpness, with and without the row-sum correction
(Policy.ds_correction); and the effect of Policy.delta_source (arXiv 2609.39813). FA2 backward simulator,
B=1 H=2 D=64 L=256, blocks 64, seeds 0-2 (measure.symmetry has the inputs).
    python benchmarks/bench_symmetry.py                 # 5 key means x 3 sharpnesses x 3 seeds (about a minute)
    python benchmarks/bench_symmetry.py --quick         # L=64 D=32, 2 seeds
    python benchmarks/bench_symmetry.py --json out.json
Verdicts (reporting.verdicts): dQ error grows with the key mean (trend, per sharpness); the correction makes
the dQ error at least 10x smaller at the largest key mean and sharpest softmax (comparison, over seeds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from flashcheck.core.fileio import write_atomic
from flashcheck.measure.symmetry import delta_source_effect, mechanism_curve
from flashcheck.reporting.verdicts import compare, ratio_interval, trend

KEY_MEANS = [0.0, 4.0, 16.0, 64.0, 256.0]
SHARPNESS = [1.0, 4.0, 16.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="L=64 D=32 blocks 16, seeds 0-1")
    ap.add_argument("--json", type=Path, default=None, help="write every point here")
    args = ap.parse_args()
    torch.set_num_threads(2)
    sizes = {"seq_len": 64, "head_dim": 32, "block": 16} if args.quick else {"seq_len": 256, "head_dim": 64}
    seeds = (0, 1) if args.quick else (0, 1, 2)
    points = mechanism_curve(KEY_MEANS, SHARPNESS, seeds=seeds, **sizes)
    print(f"{'key_mean':>8} {'sharp':>5} {'p_max':>6} {'|rowsum dS|':>11} {'rel':>8} "
          f"{'dQ err':>9} {'dQ fixed':>9} {'x':>6} {'dK err':>9} {'dK fixed':>9}")  # fmt: skip
    for m in KEY_MEANS:
        for s in SHARPNESS:
            pts = [p for p in points if p.key_mean == m and p.sharpness == s]
            avg = {f: sum(getattr(p, f) for p in pts) / len(pts) for f in pts[0].to_dict() if f != "seed"}
            print(f"{m:>8g} {s:>5g} {avg['p_max']:>6.3f} {avg['row_sum']:>11.2e} {avg['row_sum_rel']:>8.2e} "
                  f"{avg['dq_err']:>9.2e} {avg['dq_err_fixed']:>9.2e} {avg['dq_reduction']:>6.1f} "
                  f"{avg['dk_err']:>9.2e} {avg['dk_err_fixed']:>9.2e}")  # fmt: skip
    print(f"(means over seeds {list(seeds)}; errors: relative L2 against FP64 on the bf16-rounded inputs)")
    for s in SHARPNESS:
        pts = [p for p in points if p.sharpness == s and p.key_mean > 0]
        v = trend([p.key_mean for p in pts], [p.dq_err for p in pts])
        print(f"dQ error grows with the key mean at sharpness {s:g}: {v.status} ({v.reason})")
    v = trend([p.p_max for p in points], [p.row_sum for p in points])
    print(f"|row sum of rounded dS| grows with sharpness (mean max P): {v.status} ({v.reason})")
    top = [p for p in points if p.key_mean == max(KEY_MEANS) and p.sharpness == max(SHARPNESS)]
    est = ratio_interval([p.dq_err for p in top], [p.dq_err_fixed for p in top])
    v = compare(est, threshold=10.0)
    print(f"correction >= 10x smaller dQ error at key mean {max(KEY_MEANS):g}, sharpness {max(SHARPNESS):g}: "
          f"{v.status} (reduction {est.text()})")  # fmt: skip
    effects = {seed: delta_source_effect(64.0, 4.0, seed=seed, **sizes) for seed in seeds}
    print("delta source (key mean 64, sharpness 4): dQ err / dK err / dQ bias along the gradient, per seed")
    for source in effects[seeds[0]]:
        cells = "  ".join(
            f"{e[source]['dq_err']:.2e}/{e[source]['dk_err']:.2e}/{e[source]['dq_bias']:+.1e}" for e in effects.values()
        )
        print(f"  {source:<10} {cells}")
    if args.json:
        data = {"points": [p.to_dict() for p in points], "delta_source": effects, "sizes": sizes}
        write_atomic(args.json, json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
