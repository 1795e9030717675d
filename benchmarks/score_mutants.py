"""Score the acceptance rules on the mutant catalogue, or derive flashcheck's factors (issue 14).

    python benchmarks/score_mutants.py                      # full score: mutant x rule table, totals,
                                                            # false failures over correct-kernel runs
    python benchmarks/score_mutants.py --calibrate          # FACTORS for flashcheck/core/budget.py
    python benchmarks/score_mutants.py --size quick         # the grid `flashcheck mutants` runs by default

The calibration runs the correct kernels on CALIBRATION cases (seeds from scores.CALIBRATION_SEED, disjoint
from the scoring seeds), takes each statistic's ratio to the baseline's, and prints FACTORS (the largest
ratio times margin 1.25, at least 1) with the worst runs behind them; --out writes the summary as JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from flashcheck.core.budget import MARGIN, QUANTILE, RULES, STATISTICS
from flashcheck.testing import scores


def _progress(total: int, label: str):
    state = {"done": 0, "start": time.time()}

    def advance() -> None:
        state["done"] += 1
        print(f"{label} {state['done']}/{total}, {time.time() - state['start']:.0f} s", file=sys.stderr, flush=True)

    return advance


def calibrate(cases: int, ratios_file: Path | None = None) -> dict:
    """Ratios of correct kernels on `cases` calibration cases, their quantiles, and the factors."""
    grid = scores.correct_cases(cases, scores.CALIBRATION_SEED)
    ratios = scores.correct_ratios(grid, advance=_progress(len(grid), "calibration case"))
    if ratios_file:
        ratios_file.write_text(json.dumps(ratios) + "\n")
    factors = scores.derive_factors(ratios)
    summary = {}
    for key, f in factors.items():
        rows = [r for r in ratios if (r["dtype"], r["kind"], r["distribution"]) == key]
        summary["/".join(key)] = {
            "samples": len(rows),
            "factors": {s: getattr(f, s) for s in STATISTICS},
            "worst": {s: [_where(r, s) for r in sorted(rows, key=lambda r: -r[s])[:3]] for s in STATISTICS},
            f"quantile {QUANTILE}": {
                s: torch.quantile(torch.tensor([r[s] for r in rows], dtype=torch.float64), QUANTILE).item()
                for s in STATISTICS
            },
        }
    return {
        "command": f"python benchmarks/score_mutants.py --calibrate --cases {cases}",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "cases": cases,
        "runs": cases * len(scores.CORRECT_KERNELS),
        "kernels": list(scores.CORRECT_KERNELS),
        "quantile": QUANTILE,
        "margin": MARGIN,
        "groups": summary,
    }


def _where(row: dict, stat: str) -> str:
    return f"{row[stat]:.3f} {row['kernel']} {row['tensor']} {row['case']}"


def _print_factors(result: dict) -> None:
    print(f"# {result['command']} ({result['date']}, torch {result['torch']}, {result['runs']} runs)")
    print("FACTORS: dict[tuple[str, str, str], Factors] = {")
    for key, g in result["groups"].items():
        name = ", ".join(f'"{part}"' for part in key.split("/"))
        print(f"    ({name}): Factors(" + ", ".join(f"{s}={v}" for s, v in g["factors"].items()) + "),")
    print("}")
    for key, g in result["groups"].items():
        q = ", ".join(f"{s} {v:.3f}" for s, v in g[f"quantile {QUANTILE}"].items())
        print(f"# {key}: {g['samples']} tensors, quantile {QUANTILE}: {q}")


def run_score(size: str) -> dict:
    total = scores.step_count(size)
    result = scores.score(RULES, size, advance=_progress(total, "case"))
    print(scores.markdown_table(result))
    return result.to_dict() | {"size": size, "date": datetime.date.today().isoformat(), "torch": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", action="store_true", help="derive FACTORS instead of scoring")
    ap.add_argument("--cases", type=int, default=96, help="calibration cases (each run by every correct kernel)")
    ap.add_argument("--size", choices=list(scores.GRIDS), default="full")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    ap.add_argument("--ratios", type=Path, help="with --calibrate: write every run's ratios here (JSON)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small tensors: 1 is fastest when shared)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.calibrate:
        result = calibrate(args.cases, args.ratios)
        _print_factors(result)
    else:
        result = run_score(args.size)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
