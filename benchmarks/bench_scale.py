"""Scale (issue 15), each figure beside its peer, each measurement in a fresh process (peak = its VmHWM):

- `flashcheck compare --seq-len L` (defaults: flash bf16-mixed vs standard, B=1 H=8 D=64): time and peak,
  against 2 GB at 32768 and 4 GB / 5 minutes at 65536;
- the flash simulator's forward (bf16-mixed, 128 x 128 blocks, fp32 inputs) from 4k to 64k: time, the time
  ratio per doubling (target <= 4.5) and peak, beside SDPA's CPU flash kernel in fp32 (target <= 1.5x at
  8k, 16k, 32k);
- the quick study: total time and the peak of each worker (target < 1.5 GB), polled from /proc;
- floors (`--floors L`): the simulator's two products per step alone beside SDPA's CPU flash kernel, and the
  FP64 reference's products alone, extrapolated to the two references a 65536 compare needs.

    python benchmarks/bench_scale.py                                   # everything (tens of minutes)
    python benchmarks/bench_scale.py --compare 4096 --flash 4096,8192 --no-study   # a quick look
Every figure is reproducible from this command (inputs seeded: InputSpec seed 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HWM = "[int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] * 1024"
FLASH = f"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.kernels import flash_attention
from torch.nn.attention import SDPBackend, sdpa_kernel
impl, L = sys.argv[1], int(sys.argv[2])
q, k, v = (t.float() for t in make_qkv(InputSpec(batch=1, heads=8, seq_len=L, head_dim=64)))
t0, c0 = time.perf_counter(), time.process_time()
with torch.no_grad():
    if impl == "flash-sim":
        flash_attention(q, k, v, policy="bf16-mixed", block_q=128, block_k=128)
    else:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
secs, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({{"seconds": secs, "cpu": cpu, "peak": {HWM}}}))
"""
COMPARE = f"""
import json, sys, time
from typer.testing import CliRunner
from flashcheck.cli import app
t0 = time.perf_counter()
res = CliRunner().invoke(app, ["compare", "--seq-len", sys.argv[1], "--json"])
assert res.exit_code == 0, res.output
print(json.dumps({{"seconds": time.perf_counter() - t0, "peak": {HWM}}}))
"""
FLOORS = """
import json, statistics, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
import flashcheck.kernels.sim.flash as F
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.kernels.sim.reference import reference_attention
from flashcheck.kernels.sim.tiles import mm_rows
from torch.nn.attention import SDPBackend, sdpa_kernel
L, repeat = int(sys.argv[1]), int(sys.argv[3])
q, k, v = (t.float() for t in make_qkv(InputSpec(batch=1, heads=8, seq_len=L, head_dim=64)))
real = (F._tile_scores, F._fa2_step)

with_exp = False


def products_only(on, exp=False):  # the simulator's loop with each step's two products (and exp) only
    global with_exp
    with_exp = exp
    def scores(q_r, k, rows, t, cfg, pol, sc, buf):
        r0, r1, lq, lk = rows
        out = F._Scratch.view(buf, (*q_r.shape[:-2], r1 - r0, t.c1 - t.c0))
        return mm_rows(q_r, k[..., t.c0 : t.c1, :].transpose(-1, -2), pol, lq - t.r0, out=out)
    def step(s, v_j, o, m, l, pol, exp, untiled, bufs, tie_beta=None):
        if with_exp:
            exp(s, out=s)
        mm_rows(s, v_j, pol, untiled, out=bufs[1])
        return m, l
    F._tile_scores, F._fa2_step = (scores, step) if on else real

def reference_floor(with_exp):  # the FP64 reference's two products (and exp) per chunk, in reused buffers
    k64, v64 = k.double(), v.double()
    rows = max(8, min(1024, 64 * 2**20 // (8 * 8 * L)))
    s, o = torch.empty(1, 8, rows, L, dtype=torch.float64), torch.empty(1, 8, rows, 64, dtype=torch.float64)
    for r0 in range(0, L, rows):
        torch.matmul(q[..., r0 : r0 + rows, :].double() * 0.125, k64.transpose(-1, -2), out=s)
        if with_exp:
            s.exp_()
        torch.matmul(s, v64, out=o)

def sdpa():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, k, v)

jobs = {
    "sdpa-flash": sdpa,
    "flash-sim": lambda: (products_only(False), F.flash_attention(q, k, v, policy="bf16-mixed")),
    "flash-sim products only": lambda: (products_only(True), F.flash_attention(q, k, v, policy="bf16-mixed")),
    "flash-sim products + exp": lambda: (products_only(True, True), F.flash_attention(q, k, v, policy="bf16-mixed")),
    "fp64 reference": lambda: reference_attention(q, k, v),
    "fp64 reference products only": lambda: reference_floor(False),
    "fp64 reference products + exp": lambda: reference_floor(True),
}
times = {name: [] for name in jobs}
with torch.no_grad():
    for _ in range(repeat):
        for name, job in jobs.items():
            t0 = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - t0)
print(json.dumps({name: statistics.median(t) for name, t in times.items()}))
"""
GB = 2**30


def child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def verdict(value: float, limit: float) -> str:
    return "meets" if value <= limit else "MISSES"


def bench_compare(lengths: list[int]) -> None:
    limits = {32768: (2 * GB, None), 65536: (4 * GB, 300.0)}
    for n in lengths:
        r = child(COMPARE, str(n))
        if "error" in r:
            print(f"compare --seq-len {n}: failed: {r['error']}")
            continue
        mem, secs = limits.get(n, (None, None))
        line = f"compare --seq-len {n:>6}: {r['seconds']:7.1f} s, peak {r['peak'] / GB:5.2f} GB"
        if mem:
            line += f"  (peak vs {mem / GB:.0f} GB: {r['peak'] / mem:.2f}x, {verdict(r['peak'], mem)})"
        if secs:
            line += f"  (time vs {secs:.0f} s: {r['seconds'] / secs:.2f}x, {verdict(r['seconds'], secs)})"
        print(line, flush=True)


def _flash_runs(n: int, threads: int, repeat: int) -> tuple[dict, dict] | str:
    """`repeat` runs of the simulator and of SDPA flash at length n, interleaved (sim, sdpa, sim, ...) so
    that a change in the machine's load falls on both; medians of wall and CPU seconds, the largest peak."""
    runs: dict[str, list[dict]] = {"flash-sim": [], "sdpa-flash": []}
    for _ in range(repeat):
        for impl, got in runs.items():
            r = child(FLASH, impl, str(n), str(threads))
            if "error" in r:
                return f"{impl}: {r['error']}"
            got.append(r)
    sim, ref = ({key: statistics.median(r[key] for r in got) for key in ("seconds", "cpu")} for got in runs.values())
    sim["peak"], ref["peak"] = (max(r["peak"] for r in got) for got in runs.values())
    return sim, ref


def bench_flash(lengths: list[int], threads: int, repeat: int = 3) -> None:
    print(
        f"flash simulator (bf16-mixed, 128x128, B=1 H=8 D=64, fp32 inputs, {threads} threads) vs SDPA CPU flash "
        f"fp32; medians of {repeat} interleaved runs, each in a fresh process; load average {os.getloadavg()[0]:.1f}"
    )
    head = f"{'L':>6} {'sim s':>8} {'x prev':>7} {'sim GB':>7} {'sdpa s':>8} {'x prev':>7} {'sim/sdpa':>9}"
    print(f"{head} {'cpu-time sim/sdpa':>17}")
    prev = None
    for n in lengths:
        got = _flash_runs(n, threads, repeat)
        if isinstance(got, str):
            print(f"{n:>6} failed: {got}")
            continue
        sim, ref = got
        ratio = sim["seconds"] / ref["seconds"]
        growth = f"{sim['seconds'] / prev[0]:7.2f}" if prev else f"{'':>7}"
        sgrowth = f"{ref['seconds'] / prev[1]:7.2f}" if prev else f"{'':>7}"
        note = "  (target <= 1.5x: " + verdict(ratio, 1.5) + ")" if n in (8192, 16384, 32768) else ""
        if prev and sim["seconds"] / prev[0] > 4.5:
            note += "  (doubling > 4.5x: MISSES)"
        print(
            f"{n:>6} {sim['seconds']:8.2f} {growth} {sim['peak'] / GB:7.2f} {ref['seconds']:8.2f} {sgrowth} "
            f"{ratio:8.2f}x {sim['cpu'] / ref['cpu']:16.2f}x{note}  (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        prev = (sim["seconds"], ref["seconds"])


def bench_floors(n: int, threads: int, repeat: int) -> None:
    """What no rewrite in eager torch ops can beat, measured in one process (interleaved medians): the flash
    simulator's loop doing only its two products per step, then those and its exp (what any bit-identical
    simulator must compute), beside SDPA's CPU flash kernel; and the FP64 reference's two products, then with
    its exp, scaled by (65536 / n)^2 to the two references `compare --seq-len 65536` needs (5-minute target)."""
    r = child(FLOORS, str(n), str(threads), str(repeat))
    if "error" in r:
        print(f"floors at L={n}: failed: {r['error']}")
        return
    print(f"floors at L={n} ({threads} threads, medians of {repeat}; load {os.getloadavg()[0]:.1f}):")
    for name, secs in r.items():
        print(f"  {name:<30} {secs:8.2f} s  ({secs / r['sdpa-flash']:.2f}x sdpa-flash)")
    for part in ("products only", "products + exp"):
        sim_floor = r[f"flash-sim {part}"] / r["sdpa-flash"]
        print(f"  flash-sim {part} / sdpa-flash: {sim_floor:.2f}x (target for the whole simulator: 1.5x)")
    for part in ("products only", "products + exp"):
        refs = 2 * r[f"fp64 reference {part}"] * (65536 / n) ** 2
        print(
            f"  compare --seq-len 65536's two FP64 references, {part}: ~{refs:.0f} s at this rate "
            f"(target for the whole compare: 300 s)",
            flush=True,
        )


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


# The quick preset as it was when issue 15 was filed (config.py at b483974: the paper, backends and fa3
# questions at 4 heads, seeds 0 and 1; 152 cases), the cases of the issue's "81 s". quick has grown since.
QUICK_AT_ISSUE = "quick-at-issue"


def quick_at_issue_toml() -> str:
    """The issue-time quick preset as a --config TOML file (the same case ids as then)."""
    import dataclasses

    from flashcheck.questions.paper import presets as c

    sweeps = (
        *c.paper_sweeps((512, 1024, 2048, 4096, 8192), 2048, (8, 16, 32, 64, 128), 4, (0, 1)),
        c.backend_sweep((1024, 4096), 4, (0, 1)),
        c.fa3_sweep((1024, 2048), (64, 128), 4, (0, 1)),
    )
    lines = [f"name = {json.dumps(QUICK_AT_ISSUE)}"]
    for sweep in sweeps:
        lines += ["", "[[sweeps]]"] + [f"{k} = {json.dumps(v)}" for k, v in dataclasses.asdict(sweep).items()]
    return "\n".join(lines) + "\n"


def _status(pid: int, field: str) -> int:
    """A /proc/PID/status field in bytes (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _study_command(preset: str, workers: int, tmp: str, rev: str | None) -> tuple[list[str], dict]:
    """The study command line and environment: this tree's code, or the code at git revision `rev` (extracted
    to `tmp`, run with the issue-time preset `quick`, whose cases are those of QUICK_AT_ISSUE)."""
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "flashcheck.cli", "study", "--out", f"{tmp}/out", "--workers", str(workers), "--quiet"]
    if rev is not None:
        root = Path(__file__).resolve().parents[1]
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env["PYTHONPATH"] = f"{tmp}/src"
        return [*cmd, "--preset", "quick" if preset == QUICK_AT_ISSUE else preset], env
    if preset == QUICK_AT_ISSUE:
        Path(f"{tmp}/quick-at-issue.toml").write_text(quick_at_issue_toml())
        return [*cmd, "--config", f"{tmp}/quick-at-issue.toml"], env
    return [*cmd, "--preset", preset], env


def _children_cpu() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_study(preset: str, workers: int, rev: str | None = None) -> dict:
    """One study run in fresh processes: wall time, each worker's peak (VmHWM) and the largest sum of the
    workers' resident memory at one moment (polled every 0.2 s) beside MemAvailable at the start."""
    from flashcheck.kernels.sim.memory import available_bytes

    avail = available_bytes() or 0
    with tempfile.TemporaryDirectory() as tmp:
        cmd, env = _study_command(preset, workers, tmp, rev)
        t0, c0 = time.perf_counter(), _children_cpu()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        peaks: dict[int, int] = {}
        together = 0
        while proc.poll() is None:
            kids = _children(proc.pid)
            for pid in kids:  # VmHWM is a high-water mark: the last poll before exit holds it
                peaks[pid] = max(peaks.get(pid, 0), _status(pid, "VmHWM"))
            together = max(together, sum(_status(pid, "VmRSS") for pid in kids))
            time.sleep(0.2)
        secs = time.perf_counter() - t0
        err = proc.stderr.read() if proc.stderr else ""
        cpu = _children_cpu() - c0  # the study and its reaped workers: less sensitive to the load than wall time
    worker_peaks = sorted((p for p in peaks.values() if p > 0), reverse=True)
    return {"seconds": secs, "cpu": cpu, "exit": proc.returncode, "peaks": worker_peaks, "together": together,
            "available": avail, "stderr": err[-300:] if proc.returncode else ""}  # fmt: skip


def bench_study(preset: str, workers: int, peer: str | None = None) -> None:
    """The study's time and worker peaks; with `peer` (a git revision), the same cases run by that revision's
    code right after, so both see the same machine load."""
    runs = [("this tree", run_study(preset, workers))]
    if peer:
        runs.append((f"code at {peer}", run_study(preset, workers, peer)))
    for label, r in runs:
        top = r["peaks"][0] if r["peaks"] else 0
        each = ", ".join(f"{p / GB:.2f}" for p in r["peaks"][: workers + 2])
        print(
            f"study {preset} --workers {workers} ({label}): {r['seconds']:.1f} s, {r['cpu']:.0f} CPU s (exit "
            f"{r['exit']}, load {os.getloadavg()[0]:.1f}); peak per worker {each}"
            f" GB (largest vs 1.5 GB: {top / (1.5 * GB):.2f}x, {verdict(top, 1.5 * GB)}); workers together at most "
            f"{r['together'] / GB:.2f} GB of {r['available'] / GB:.1f} GB available"
            + (f"; stderr: {r['stderr']}" if r["exit"] else ""),
            flush=True,
        )
    if peer:
        (a, b) = (runs[0][1], runs[1][1])
        print(
            f"study this tree / code at {peer}: wall {a['seconds'] / b['seconds']:.2f}x, CPU {a['cpu'] / b['cpu']:.2f}x"
        )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", default="32768,65536", help="compare --seq-len values ('' to skip)")
    parser.add_argument("--flash", default="4096,8192,16384,32768,65536", help="flash simulator lengths")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads (flash)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per flash length (medians)")
    parser.add_argument(
        "--study", default="quick", help=f"study preset, or {QUICK_AT_ISSUE} (quick when issue 15 was filed, 81 s then)"
    )
    parser.add_argument("--workers", type=int, default=2, help="study workers")
    parser.add_argument(
        "--study-peer", default=None, help="git revision whose code runs the same study right after (e.g. b483974)"
    )
    parser.add_argument("--floors", type=int, default=8192, help="length of the floors section (0 to skip)")
    parser.add_argument("--no-study", action="store_true")
    args = parser.parse_args()
    if args.floors:
        bench_floors(args.floors, args.threads, args.repeat)
    if args.flash:
        bench_flash(_ints(args.flash), args.threads, args.repeat)
    if args.compare:
        bench_compare(_ints(args.compare))
    if not args.no_study:
        bench_study(args.study, args.workers, args.study_peer)


if __name__ == "__main__":
    main()
