"""Outputs of the flash simulator over policies, presets, masks, GQA, ragged lengths, FA1 and the backward,
saved for a bit-for-bit before/after comparison of two source trees (a speed change must move no bit).

    PYTHONPATH=/path/to/before/src python benchmarks/bit_identity.py save /tmp/before.pt
    PYTHONPATH=src python benchmarks/bit_identity.py save /tmp/after.pt
    python benchmarks/bit_identity.py compare /tmp/before.pt /tmp/after.pt    # exit 1 on any difference

Shapes are small but span two query tiles (so the tile thread pool runs) at 2 threads; `--threads 1` runs every
query tile in one thread (a single tile too: kernels.native.step's whole-tile C then runs on it). The fast paths
against torch's ops in the same tree: save once as is and once with FLASHCHECK_NATIVE=0, then compare. Inputs are
float64, except the float32-inputs cases (the float32 tensors a model passes).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

CASES_POLICIES = ("bf16", "bf16-mixed", "fp16", "fp16-mixed", "fp32", "fp64")


def _inputs(lq: int, lk: int, h: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, lq, d, generator=g, dtype=torch.float64) * 2
    k = torch.randn(1, hkv, lk, d, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, hkv, lk, d, generator=g, dtype=torch.float64)
    return q, k, v


def _cases():
    from flashcheck.kernels.sim.presets import KERNEL_PRESETS, default_format, resolve

    long = (2600, 2600, 2, 2, 32)  # two query tiles of the 2 MiB score budget at H=2
    for pol in CASES_POLICIES:
        yield f"{pol}/long", long, {"policy": pol}
        yield f"{pol}/causal", (300, 300, 2, 2, 32), {"policy": pol, "causal": True}
        yield f"{pol}/ragged-gqa", (190, 333, 4, 2, 24), {"policy": pol, "block_k": 64}
        yield f"{pol}/fa1", (200, 260, 2, 2, 16), {"policy": pol, "algorithm": "fa1"}
        yield f"{pol}/exp2-causal-ragged", (150, 400, 2, 2, 16), {"policy": pol, "exp2": True, "causal": True}
        yield f"{pol}/float32-inputs", (520, 300, 2, 2, 64), {"policy": pol, "causal": True}
    for pol in ("bf16-mixed", "fp32", "fp16-mixed"):  # the C tile's shapes: scales that are no power of two,
        # causal both ways of Lq != Lk, grouped K / V heads, head dims 32-256, several query tiles (H=8)
        yield f"{pol}/causal-d128", (300, 300, 2, 2, 128), {"policy": pol, "causal": True}
        yield f"{pol}/causal-gqa-d96-wide", (260, 390, 4, 2, 96), {"policy": pol, "causal": True, "block_k": 64}
        yield f"{pol}/causal-gqa-d256-tall", (390, 260, 2, 1, 256), {"policy": pol, "causal": True}
        yield f"{pol}/causal-gqa-d128-tiles", (1100, 1100, 8, 2, 128), {"policy": pol, "causal": True}
        yield f"{pol}/gqa-d64-tiles", (1100, 900, 8, 4, 64), {"policy": pol}
        yield f"{pol}/causal-d32-tiles", (1300, 1300, 8, 8, 32), {"policy": pol, "causal": True, "block_k": 96}
        # float32 inputs: a forward keeps grouped heads unrepeated (the C tiles read each group)
        yield f"{pol}/causal-gqa-d128-tiles-float32-inputs", (1100, 1100, 8, 2, 128), {"policy": pol, "causal": True}
        yield f"{pol}/causal-gqa-d96-wide-float32-inputs", (260, 390, 4, 2, 96), {"policy": pol, "causal": True}
    mask = torch.rand(1, 1, 200, 260, generator=torch.Generator().manual_seed(3)) > 0.3
    yield "bf16-mixed/mask", (200, 260, 2, 2, 16), {"policy": "bf16-mixed", "mask": mask}
    yield from _mask_cases()
    for name in KERNEL_PRESETS:
        shape = (256, 256, 2, 2, 64)
        try:
            kw = resolve(name, default_format(name), shape[0], shape[1], shape[4], False)
        except ValueError as err:
            print(f"skip preset {name}: {err}", file=sys.stderr)
            continue
        yield f"preset/{name}", shape, kw


def _alibi(h: int, lq: int, lk: int, dtype: torch.dtype) -> torch.Tensor:
    """An ALiBi-like float bias [1, H, Lq, Lk]: -2^-(h+1) |i - j|, -inf more than 150 keys back, -0.0 on the
    diagonal's right neighbour (a signed zero added to every score there)."""
    i, j = torch.arange(lq).unsqueeze(-1), torch.arange(lk)
    slope = torch.tensor([2.0 ** -(n + 1) for n in range(h)]).view(1, h, 1, 1)
    bias = (-slope * (i - j).abs()).masked_fill(j < i - 150, -float("inf"))
    return bias.masked_fill(j == i + 1, -0.0).to(dtype)


def _mask_cases():
    """User masks (bool, float of each dtype, broadcast shapes) in the C tiles' and C backward's shapes: key
    padding (left under causal: rows of no key), random bool per head, ALiBi-like float biases with -inf, a float
    mask with +inf and NaN (torch's ops: no C), exp2."""
    from flashcheck.kernels.sim.masks import key_padding_mask

    g = torch.Generator().manual_seed(5)
    for pol in ("bf16-mixed", "fp32", "fp16-mixed"):
        pad = key_padding_mask([900], 1100, side="left")  # causal: rows 0-199 see only padding
        yield f"{pol}/mask-pad-left-causal-gqa-d128-tiles", (1100, 1100, 8, 2, 128), {
            "policy": pol, "causal": True, "mask": pad}  # fmt: skip
        keep = torch.rand(1, 4, 260, 390, generator=g) > 0.3
        keep[..., 7, :] = False
        yield f"{pol}/mask-bool-causal-gqa-d96-wide", (260, 390, 4, 2, 96), {
            "policy": pol, "causal": True, "block_k": 64, "mask": keep}  # fmt: skip
        yield f"{pol}/mask-alibi64-causal-gqa-tall", (390, 260, 2, 1, 64), {
            "policy": pol, "causal": True, "mask": _alibi(2, 390, 260, torch.float64)}  # fmt: skip
        yield f"{pol}/mask-alibi-bf16-2d", (300, 300, 2, 2, 32), {
            "policy": pol, "mask": _alibi(1, 300, 300, torch.bfloat16)[0, 0]}  # fmt: skip
        keys = (torch.randn(1, 1, 1, 700, generator=g) * 3).masked_fill(~key_padding_mask([600], 700), -float("inf"))
        yield f"{pol}/mask-keys-fp16-d256-float32-inputs", (500, 700, 4, 4, 256), {
            "policy": pol, "mask": keys.half()}  # fmt: skip
    bad = _alibi(2, 200, 260, torch.float32)
    bad[0, 0, 5, 9], bad[0, 1, 40, 100] = float("inf"), float("nan")
    yield "bf16-mixed/mask-inf-nan", (200, 260, 2, 2, 64), {"policy": "bf16-mixed", "mask": bad}
    yield "bf16-mixed/mask-exp2-causal", (300, 300, 2, 2, 64), {
        "policy": "bf16-mixed", "exp2": True, "causal": True, "mask": _alibi(2, 300, 300, torch.float32)}  # fmt: skip


def save(path: str, threads: int = 2) -> None:
    from flashcheck.kernels import flash_attention

    torch.set_num_threads(threads)
    out: dict[str, torch.Tensor] = {}
    for i, (name, (lq, lk, h, hkv, d), kw) in enumerate(_cases()):
        q, k, v = _inputs(lq, lk, h, hkv, d, i)
        if "float32-inputs" in name:  # the caller's float32 tensors (kernels.sim.fp8: no float64 round trip)
            q, k, v = (t.float() for t in (q, k, v))
        try:
            o, lse = flash_attention(q, k, v, return_lse=True, **kw)
        except ValueError as err:
            print(f"skip {name}: {err}", file=sys.stderr)
            continue
        out[f"{name}/out"], out[f"{name}/lse"] = o, lse
        policy = kw["policy"]
        if isinstance(policy, str) and not name.startswith("preset/") and "fa1" not in name:
            qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
            o = flash_attention(qq, kk, vv, **kw)
            o.backward(torch.randn(o.shape, generator=torch.Generator().manual_seed(i), dtype=o.dtype))
            for tag, t in zip("qkv", (qq, kk, vv), strict=True):
                out[f"{name}/d{tag}"] = t.grad
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(out, tmp)
    os.replace(tmp, path)
    print(f"{len(out)} tensors -> {path}")


def _read(path: str) -> dict[str, torch.Tensor]:
    """A file `save` wrote (tensors only: weights_only), or exit 2 with one line naming it and why not."""
    try:
        out = torch.load(path, weights_only=True)
    except Exception as err:  # a missing file, a folder, not a torch file: all one line
        why = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"  # its first line
    else:
        if isinstance(out, dict) and all(isinstance(v, torch.Tensor) for v in out.values()):
            return out
        why = "not a dict of tensors"
    print(f"error: {path!r} is not a file `bit_identity.py save` wrote: {why}", file=sys.stderr)
    sys.exit(2)


def compare(a: str, b: str) -> int:
    """0 when both files hold the same names and every tensor's bits are equal, else 1 (each difference named)."""
    before, after = _read(a), _read(b)
    bad = sorted(set(before) ^ set(after))
    for key in sorted(set(before) & set(after)):
        x, y = before[key], after[key]
        same = x.dtype == y.dtype and x.shape == y.shape
        same = same and torch.equal(
            x.view(torch.uint8) if x.is_floating_point() else x, y.view(torch.uint8) if y.is_floating_point() else y
        )  # NaN bits too
        if not same:
            bad.append(key)
    for key in bad:
        print(f"DIFFERS {key}")
    print(f"{len(set(before) & set(after))} tensors compared, {len(bad)} differ")
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("save")
    sv.add_argument("path")
    sv.add_argument("--threads", type=int, choices=(1, 2), default=2, help="intra-op threads (1: every tile in C)")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args()
    if args.cmd == "save":
        save(args.path, args.threads)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
