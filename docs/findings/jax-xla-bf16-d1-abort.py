#!/usr/bin/env python3
"""jax.nn.dot_product_attention(implementation='xla'), jitted: the process died of SIGABRT (bf16, Lq=64 Lk=64 D=1)

A standalone reproducer written by `flashcheck hunt jax-xla --upstream` (minimal case: dtype=bf16,b=1,h=1,hkv=1,lq=64,lk=64,d=1,causal=0,pad=0,dead=0,shift=0,scale=1,mag=1,sink=none,seed=0,backward=0; its inputs drawn from seed 0 and embedded as bytes). It imports the library and numpy only. It prints the versions, the observed errors, the FP64 reference's and the same-format reference's; exit 1 while the finding reproduces, 0 once fixed."""
import json

CASE = json.loads(r'''{"title": "jax.nn.dot_product_attention(implementation='xla'), jitted: the process died of SIGABRT (bf16, Lq=64 Lk=64 D=1)", "target": "jax-xla", "kind": "crash", "tensor": "SIGABRT", "dtype": "bf16", "describe": "bf16, Lq=64 Lk=64 D=1", "backward": false, "scale": 1.0, "kernel": "xla", "bounds": [NaN, NaN], "timeout_s": 120, "q": {"shape": [1, 1, 64, 1], "dtype": "<f8", "data": "AAAAAACAAsAAAAAAAODXvwAAAAAAAPG/AAAAAAAA8D8AAAAAAEDsvwAAAAAAYPS/AAAAAAAA5L8AAAAAAMDrvwAAAAAAwPS/AAAAAABg+D8AAAAAAMDUPwAAAAAAIABAAAAAAAAg8j8AAAAAAKDzvwAAAAAAQLI/AAAAAACg1T8AAAAAAKDDPwAAAAAAQOS/AAAAAAAg9L8AAAAAAEDnvwAAAAAAgJS/AAAAAADgyj8AAAAAAKDGPwAAAAAAoOq/AAAAAAAg8D8AAAAAACDPvwAAAAAAwOi/AAAAAACA+b8AAAAAAADmvwAAAAAAwPc/AAAAAADA3L8AAAAAAIDsvwAAAAAAgLe/AAAAAADA4T8AAAAAAGCDvwAAAAAAgPO/AAAAAABA9L8AAAAAAODxvwAAAAAAoPI/AAAAAACg7T8AAAAAAODkPwAAAAAAAMM/AAAAAABg8r8AAAAAAAD+PwAAAAAA4NO/AAAAAADAzj8AAAAAAKD1vwAAAAAAQM8/AAAAAAAgCcAAAAAAACC9vwAAAAAAIPs/AAAAAABA5b8AAAAAAMDivwAAAAAAoAZAAAAAAADg7D8AAAAAAGDuPwAAAAAAIPa/AAAAAACAAMAAAAAAAGCoPwAAAAAAoNi/AAAAAACg0b8AAAAAAGDsPwAAAAAAwPc/AAAAAAAggL8="}, "k": {"shape": [1, 1, 64, 1], "dtype": "<f8", "data": "AAAAAAAA8r8AAAAAAAC4vwAAAAAAAPA/AAAAAAAgtb8AAAAAAGDHPwAAAAAAYO4/AAAAAABA/L8AAAAAACDwPwAAAAAAAOg/AAAAAAAA4r8AAAAAAACzPwAAAAAA4P8/AAAAAADA3D8AAAAAAOD4PwAAAAAAoKs/AAAAAACg9z8AAAAAAIDmvwAAAAAA4NQ/AAAAAAAA7L8AAAAAAEDZPwAAAAAAgOw/AAAAAADA8j8AAAAAAEDZvwAAAAAAoNw/AAAAAAAgxr8AAAAAAEDvPwAAAAAAoNo/AAAAAADg378AAAAAAGDevwAAAAAAYNI/AAAAAAAg9b8AAAAAAIDsPwAAAAAAAOO/AAAAAADg4z8AAAAAAMD3vwAAAAAAwPU/AAAAAADA2j8AAAAAAADWPwAAAAAAQNa/AAAAAABg878AAAAAAIDKPwAAAAAAAL6/AAAAAADgkb8AAAAAACDPvwAAAAAAINy/AAAAAADABUAAAAAAAGD3vwAAAAAA4Ns/AAAAAAAA4b8AAAAAACDBvwAAAAAA4PU/AAAAAADAzT8AAAAAAMDxPwAAAAAAQOs/AAAAAAAg5L8AAAAAAEDjvwAAAAAA4PE/AAAAAADA4b8AAAAAAADhPwAAAAAAAMi/AAAAAACA2T8AAAAAAKDlvwAAAAAAoPo/AAAAAABg478="}, "v": {"shape": [1, 1, 64, 1], "dtype": "<f8", "data": "AAAAAABgqz8AAAAAAICLPwAAAAAAoPi/AAAAAADg3r8AAAAAAGDoPwAAAAAAwMs/AAAAAACg3r8AAAAAAIDQvwAAAAAA4NA/AAAAAAAA2r8AAAAAAKCyvwAAAAAA4MG/AAAAAAAg6T8AAAAAAIAAwAAAAAAAgOW/AAAAAACg2b8AAAAAAOC3PwAAAAAAwOS/AAAAAADA5b8AAAAAAIC1vwAAAAAA4PS/AAAAAACg9r8AAAAAAMDUPwAAAAAAgPS/AAAAAABg2r8AAAAAAMDxvwAAAAAAINm/AAAAAAAA3b8AAAAAAIDxPwAAAAAAAMW/AAAAAADAyb8AAAAAAMD9vwAAAAAAoOw/AAAAAACA/78AAAAAAMD3PwAAAAAAYMm/AAAAAADg+r8AAAAAACD2PwAAAAAAYAjAAAAAAAAg478AAAAAAOC9PwAAAAAAoJ4/AAAAAABg6z8AAAAAACDtPwAAAAAAwPG/AAAAAAAA5L8AAAAAAGDBPwAAAAAAANu/AAAAAABgur8AAAAAAKD0vwAAAAAAoPY/AAAAAACg3D8AAAAAAIDKvwAAAAAAYPI/AAAAAAAA4r8AAAAAAMClPwAAAAAAwOk/AAAAAAAA7T8AAAAAAIDLvwAAAAAAYOA/AAAAAADg6T8AAAAAAGD1vwAAAAAAwMq/AAAAAACg5b8="}, "dout": {"shape": [1, 1, 64, 1], "dtype": "<f8", "data": "AAAAAABg6r8AAAAAAEDTPwAAAAAAgOy/AAAAAADA4D8AAAAAAID5vwAAAAAAoNS/AAAAAACA+L8AAAAAACDnPwAAAAAAINS/AAAAAABA0D8AAAAAAGDwvwAAAAAAQO+/AAAAAACg278AAAAAAOABwAAAAAAAoPI/AAAAAABg9T8AAAAAAAD8vwAAAAAAoN+/AAAAAAAg3z8AAAAAAKDlPwAAAAAA4Pk/AAAAAADA0z8AAAAAAODHPwAAAAAAgN6/AAAAAADA9T8AAAAAACDrPwAAAAAAwN+/AAAAAADAq78AAAAAAAADQAAAAAAAQOg/AAAAAAAA6j8AAAAAAEDWPwAAAAAAgLm/AAAAAAAg6r8AAAAAAKABQAAAAAAAwKE/AAAAAACgy78AAAAAAED3vwAAAAAAgNW/AAAAAAAgyb8AAAAAAADkPwAAAAAAoNO/AAAAAAAA+r8AAAAAAEDuvwAAAAAAIOU/AAAAAABg8D8AAAAAAODIvwAAAAAAwP+/AAAAAADA178AAAAAAED4vwAAAAAA4Ne/AAAAAAAg8j8AAAAAAGDZvwAAAAAAQKa/AAAAAADg8j8AAAAAAIDhPwAAAAAAAOC/AAAAAABg2L8AAAAAAKD0PwAAAAAAAKE/AAAAAAAA1j8AAAAAAODgPwAAAAAAwATAAAAAAABg6L8="}, "mask": null, "bias": null, "is_causal": false, "jit": true}''')

# ruff: noqa: F821  (array, additive: the common part of the script)
# --- the library: JAX's public jax.nn.dot_product_attention ---
import jax
import jax.numpy as jnp
import numpy as np

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def versions():
    import jaxlib

    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {np.__version__}"


def _run(case, fn):
    """fn(q, k, v, mask, bias) in JAX's [B, L, H, D] layout (and its vjp), as float64 arrays in [B, H, L, D]."""
    dt = DTYPES[case["dtype"]]
    arrays = (array(case[n]).swapaxes(1, 2).astype(np.float32) for n in ("q", "k", "v", "dout"))
    q, k, v, dout = (jnp.asarray(a).astype(dt) for a in arrays)
    m, b = array(case.get("mask")), array(case.get("bias"))
    extra = (None if m is None else jnp.asarray(m), None if b is None else jnp.asarray(b.astype(np.float32)))
    call = jax.jit(fn) if case["jit"] else fn
    if case["backward"]:
        out, vjp = jax.vjp(lambda a, b_, c: call(a, b_, c, *extra), q, k, v)
        res = {"out": out} | dict(zip(("dq", "dk", "dv"), vjp(dout), strict=True))
    else:
        res = {"out": call(q, k, v, *extra)}
    return {n: np.asarray(t.astype(jnp.float32)).astype(np.float64).swapaxes(1, 2) for n, t in res.items()}


def observe(case, kernel):
    def fn(a, b, c, mask, bias):
        return jax.nn.dot_product_attention(
            a, b, c, bias=bias, mask=mask, scale=case["scale"], is_causal=case["is_causal"], implementation=kernel
        )

    return _run(case, fn)


def same_format(case):
    """Plain attention in the same dtype (einsum, softmax, einsum; jnp ops in the format)."""

    def fn(a, b, c, mask, bias):
        g = a.shape[2] // b.shape[2]
        b, c = jnp.repeat(b, g, axis=2), jnp.repeat(c, g, axis=2)
        scale = a.shape[-1] ** -0.5 if case["scale"] is None else case["scale"]
        s = jnp.einsum("bqhd,bkhd->bhqk", a, b) * jnp.asarray(scale, a.dtype)
        lq, lk = s.shape[-2:]
        keep = jnp.tril(jnp.ones((lq, lk), bool)) if case["is_causal"] else jnp.ones((lq, lk), bool)
        if mask is not None:
            keep = keep & mask
        if bias is not None:
            s = s + bias.astype(s.dtype)
        s = jnp.where(keep, s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), c)

    return _run(case, fn)


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
    lines = [x.strip() for x in done.stderr.decode("utf-8", "replace").splitlines() if x.strip()]
    why = ("Check failed", "Fatal", "Floating point exception", "Segmentation fault", "terminate")
    said = next((x for x in lines if any(w in x for w in why)), lines[-1] if lines else "")[:300]
    if done.returncode < 0:
        print(f"the call killed its process (signal {-done.returncode}); it said: {said}")
        return True
    print(f"the call returned (exit code {done.returncode})" + (f": {said}" if done.returncode else ""))
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
