"""The onnxruntime backend (one ONNX Attention node, opset 23, CPU provider): layout, masks, GQA and scale
against the FP64 reference; fp16 within the peers' budget; onnxruntime absent -> the extra named."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backends import get_backend
from flashcheck.cli import app
from flashcheck.core.extras import install_hint
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.kernels import reference_attention

pytest.importorskip("onnxruntime", reason="onnxruntime is an optional extra (flashcheck[onnx])")
pytest.importorskip("onnx", reason="onnx is an optional extra (flashcheck[onnx])")


@pytest.mark.parametrize("operator", ["Attention", "MultiHeadAttention"])
@pytest.mark.parametrize("causal", [False, True])
def test_onnxruntime_in_fp32_is_attention_with_gqa_masks_and_scale(causal, operator):
    q, k, v = make_qkv(InputSpec(batch=2, heads=4, kv_heads=2, seq_len=24, seq_len_k=40, head_dim=16, seed=1))
    keep = torch.ones(2, 1, 24, 40, dtype=torch.bool)
    keep[1, :, :, :7] = False  # left padding of batch row 1
    bias = torch.randn(1, 4, 24, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    b = dataclasses.replace(get_backend("onnxruntime"), operator=operator)
    for mask in (None, keep, bias):
        ref = reference_attention(q, k, v, causal=causal, mask=mask, scale=0.3)
        m = mask.float() if mask is bias else mask
        out = b.run(q.float(), k.float(), v.float(), device="cpu", causal=causal, mask=m, scale=0.3).double()
        assert (out - ref).abs().max() < 1e-5, (causal, None if mask is None else mask.dtype)


def test_onnxruntime_fp16_passes_the_budget_and_bf16_is_refused_with_the_reason():
    from flashcheck.measure.compare import BackendCase, run_backend_case

    spec = InputSpec(heads=2, seq_len=64, head_dim=32)
    res = run_backend_case(BackendCase(backend="onnxruntime", numerics="fp16", inputs=spec, causal=True), device="cpu")
    assert res["status"] == "ok" and res["budget"]["passed"] and res["baseline_impl"] == "eager:fp16"
    assert 1e-4 < res["candidate"]["rel_l2"] < 2e-3  # fp16's rounding, not fp32's: the session ran in fp16
    res = run_backend_case(BackendCase(backend="onnxruntime", numerics="bf16", inputs=spec), device="cpu")
    assert res["status"] == "skipped" and "dtype bfloat16 not supported" in res["reason"]


def test_without_onnxruntime_the_backend_is_skipped_and_the_cli_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    a = get_backend("onnxruntime").available(torch.float16, "cpu")
    assert not a.ok and install_hint("onnx") in a.reason
    res = CliRunner().invoke(app, ["compare", "--backend", "onnxruntime", "--numerics", "fp16", "--seq-len", "64"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and install_hint("onnx") in res.output


def test_the_onnx_operator_where_the_runtime_has_it_else_the_contrib_one(monkeypatch):
    from flashcheck.backends import onnx_rt

    onnx_rt.attention_operator.cache_clear()
    assert onnx_rt.attention_operator() == "Attention"  # onnxruntime >= 1.22 runs opset-23 Attention on the CPU
    assert get_backend("onnxruntime").label() == "onnxruntime[Attention]"

    def not_implemented(*args):
        raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Attention")

    monkeypatch.setattr(onnx_rt, "_session", not_implemented)
    onnx_rt.attention_operator.cache_clear()
    try:
        assert onnx_rt.attention_operator() == "MultiHeadAttention"
    finally:
        onnx_rt.attention_operator.cache_clear()


def test_multiheadattention_in_fp16_is_within_the_budget():
    from flashcheck.core.budget import check_budget

    q, k, v = make_qkv(InputSpec(heads=2, kv_heads=1, seq_len=64, head_dim=32))
    b = dataclasses.replace(get_backend("onnxruntime"), operator="MultiHeadAttention")
    out = b.run(q.half(), k.half(), v.half(), device="cpu", causal=True)
    base = get_backend("eager").run(q.half(), k.half(), v.half(), device="cpu", causal=True)
    assert check_budget(out, reference_attention(q, k, v, causal=True), base, rule="peers").passed
