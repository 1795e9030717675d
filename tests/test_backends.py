"""Backends on the CPU: correct against the FP64 reference, honest about availability, proven by the profiler."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backend_compare import BackendCase, determinism, run_backend_case
from flashcheck.backends import all_backends, get_backend
from flashcheck.backends.base import Backend
from flashcheck.backends.profiling import attention_ops, proves
from flashcheck.cli import app
from flashcheck.kernels import reference_attention
from flashcheck.numerics import parse_format

runner = CliRunner()
CPU_REAL = ("sdpa-math", "sdpa-math-lowp", "sdpa-flash", "flex", "eager")
GPU_ONLY = ("sdpa-efficient", "sdpa-cudnn", "flash-attn", "flash-attn-3", "xformers")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def qkv(lq, lk, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (lq, lk, lk))


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-flash", "flex", "eager", "sim-flash", "sim-standard"])
@pytest.mark.parametrize("lq,lk,causal", [(33, 33, False), (20, 45, True), (45, 20, True)])
def test_cpu_backends_match_reference(name, lq, lk, causal):
    b = get_backend(name)
    q, k, v = qkv(lq, lk, dtype=torch.float64 if name.startswith("sim") else torch.float32)
    if name.startswith("sim"):
        b = b.configured(policy="fp64") if name == "sim-standard" else b.configured(policy="fp64", block_k=7)
    out = b.forward(q, k, v, causal=causal).double()
    ref = reference_attention(q.double(), k.double(), v.double(), causal=causal)
    tol = 1e-12 if name.startswith("sim") else 2e-6  # fp32 kernels: a few fp32 ulps of O(1) outputs
    rows = torch.isfinite(out).all(-1)
    assert rows.all(), f"{name} gave non-finite rows (fully masked rows must be 0)"
    assert (out - ref).abs().max() < tol


def test_sdpa_math_is_exact_in_fp64():
    q, k, v = qkv(30, 30, dtype=torch.float64)
    out = get_backend("sdpa-math").forward(q, k, v, causal=True)
    assert (out - reference_attention(q, k, v, causal=True)).abs().max() < 1e-13


def test_math_lowp_really_runs_in_low_precision():
    q, k, v = qkv(64, 64, dtype=torch.bfloat16)
    ref = reference_attention(q.double(), k.double(), v.double())
    hi = (get_backend("sdpa-math").forward(q, k, v).double() - ref).norm()
    lo = (get_backend("sdpa-math-lowp").forward(q, k, v).double() - ref).norm()
    assert lo > 1.5 * hi
    assert not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()  # flag restored


def test_gpu_backends_report_why_not_here():
    names = {b.name for b in all_backends()}
    assert set(CPU_REAL + GPU_ONLY) <= names
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for name in GPU_ONLY:
        a = get_backend(name).available()
        assert not a.ok and "GPU" in a.reason
    assert not get_backend("sdpa-cudnn").available(torch.float32).ok


def test_unknown_backend_suggests():
    with pytest.raises(ValueError, match="did you mean 'sdpa-flash'"):
        get_backend("sdpa-flsh")


@pytest.mark.parametrize(
    "name,op",
    [
        ("sdpa-math", "_scaled_dot_product_attention_math"),
        ("sdpa-flash", "_scaled_dot_product_flash_attention_for_cpu"),
        ("sim-flash", "_FlashFunction"),
        ("flex", "FlexAttention"),
    ],
)
def test_profiler_proves_which_kernel_ran(name, op):
    b = get_backend(name)
    q, k, v = qkv(16, 16, dtype=torch.float64 if name.startswith("sim") else torch.bfloat16)
    ops = attention_ops(lambda: b.forward(q, k, v))
    assert any(op in o for o in ops) and proves(ops, b.ops)
    if name == "sdpa-math":
        assert not proves(ops, get_backend("sdpa-flash").ops)


def test_backend_case_json_and_budget():
    r = run_backend_case(BackendCase(backend="sdpa-flash", numerics="bf16", seq_len=128, heads=2, backward=True))
    assert r["status"] == "ok" and r["kernel_verified"] is True
    assert set(r["candidate"]) == {"max_abs", "mean_abs", "rmse", "rel_l2"} and r["budget"]["passed"]
    assert all(r["grad"][g]["budget"]["passed"] for g in ("dq", "dk", "dv"))
    skipped = run_backend_case(BackendCase(backend="flash-attn", numerics="bf16", seq_len=64))
    if not torch.cuda.is_available():
        assert skipped["status"] == "skipped" and "GPU" in skipped["reason"]


class NoisyBackend(Backend):
    """Deliberately non-deterministic: adds fresh noise each call."""

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out + 1e-3 * torch.randn_like(out)


def test_determinism_detects_a_nondeterministic_kernel():
    case = BackendCase(backend="sdpa-flash", seq_len=32, heads=2, determinism=3)
    q, k, v = qkv(32, 32, dtype=torch.float64)
    noisy = NoisyBackend("noisy", "test")
    bad = determinism(noisy, parse_format("fp32"), (q[:1], k[:1], v[:1]), case)
    assert not bad["forward_identical"] and not bad["batch_invariant"]
    good = run_backend_case(BackendCase(backend="sdpa-flash", seq_len=64, heads=2, determinism=3, backward=True))
    det = good["determinism"]
    assert det["forward_identical"] and det["backward_identical"] and det["batch_invariant"]


def test_cli_backends_and_compare_json():
    res = runner.invoke(app, ["backends", "--json"])
    rows = {r["name"]: r for r in json.loads(res.output)["backends"]}
    assert rows["sdpa-flash"]["available"] and rows["sdpa-math-lowp"]["available"]
    one = runner.invoke(
        app, ["compare", "--backend", "sdpa-math", "--numerics", "fp16", "--seq-len", "64", "--heads", "2", "--json"]
    )
    assert one.exit_code == 0, one.output
    obj = json.loads(one.output)
    assert set(obj) >= {"config", "candidate", "baseline", "ratio"}
    many = runner.invoke(
        app,
        [
            "compare",
            "--backend",
            "sdpa-math,sim-flash,flash-attn",
            "--preset",
            "torch-cpu-flash",
            "--numerics",
            "bf16",
            "--seq-len",
            "64,96",
            "--heads",
            "2",
            "--json",
        ],
    )
    assert many.exit_code == 0, many.output
    objs = json.loads(many.output)["backends"]
    assert len(objs) == 6 and {o["config"]["seq_len"] for o in objs} == {64, 96}
    assert any(o["config"]["label"] == "sim-flash[torch-cpu-flash@bf16]" for o in objs)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--backend", "nope"], "unknown backend"),
        (["--seq-len", "64,x", "--backend", "sdpa-math"], "seq-len"),
        (["--backward"], "need --backend"),
        (["--seq-len", "8,16"], "list"),
        (["--backend", "sim-flash", "--preset", "fa9"], "kernel preset"),
    ],
)
def test_compare_backend_bad_input_exits_2(args, needle):
    res = runner.invoke(app, ["compare", "--heads", "1", *args])
    assert res.exit_code == 2 and needle in res.output, res.output


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn", "flash-attn-3", "flex"])
def test_gpu_backend_within_budget(name):
    if not get_backend(name).available(torch.bfloat16).ok:
        pytest.skip(get_backend(name).available(torch.bfloat16).reason)
    r = run_backend_case(BackendCase(backend=name, numerics="bf16", seq_len=1024, heads=8, backward=True))
    assert r["status"] == "ok" and r["budget"]["passed"] and r["kernel_verified"]
