# ruff: noqa: F821  (array, additive: the common part of the script)
# --- the library: onnxruntime running an ONNX model of one Attention node (opset 23), embedded as exported ---
import base64

import numpy as np
import onnxruntime as ort


def versions():
    return f"onnxruntime {ort.__version__}, numpy {np.__version__}"


def _np_dtype(name):
    if name == "bf16":
        import ml_dtypes  # onnxruntime reads bfloat16 arrays through ml_dtypes

        return ml_dtypes.bfloat16
    return {"fp32": np.float32, "fp16": np.float16}[name]


def observe(case, kernel):
    """Y of the embedded model on the case's inputs, as a float64 array."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(base64.b64decode(case["model"]), sess_options=opts, providers=[kernel])
    dt = _np_dtype(case["dtype"])
    feeds = {n.upper(): array(case[n]).astype(np.float32).astype(dt) for n in ("q", "k", "v")}
    m = array(case.get("mask"))
    if m is not None:
        feeds["attn_mask"] = m if m.dtype == bool else m.astype(np.float32).astype(dt)
    (y,) = sess.run(["Y"], feeds)
    return {"out": y.astype(np.float32).astype(np.float64)}


def same_format(case):
    """The operator's steps in the input type with numpy (fp16 / fp32; None for bf16, which numpy has not)."""
    if case["dtype"] == "bf16":
        return None
    dt = _np_dtype(case["dtype"])
    q, k, v = (array(case[n]).astype(dt) for n in ("q", "k", "v"))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = dt(q.shape[-1] ** -0.5 if case["scale"] is None else case["scale"])
    with np.errstate(all="ignore"):
        s = (q @ k.swapaxes(-1, -2)) * scale + additive(case, q.shape[-2], k.shape[-2]).astype(dt)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return {"out": (p @ v).astype(np.float64)}
