"""The serving study's measurements, one JSON file per unit under FOLDER/serving/ (written atomically; a unit
already there is not run again, so a killed study resumes): the long-context table, vllm#54035 and FA#1897 in
simulation, and the SDPA CPU kernels' consistency certificates."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from flashcheck.core.fileio import make_folder, refuse_link, write_atomic
from flashcheck.measure.consistency import Shape, batch_invariance, certify, prefill_decode
from flashcheck.measure.longcontext import VALUES, VARIANTS, measure_cell
from flashcheck.questions.serving.schema import SDPA_TARGETS, SPLIT_TARGETS, check_unit
from flashcheck.questions.serving.settings import ServingSettings


def mma_missing() -> str | None:
    """Why the tensor-core MMA model cannot be imported (None: it can)."""
    try:
        import flashcheck.kernels.tensorcore.mma  # noqa: F401
    except ImportError as exc:
        return f"the tensor-core MMA model (flashcheck.kernels.tensorcore.mma) is missing: {exc}"
    return None


def units(s: ServingSettings) -> list[tuple[str, Callable[[], dict]]]:
    """(name, run) of every unit, in order."""
    out: list[tuple[str, Callable[[], dict]]] = []
    for var in s.variants:
        out += [(f"longctx-{var}-{n}", partial(_longctx, var, n, s)) for n in s.lengths]
        out += [(f"captured-{var}-{n}", partial(_longctx, var, n, s, ("captured",))) for n in s.captured_lengths]
    out += [(f"vllm54035-{kv}", partial(_prefill_decode, kv, s)) for kv in ("fp8", "bf16")]
    out += [(f"fa1897-{name}", partial(_splits, name, s)) for name in SPLIT_TARGETS]
    out += [(f"cert-{name}", partial(_certificates, name, s)) for name in SDPA_TARGETS]
    return out


def _prefill_decode(kv: str, s: ServingSettings) -> dict:
    """vllm#54035 in simulation: FA3 prefill (kBlockN per tile_size.h) against its decode steps, D = 128."""
    from flashcheck.backends.serving import sim_target

    shape = Shape(heads=1, kv_heads=1, head_dim=128, prefill_len=s.prefill_len)
    return prefill_decode(sim_target("sim-fa3", kv), "sim-fa3", shape).to_dict()


def _splits(name: str, s: ServingSettings) -> dict:
    """FA#1897 in simulation: one decode request across batch sizes with the kernel's split rule."""
    from flashcheck.backends.serving import sim_target
    from flashcheck.kernels.serving.heuristics import fa3_num_splits, flashinfer_chunk_pages

    shape = Shape(heads=8, kv_heads=8, head_dim=128, kv_len=s.sim_kv_len)
    out = batch_invariance(sim_target(name, "bf16"), name, shape, max_batch=s.sim_max_batch).to_dict()
    sizes = range(1, s.sim_max_batch + 1)
    if name == "sim-fa3":
        out["launch"] = [
            "splits",
            [fa3_num_splits(b, 1, s.sim_kv_len, 8, 8, 128, fp8=False, causal=True) for b in sizes],
        ]
    elif name == "sim-flashinfer":
        out["launch"] = ["chunk pages", [flashinfer_chunk_pages([s.sim_kv_len] * b, 8) for b in sizes]]
    return out


def _certificates(name: str, s: ServingSettings) -> dict:
    """A real backend's four certificates (bf16, H=4, D=64; decode KV 512; prefill 160 tokens)."""
    from flashcheck.backends.serving import resolve_target

    shape = Shape(heads=4, kv_heads=4, head_dim=64, kv_len=512, prefill_len=160)
    certs = certify(resolve_target(name), name, shape, max_batch=s.sdpa_max_batch)
    return {"certificates": [c.to_dict() for c in certs]}


def _longctx(variant: str, n: int, s: ServingSettings, values: tuple[str, ...] = VALUES) -> dict:
    if VARIANTS[variant]["mma"] is not None and (why := mma_missing()):
        return {"status": "skipped", "reason": why}
    rows = measure_cell(variant, n, head_dim=s.head_dim, heads=s.heads, values=values)
    return {"status": "ok", "rows": [r.to_dict() for r in rows]}


WRITES = ("serving", "serving.json", "summary.json", "report.md", "report.html")


def check_writable(folder: str | Path) -> None:
    """LinkRefused (a ValueError, one line) when a path the study writes in `folder` is a link: before any work."""
    for name in WRITES:
        refuse_link(Path(folder) / name)
    root = Path(folder) / "serving"
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        refuse_link(path)


def run_serving(folder: str | Path, s: ServingSettings, *, quiet: bool = False) -> dict:
    """Run every unit not yet stored; returns {'ran': n, 'kept': n, 'seconds': wall time}."""
    check_writable(folder)
    root = make_folder(make_folder(folder) / "serving")
    write_atomic(Path(folder) / "serving.json", json.dumps(s.to_dict(), indent=2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the simulators are loops of small ops: threads only add overhead
    try:
        return _run_units(root, units(s), quiet)
    finally:
        torch.set_num_threads(threads)


def _run_units(root: Path, todo: list, quiet: bool) -> dict:
    """Run and store each unit of `todo` whose file is absent; the counts and the wall time."""
    ran = kept = 0
    t0 = time.perf_counter()
    for i, (name, run) in enumerate(todo, 1):
        path = root / f"{name}.json"
        if path.exists():
            kept += 1
            continue
        t = time.perf_counter()
        result = run()
        result["seconds"] = time.perf_counter() - t
        write_atomic(path, json.dumps(result, indent=2))
        ran += 1
        if not quiet:
            print(f"[{i}/{len(todo)}] {name}: {result['seconds']:.1f} s", file=sys.stderr, flush=True)  # progress
    return {"ran": ran, "kept": kept, "seconds": time.perf_counter() - t0}


def load_units(folder: str | Path) -> dict[str, dict]:
    """The stored units by name, each read through core.jsonguard (never through a link: LinkRefused; bounded
    nesting) and checked against its unit's schema (questions.serving.schema): ValueError of one line otherwise."""
    from flashcheck.core.jsonguard import read_json

    root = Path(folder) / "serving"
    refuse_link(root, "the serving/ folder of the study")
    units = {}
    for path in sorted(root.glob("*.json")):
        data = read_json(path, "a serving study unit", follow=False, constants=True)  # NaN: a measured value
        units[path.stem] = check_unit(path.stem, data, str(path))
    return units
