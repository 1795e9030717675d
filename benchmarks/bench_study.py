"""Study throughput: the quick preset with --workers 2 against --workers 1, and reference reuse.

    python benchmarks/bench_study.py [--preset quick]
Target (issue 3): workers 2 at least 1.6x faster than workers 1 on this 2-core machine. Also prints how
many FP64 references the preset computes against its number of cases.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(preset: str, workers: int, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "flashcheck.cli",
            "study",
            "--preset",
            preset,
            "--out",
            str(out),
            "--workers",
            str(workers),
            "--quiet",
        ],
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t1 = run(args.preset, 1, Path(tmp) / "w1")
        t2 = run(args.preset, 2, Path(tmp) / "w2")
        stats = json.loads((Path(tmp) / "w2" / "runs.jsonl").read_text().splitlines()[-1])
        same = (Path(tmp) / "w1" / "records.jsonl").read_text().count("\n") == stats["cases_total"]
    print(f"preset {args.preset}: workers 1 {t1:.1f} s, workers 2 {t2:.1f} s, speed-up {t1 / t2:.2f}x")
    print(
        f"cases {stats['cases_total']}, input sets {stats['input_sets']}, FP64 references "
        f"{stats['reference_computations']} (one per input set plus one per distinct input rounding; "
        f"without reuse: {2 * stats['cases_total']}); complete: {same}"
    )


if __name__ == "__main__":
    main()
