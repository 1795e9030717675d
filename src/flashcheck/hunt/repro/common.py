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
