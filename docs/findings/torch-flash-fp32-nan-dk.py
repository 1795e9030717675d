#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention under sdpa_kernel([FLASH_ATTENTION]): NaN in dk at max |logit| 1.48e+09 (fp32, Lq=3 Lk=2 D=1, backward, scale x9576, magnitude x256)

A standalone reproducer written by `flashcheck hunt sdpa-flash:fp32 --upstream` (minimal case: dtype=fp32,b=1,h=1,hkv=1,lq=3,lk=2,d=1,causal=0,pad=0,dead=0,shift=0,scale=9576,mag=256,sink=none,seed=0,backward=1; its inputs drawn from seed 0 and embedded as bytes). It imports the library and numpy only. It prints the versions, the observed errors, the FP64 reference's and the same-format reference's; exit 1 while the finding reproduces, 0 once fixed."""
import json

CASE = json.loads(r'''{"title": "torch.nn.functional.scaled_dot_product_attention under sdpa_kernel([FLASH_ATTENTION]): NaN in dk at max |logit| 1.48e+09 (fp32, Lq=3 Lk=2 D=1, backward, scale x9576, magnitude x256)", "target": "sdpa-flash:fp32", "kind": "nan", "tensor": "dk", "dtype": "fp32", "describe": "fp32, Lq=3 Lk=2 D=1, backward, scale x9576, magnitude x256", "backward": true, "scale": 9576.0, "kernel": "FLASH_ATTENTION", "bounds": [191.04655039120297, 95.52327519560149], "timeout_s": 120, "q": {"shape": [1, 1, 3, 1], "dtype": "<f8", "data": "AAAAgOuneEAAAAAAisdSwAAAACApboHA"}, "k": {"shape": [1, 1, 2, 1], "dtype": "<f8", "data": "AAAAwJYwYkAAAAAgNFpxwA=="}, "v": {"shape": [1, 1, 2, 1], "dtype": "<f8", "data": "AAAAoKVgdsAAAABAb9BZQA=="}, "dout": {"shape": [1, 1, 3, 1], "dtype": "<f8", "data": "AAAAoBzR6j8AAACAKATnvwAAAGBh0Nm/"}, "mask": null, "bias": null, "is_causal": false}''')

# ruff: noqa: F821  (array, additive: the common part of the script)
# --- the library: torch's public F.scaled_dot_product_attention under sdpa_kernel ---
import numpy as np
import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def versions():
    return f"torch {torch.__version__}, numpy {np.__version__}"


def observe(case, kernel):
    """out (and dq, dk, dv) of F.scaled_dot_product_attention under sdpa_kernel([kernel]), as float64 arrays."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = DTYPES[case["dtype"]]
    q, k, v = (torch.from_numpy(array(case[n])).to(dt).requires_grad_(case["backward"]) for n in ("q", "k", "v"))
    m = array(case.get("mask"))
    mask = None if m is None else torch.from_numpy(m) if m.dtype == bool else torch.from_numpy(m).to(dt)
    with sdpa_kernel([getattr(SDPBackend, kernel)]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=case["is_causal"],
            scale=case["scale"],
            enable_gqa=q.shape[1] != k.shape[1],
        )
    res = {"out": out}
    if case["backward"]:
        dout = torch.from_numpy(array(case["dout"])).to(dt)
        res |= dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout), strict=True))
    return {n: t.detach().double().numpy() for n, t in res.items()}


def same_format(case):
    """The same call on the MATH backend, in the same dtype (the same-format reference)."""
    return observe(case, "MATH")


# ruff: noqa: F821  (CASE, versions, observe, same_format: the other parts of the script)
# --- the case, the FP64 reference and the verdict (numpy only) ---
import base64
import subprocess
import sys

import numpy as np


def array(entry):
    """An embedded array ({"shape", "dtype", "data": base64 of its little-endian bytes}); None for None."""
    if entry is None:
        return None
    raw = base64.b64decode(entry["data"])
    return np.frombuffer(raw, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"]).copy()


def additive(case, lq, lk):
    """The mask as the library applies it, additive float64 (0 / -inf): causal (top-left) with is_causal."""
    add = np.zeros((lq, lk))
    if case["is_causal"]:
        add = np.where(np.tril(np.ones((lq, lk), dtype=bool)), 0.0, -np.inf)
    for name in ("mask", "bias"):
        m = array(case.get(name))
        if m is not None:
            add = add + (np.where(m, 0.0, -np.inf) if m.dtype == bool else m)
    return add


def reference(case):
    """FP64 attention (and its gradients) of the inputs as the library receives them ([B, H, L, D]); a row with no
    visible key gives 0."""
    q, k, v, dout = (array(case[n]) for n in ("q", "k", "v", "dout"))
    h, hkv = q.shape[1], k.shape[1]
    kk, vv = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
    scale = q.shape[-1] ** -0.5 if case["scale"] is None else case["scale"]
    s = scale * (q @ kk.swapaxes(-1, -2)) + additive(case, q.shape[-2], k.shape[-2])
    top = s.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(top)
    e = np.exp(s - np.where(dead, 0.0, top))
    p = np.where(dead, 0.0, e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True)))
    o = p @ vv
    res = {"out": o}
    if case["backward"]:
        ds = p * (dout @ vv.swapaxes(-1, -2) - (dout * o).sum(axis=-1, keepdims=True))
        g = h // hkv

        def fold(t):  # the query heads of each K/V head summed (grouped-query attention)
            return t.reshape(t.shape[0], hkv, g, *t.shape[2:]).sum(axis=2)

        res |= {
            "dq": scale * ds @ kk,
            "dk": fold(scale * ds.swapaxes(-1, -2) @ q),
            "dv": fold(p.swapaxes(-1, -2) @ dout),
        }
    return res


def errors(got, ref):
    """(max |got - ref|, mean |got - ref|, entries not finite where ref is) over the entries where ref is finite."""
    fin = np.isfinite(ref)
    bad = int((~np.isfinite(got) & fin).sum())
    err = np.abs(got - ref)[fin & np.isfinite(got)]
    return (float(err.max()) if err.size else 0.0), (float(err.mean()) if err.size else 0.0), bad


def judged(case, got, ref, same):
    """Print each tensor's errors beside the same-format reference's; whether the finding is present."""
    present = False
    for name in ref:
        emax, emean, bad = errors(got[name], ref[name])
        line = f"{name}: max |observed - FP64| {emax:.4g}, mean {emean:.4g}, non-finite where FP64 is finite: {bad}"
        if same is not None and name in same:
            smax, smean, sbad = errors(same[name], ref[name])
            line += f"; same-format reference: max {smax:.4g}, mean {smean:.4g}, non-finite {sbad}"
        print(line)
        if name != case["tensor"]:
            continue
        if case["kind"] in ("nan", "inf"):
            present = bad > 0
        else:  # budget: flashcheck's bounds (the peers' rule: k x plain attention's error in the format + floor)
            bmax, bmean = case["bounds"]
            print(f"{name}: the budget: max {bmax:.4g}, mean {bmean:.4g}")
            present = bad > 0 or emax > bmax or (bmean == bmean and emean > bmean)
    return present


def crashed(case):
    """The call run in a child process: whether it died (a signal) or gave no answer in time."""
    try:
        done = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, timeout=case["timeout_s"])
    except subprocess.TimeoutExpired:
        print(f"the call gave no answer in {case['timeout_s']} s")
        return True
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    if done.returncode < 0:
        print(f"the call killed its process (signal {-done.returncode}); its last words: {' | '.join(tail)}")
        return True
    print(f"the call returned (exit code {done.returncode})" + (f": {' | '.join(tail)}" if done.returncode else ""))
    return False


def main(case):
    if "--child" in sys.argv:
        observe(case, case["kernel"])
        return 0
    print(case["title"])
    print("versions:", versions())
    print("case:", case["describe"])
    if case["kind"] == "crash":
        present = crashed(case)
    else:
        present = judged(case, observe(case, case["kernel"]), reference(case), same_format(case))
    print("PRESENT: the finding reproduces (exit 1)" if present else "FIXED: the finding no longer reproduces (exit 0)")
    return 1 if present else 0


if __name__ == "__main__":
    sys.exit(main(CASE))
