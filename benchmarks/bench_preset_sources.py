"""Error of the presets that follow their kernels' sources on four input kinds: relative L2 against the FP64
reference, mean over seeds. Run it with one checkout's code and then another's to compare them (the
SageAttention2 presets fall back to their old names, sage2pp and sage2, on a checkout without sage2-ada):

    PYTHONPATH=src python benchmarks/bench_preset_sources.py --out /tmp/after.json
    PYTHONPATH=/path/to/old/src python benchmarks/bench_preset_sources.py --out /tmp/before.json
    python benchmarks/bench_preset_sources.py --compare /tmp/before.json /tmp/after.json

Input kinds: normal N(0, 1); offset1 / offset3 (a per-channel offset of sd 1 / 3 shared by Q and K, as
activations with a channel bias); small (normal x 0.003); captured:minilm (the bundled model's layer 0, D=32)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.kernels.sim.flash import flash_attention
from flashcheck.kernels.sim.presets import KERNEL_PRESETS, resolve
from flashcheck.kernels.sim.reference import reference_attention

PRESETS = {"sage3-fp4": "bf16", "fa3-fp8": "fp8-e4m3", "sage2-ada": "fp16", "sage2-hopper": "fp16"}
OLD_NAMES = {"sage2-ada": "sage2pp", "sage2-hopper": "sage2"}
KINDS = ("normal", "offset1", "offset3", "small", "captured:minilm")


def inputs(kind: str, seed: int, heads: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Q, K, V [1, heads, seq, D] float64 of one input kind."""
    if kind.startswith("captured"):
        return make_qkv(InputSpec(heads=heads, seq_len=seq, head_dim=32, distribution=kind, seed=seed))
    q, k, v = make_qkv(InputSpec(heads=heads, seq_len=seq, head_dim=64, seed=seed))
    if kind.startswith("offset"):
        g = torch.Generator().manual_seed(1000 + seed)
        shift = float(kind[6:]) * torch.randn(1, heads, 1, 64, generator=g, dtype=torch.float64)
        return q + shift, k + shift, v
    return (q * 0.003, k * 0.003, v * 0.003) if kind == "small" else (q, k, v)


def measure(seeds: int, heads: int, seq: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, fmt in PRESETS.items():
        run_name = name if name in KERNEL_PRESETS else OLD_NAMES[name]
        out[name] = {}
        for kind in KINDS:
            errs = []
            for seed in range(seeds):
                q, k, v = inputs(kind, seed, heads, seq)
                ref = reference_attention(q, k, v)
                with torch.no_grad():
                    o = flash_attention(q, k, v, **resolve(run_name, fmt, seq, seq, q.shape[-1], False))
                errs.append(float((o.double() - ref).norm() / ref.norm()))
            out[name][kind] = sum(errs) / len(errs)
        print(name, f"({run_name})", " ".join(f"{k}={v:.4g}" for k, v in out[name].items()), flush=True)
    return out


def compare(before: dict, after: dict) -> None:
    print("| preset | inputs | before | after | after / before |\n|---|---|---|---|---|")
    for name in after:
        for kind in KINDS:
            b, a = before[name][kind], after[name][kind]
            print(f"| {name} | {kind} | {b:.4g} | {a:.4g} | {a / b:.3g} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", default="")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        b, a = (json.loads(Path(p).read_text()) for p in args.compare)
        return compare(b, a)
    res = measure(args.seeds, args.heads, args.seq)
    if args.out:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)))
        with os.fdopen(fd, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
