"""Weights and losses of every run kind of a train-study (standard and Flash attention, re-seeded, bf16 and fp16
autocast, 8-bit attention from the start and from half-way, attention-free) after a few steps at a small size,
saved for a bit-for-bit before/after comparison of two source trees (a speed change must move no bit).

    PYTHONPATH=/path/to/before/src python benchmarks/train_bit_identity.py save /tmp/before.pt
    PYTHONPATH=src python benchmarks/train_bit_identity.py save /tmp/after.pt
    python benchmarks/train_bit_identity.py compare /tmp/before.pt /tmp/after.pt    # exit 1 on any difference

Cases a source tree cannot build (a field or data set it does not have yet) are left out and named; compare
checks the cases both files hold, and names the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile

import torch

KINDS = {
    "base": {},
    "flash": {"attention": "flash:bf16-mixed"},
    "reseed": {"seed": 1000},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "sage8": {"attention": "sagebwd"},
    "sage8ft": {"then_attention": "sagebwd", "then_from": 3},
    "noattn": {"attention": "none"},
}


def _cases():
    from flashcheck.training.model import GPTConfig
    from flashcheck.training.train import RunConfig

    model = GPTConfig(vocab=32, seq_len=64, layers=2, heads=2, dim=32)  # two key tiles of 32: Flash rescales
    base = {"attention": "standard:bf16-mixed", "steps": 6, "save_every": 3, "batch": 4, "model": model}
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    for data, extra in (("synthetic", {}), ("lookback", {"warmup": 2, "schedule": "cosine", "lr": 1e-2})):
        for kind, over in KINDS.items():
            kw = {"name": kind, **base, "data": data, **extra, **over}
            missing = sorted(set(kw) - fields)
            try:
                cfg = None if missing else RunConfig(**kw)
            except ValueError as exc:
                missing = [str(exc)]
            yield f"{data}/{kind}", cfg, missing


def save(path: str) -> None:
    from flashcheck.training.train import train

    out: dict[str, torch.Tensor | list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg, missing in _cases():
            if cfg is None:
                print(f"skip {name}: this tree lacks {', '.join(missing)}", file=sys.stderr)
                continue
            try:
                res = train(cfg, f"{tmp}/{name.replace('/', '-')}")
            except ValueError as exc:  # e.g. a data set or attention this tree does not know
                print(f"skip {name}: {exc}", file=sys.stderr)
                continue
            state = torch.load(f"{tmp}/{name.replace('/', '-')}/weights/step_{cfg.steps:06d}.pt", weights_only=True)
            for key, t in state.items():
                out[f"{name}/{key}"] = t
            out[f"{name}/losses"] = torch.tensor(res["losses"], dtype=torch.float64)
            print(f"{name}: final loss {res['losses'][-1]:.6f}", file=sys.stderr)
    torch.save(out, path)


def compare(a_path: str, b_path: str) -> int:
    a, b = (torch.load(p, weights_only=True) for p in (a_path, b_path))
    common = sorted(set(a) & set(b))
    bad = [k for k in common if a[k].dtype != b[k].dtype or not torch.equal(a[k].view(-1), b[k].view(-1))]
    cases = sorted({k.rsplit("/", 1)[0] for k in common})
    for k in sorted(set(a) ^ set(b)):
        print(f"only in {'before' if k in a else 'after'}: {k}")
    for k in bad:
        print(f"DIFFERS: {k}")
    print(f"{len(cases)} cases, {len(common)} tensors compared, {len(bad)} differ")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("save").add_argument("path")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.path)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
