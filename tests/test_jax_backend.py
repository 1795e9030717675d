"""The jax-xla backend (jax.nn.dot_product_attention, implementation="xla"): layout, masks, GQA, scale and
gradients against the FP64 reference; its simulator preset against the real kernel; JAX absent -> the extra named."""

from __future__ import annotations

import sys

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backends import get_backend
from flashcheck.cli import app
from flashcheck.core.extras import install_hint
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.metrics import rel_l2
from flashcheck.core.numerics import round_to
from flashcheck.kernels import flash_attention, reference_attention
from flashcheck.kernels.sim.presets import resolve

pytest.importorskip("jax", reason="JAX is an optional extra (flashcheck[jax])")


def _real(fmt: str, q, k, v, **kw) -> torch.Tensor:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]
    return get_backend("jax-xla").run(*(t.to(dtype) for t in (q, k, v)), device="cpu", **kw).double()


@pytest.mark.parametrize("causal", [False, True])
def test_jax_xla_in_fp32_is_attention_with_gqa_masks_and_scale(causal):
    """Lq != Lk (bottom-right causal), 2 K/V heads for 4 query heads, a bool padding mask and an additive bias,
    a scale that is not 1/sqrt(D): fp32 JAX equals the FP64 reference to fp32 rounding."""
    q, k, v = make_qkv(InputSpec(batch=2, heads=4, kv_heads=2, seq_len=24, seq_len_k=40, head_dim=16, seed=1))
    keep = torch.ones(2, 1, 24, 40, dtype=torch.bool)
    keep[1, :, :, :7] = False  # left padding of batch row 1
    bias = torch.randn(1, 4, 24, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for mask in (keep, bias):
        ref = reference_attention(q, k, v, causal=causal, mask=mask, scale=0.3)
        out = _real("fp32", q, k, v, causal=causal, mask=mask.float() if mask is bias else mask, scale=0.3)
        assert (out - ref).abs().max() < 1e-5, (causal, mask.dtype)


def test_jax_xla_gradients_are_the_references():
    q, k, v = make_qkv(InputSpec(heads=4, kv_heads=1, seq_len=32, head_dim=8, seed=2))
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    out = get_backend("jax-xla").run(*leaves, device="cpu", causal=True)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(do)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    reference_attention(*ref_leaves, causal=True).backward(do.double())
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert got.grad.shape == want.grad.shape and (got.grad.double() - want.grad).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("fmt", "heads", "length", "preset"),
    [
        ("bf16", 4, 128, "jax-xla"),
        ("bf16", 16, 256, "jax-xla-fused"),
        ("fp16", 4, 128, "jax-xla"),
        ("fp16", 16, 256, "jax-xla"),
    ],
)
def test_jax_xla_preset_explains_the_real_kernel(fmt, heads, length, preset):
    """As tests/test_budget_presets.py checks torch-cpu-flash against sdpa-flash: the preset's error within 25% of
    the real kernel's, on the rounded inputs' FP64 reference; an all-low-precision policy is not. Jitted on the
    CPU, XLA keeps P in fp32 from 4096 query rows B*H*Lq (16 heads x 256 here) in bf16: jax-xla-fused; fp16 runs
    op by op (backends.jax_xla._unjitted), so P is rounded there at every size."""
    q, k, v = make_qkv(InputSpec(batch=1, heads=heads, seq_len=length, head_dim=64, seed=length))
    rounded = [round_to(t, fmt) for t in (q, k, v)]
    ref = reference_attention(*rounded)
    real = rel_l2(_real(fmt, *rounded), ref)
    sim = rel_l2(flash_attention(q, k, v, **resolve(preset, fmt, length, length, 64, False)), ref)
    assert abs(sim / real - 1) < 0.25, f"{preset}: sim {sim:.3e} vs real {real:.3e}"
    uniform = rel_l2(flash_attention(q, k, v, policy=fmt, block_q=length, block_k=length), ref)
    assert abs(uniform / real - 1) > 0.25
    other = "jax-xla-fused" if preset == "jax-xla" else "jax-xla"  # the other regime's preset misses by more
    miss = rel_l2(flash_attention(q, k, v, **resolve(other, fmt, length, length, 64, False)), ref)
    assert abs(miss / real - 1) > abs(sim / real - 1)


def test_jax_cudnn_says_why_it_cannot_run_here():
    b = get_backend("jax-cudnn")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; the reason is for machines without one")
    why = b.available(torch.bfloat16).reason
    assert not b.available(torch.bfloat16).ok and "GPU" in why


def test_without_jax_the_backend_is_skipped_and_the_cli_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax now raises ImportError
    b = get_backend("jax-xla")
    a = b.available(torch.bfloat16, "cpu")
    assert not a.ok and install_hint("jax") in a.reason
    res = CliRunner().invoke(app, ["compare", "--backend", "sdpa-math,jax-xla", "--seq-len", "64", "--heads", "1"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and install_hint("jax") in " ".join(res.output.split())
