"""ONNX Runtime behind the backend signature: a one-node graph built in memory with onnx.helper — the ONNX
`Attention` operator (opset 23) where the installed runtime implements it, else com.microsoft's
MultiHeadAttention — run on the CPU provider (the CUDA provider on cuda). onnx and onnxruntime are the optional
extra `flashcheck[onnx]`, imported only when asked.

Attention takes flashcheck's [B, H, L, D] as it is (K/V with fewer heads: its grouped-query form); causal is
bottom-right aligned, so an explicit bool mask is passed when Lq != Lk (the operator's is_causal offsets by
the past keys only); masks are bool (True = keep) or additive in the input dtype. MultiHeadAttention takes
[B, L, H * D] with as many K/V heads as query heads (repeated here) and one additive attention_bias that
carries the mask and the causal triangle. Forward only."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass

import torch

from flashcheck.backends.base import Availability, Backend
from flashcheck.kernels.sim.validation import expand_kv_heads

EXTRA = "onnx"
OPSET = 23
_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
OPERATORS = ("Attention", "MultiHeadAttention")  # the ONNX operator, com.microsoft's contrib operator
_ELEM = {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16, torch.bool: 9}  # onnx.TensorProto codes


def missing_onnx() -> str | None:
    """Why onnx or onnxruntime cannot be imported here (None: both can); names the extra to install."""
    for name in ("onnx", "onnxruntime"):
        try:
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named {name!r}")
            importlib.import_module(name)
        except Exception as exc:  # None in sys.modules (ImportError), or a broken install
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            from flashcheck.core.extras import install_hint

            extra = install_hint(EXTRA)
            return f"{name} is not installed or fails to import ({why}); install the extra: {extra}"
    return None


def onnx_version() -> str | None:
    if missing_onnx():
        return None
    import onnx
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}"


def _graph(dtype: torch.dtype, mask_dtype: torch.dtype | None, attrs: tuple, ranks: tuple[int, ...]) -> bytes:
    """A model with one ONNX Attention node: inputs Q, K, V (and attn_mask), output Y, all 4-D, dynamic sizes."""
    import onnx
    from onnx import helper

    def value(name, elem, rank):
        return helper.make_tensor_value_info(name, elem, [f"{name}{i}" for i in range(rank)])

    names = ["Q", "K", "V"] + (["attn_mask"] if mask_dtype is not None else [])
    node = helper.make_node("Attention", names, ["Y"], **dict(attrs))
    elem = _ELEM[dtype]
    inputs = [value(n, elem, 4) for n in ("Q", "K", "V")]
    if mask_dtype is not None:
        inputs.append(value("attn_mask", _ELEM[mask_dtype], ranks[0]))
    graph = helper.make_graph([node], "flashcheck_attention", inputs, [value("Y", elem, 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = min(model.ir_version, 11)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _mha_graph(dtype: torch.dtype, heads: int, scale: float | None, with_bias: bool) -> bytes:
    """A model with one com.microsoft MultiHeadAttention node: query, key, value [B, L, H * D] (and
    attention_bias [B|1, H|1, Lq, Lk]), output [B, Lq, H * Dv]."""
    import onnx
    from onnx import helper

    elem = _ELEM[dtype]

    def value(name, rank):
        return helper.make_tensor_value_info(name, elem, [f"{name}{i}" for i in range(rank)])

    attrs = {"num_heads": heads, **({"scale": float(scale)} if scale is not None else {})}
    names = ["query", "key", "value"] + (["", "", "attention_bias"] if with_bias else [])
    node = helper.make_node("MultiHeadAttention", names, ["output"], domain="com.microsoft", **attrs)
    inputs = [value(n, 3) for n in ("query", "key", "value")] + ([value("attention_bias", 4)] if with_bias else [])
    graph = helper.make_graph([node], "flashcheck_mha", inputs, [value("output", 3)])
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 11)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@functools.cache
def attention_operator() -> str:
    """ "Attention" when this onnxruntime's CPU provider runs the ONNX Attention operator (opset 23), else
    "MultiHeadAttention" (com.microsoft), found by running a one-row graph once."""
    import numpy as np

    try:
        sess = _session(_graph(torch.float32, None, (("is_causal", 0),), ()), _PROVIDER["cpu"])
        ones = np.ones((1, 1, 1, 1), np.float32)
        sess.run(["Y"], {"Q": ones, "K": ones, "V": ones})
    except Exception:  # NOT_IMPLEMENTED, or a runtime whose opsets stop before 23
        return "MultiHeadAttention"
    return "Attention"


@functools.cache
def _session(model: bytes, provider: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: no warnings about unused providers on stderr
    return ort.InferenceSession(model, sess_options=opts, providers=[provider])


def _numpy(t: torch.Tensor):
    """A CPU numpy array of t's dtype (bf16 through ml_dtypes, which onnxruntime reads as bfloat16)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.detach().cpu().float().numpy().astype(ml_dtypes.bfloat16)
    return t.detach().cpu().numpy()


def _mask(mask: torch.Tensor | None, causal: bool, q: torch.Tensor, k: torch.Tensor):
    """(attn_mask or None, is_causal): bool keeps or an additive mask in q's dtype, bottom-right causal folded in."""
    lq, lk = q.shape[-2], k.shape[-2]
    if mask is None and (not causal or lq == lk):
        return None, causal
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        keep = torch.tril(keep, diagonal=lk - lq)
    if mask is None:
        return keep, False
    mask = mask.cpu()
    if mask.dtype == torch.bool:
        return mask & keep, False
    return mask.to(q.dtype).masked_fill(~keep, float("-inf")), False


@dataclass
class OnnxRuntimeBackend(Backend):
    """onnxruntime.InferenceSession of one ONNX Attention node (one session per dtype, mask and settings)."""

    supports_gqa: bool = True
    supports_backward: bool = False
    operator: str | None = None  # one of OPERATORS; None: Attention where the runtime implements it

    def op(self) -> str:
        if self.operator is not None and self.operator not in OPERATORS:
            raise ValueError(f"operator {self.operator!r} is not allowed; expected one of {', '.join(OPERATORS)}")
        return self.operator or attention_operator()

    def label(self) -> str:
        return f"{self.name}[{self.op()}]" if not missing_onnx() else self.name

    def _available(self, device: str) -> Availability:
        if why := missing_onnx():
            return Availability(False, why)
        import onnxruntime as ort

        if _PROVIDER[device] not in ort.get_available_providers():
            have = ", ".join(ort.get_available_providers())
            return Availability(False, f"onnxruntime {ort.__version__} has no {_PROVIDER[device]} here ({have})")
        return Availability(True)

    def missing_package(self) -> str | None:
        return missing_onnx()

    def version(self) -> str | None:
        return onnx_version()

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        if self.op() == "MultiHeadAttention":
            return self._mha(q, k, v, causal=causal, scale=scale, mask=mask)
        attn_mask, is_causal = _mask(mask, causal, q, k)
        attrs = (("is_causal", int(is_causal)),) + ((("scale", float(scale)),) if scale is not None else ())
        mdt = None if attn_mask is None else attn_mask.dtype
        ranks = (attn_mask.dim(),) if attn_mask is not None else ()
        sess = _session(_graph(q.dtype, mdt, attrs, ranks), _PROVIDER[q.device.type])
        feeds = {"Q": _numpy(q), "K": _numpy(k), "V": _numpy(v)}
        if attn_mask is not None:
            feeds["attn_mask"] = _numpy(attn_mask)
        (y,) = sess.run(["Y"], feeds)
        out = torch.from_numpy(y.astype("float32") if q.dtype == torch.bfloat16 else y.copy())
        return out.to(q.dtype).to(q.device)

    def _mha(self, q, k, v, *, causal, scale, mask):
        """com.microsoft MultiHeadAttention: [B, L, H * D] inputs, K/V heads repeated, the mask as an additive bias."""
        b, h, lq, _ = q.shape
        k, v = expand_kv_heads(q, k, v)
        keep, _ = _mask(mask, causal, q, k)
        if keep is None and causal:  # Lq == Lk without a mask: the plain lower triangle
            keep = torch.ones(lq, lq, dtype=torch.bool).tril()
        bias = None
        if keep is not None:
            keep = keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape))
            bias = keep if keep.dtype != torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
        sess = _session(_mha_graph(q.dtype, h, scale, bias is not None), _PROVIDER[q.device.type])
        feeds = {
            n: _numpy(t.transpose(1, 2).reshape(b, t.shape[2], -1)) for n, t in (("query", q), ("key", k), ("value", v))
        }
        if bias is not None:
            feeds["attention_bias"] = _numpy(bias.to(q.dtype))
        (y,) = sess.run(["output"], feeds)
        out = torch.from_numpy(y.astype("float32") if q.dtype == torch.bfloat16 else y.copy())
        return out.reshape(b, lq, h, -1).transpose(1, 2).to(q.dtype).to(q.device)


def onnx_backends() -> list[Backend]:
    return [
        OnnxRuntimeBackend(
            "onnxruntime",
            f"ONNX Runtime: one ONNX Attention node (opset {OPSET}), CPU provider (extra flashcheck[onnx])",
            dtypes=(torch.float32, torch.float16),
        )
    ]
