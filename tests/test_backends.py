"""Backends on every device (cpu here; cuda where a GPU is, marked `gpu`): correct against the FP64
reference, honest about availability, run where they say (inputs moved, kernel proven by its device's op
names), and the device choice itself."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backends import all_backends, get_backend
from flashcheck.backends.base import Backend, cuda_unavailable_reason, default_device, resolve_device
from flashcheck.backends.external import FlexBackend, flex_function
from flashcheck.backends.profiling import attention_ops, proves, select_ops
from flashcheck.backends.sdpa import SdpaBackend
from flashcheck.cli import app
from flashcheck.core.budget import check_budget
from flashcheck.core.inputs import InputSpec
from flashcheck.core.numerics import parse_format
from flashcheck.kernels import reference_attention
from flashcheck.measure import Case, Method
from flashcheck.measure.compare import BackendCase, run_backend_case
from flashcheck.measure.determinism import determinism

runner = CliRunner()
CPU_REAL = ("sdpa-math", "sdpa-math-lowp", "sdpa-flash", "flex", "eager")
GPU_ONLY = ("sdpa-efficient", "sdpa-cudnn", "flash-attn", "flash-attn-3", "xformers")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Each device-aware test runs on the CPU and on CUDA (skipped, with the reason, without a GPU)."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device: {cuda_unavailable_reason()}")
    return request.param


def qkv(lq, lk, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (lq, lk, lk))


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-flash", "flex", "eager"])
@pytest.mark.parametrize("lq,lk,causal", [(33, 33, False), (20, 45, True), (45, 20, True)])
def test_backends_match_reference(name, lq, lk, causal, device):
    b = get_backend(name)
    dtype = torch.float32 if torch.float32 in b.dtypes_on(device) else torch.bfloat16
    q, k, v = qkv(lq, lk, dtype=dtype)
    if name == "sdpa-flash" and device == "cuda" and lq != lk:
        with pytest.raises(ValueError, match="takes no mask"):
            b.run(q, k, v, device=device, causal=causal)
        return
    out = b.run(q, k, v, device=device, causal=causal)
    assert out.device.type == "cpu" and out.dtype == dtype
    ref = reference_attention(q.double(), k.double(), v.double(), causal=causal)
    assert torch.isfinite(out).all(), f"{name} gave non-finite rows (fully masked rows must be 0)"
    if dtype == torch.float32:
        assert (out.double() - ref).abs().max() < 2e-6  # a few fp32 ulps of O(1) outputs
    else:  # the peers' rule against plain PyTorch in the same dtype on the same device
        base = get_backend("eager").run(q, k, v, device=device, causal=causal)
        assert check_budget(out, ref, base)


@pytest.mark.parametrize("name", ["sim-flash", "sim-standard"])
@pytest.mark.parametrize("lq,lk,causal", [(33, 33, False), (20, 45, True)])
def test_simulators_match_reference_in_fp64(name, lq, lk, causal):
    b = get_backend(name)
    b = b.configured(policy="fp64") if name == "sim-standard" else b.configured(policy="fp64", block_k=7)
    q, k, v = qkv(lq, lk, dtype=torch.float64)
    out = b.run(q, k, v, device="cpu", causal=causal)
    assert (out - reference_attention(q, k, v, causal=causal)).abs().max() < 1e-12
    assert not b.available(device="cuda").ok  # simulators run on the CPU only


def test_sdpa_math_is_exact_in_fp64(device):
    q, k, v = qkv(30, 30, dtype=torch.float64)
    out = get_backend("sdpa-math").run(q, k, v, device=device, causal=True)
    assert (out - reference_attention(q, k, v, causal=True)).abs().max() < 1e-13


def _sdpa_pinned_by_flags(b: SdpaBackend, q, k, v, causal, scale, mask):
    """What SdpaBackend ran before it called the ops itself: F.scaled_dot_product_attention inside
    sdpa_kernel([which]) with allow_fp16_bf16_reduction_math_sdp(lowp_math), both process-wide (a test may)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcheck.backends.sdpa import _sdpa_mask

    prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(b.lowp_math)
    try:
        with sdpa_kernel([getattr(SDPBackend, b.which)]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=_sdpa_mask(mask, causal, q, k), scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                is_causal=causal and mask is None and q.shape[-2] == k.shape[-2],
            )  # fmt: skip
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)


_SAME_BITS = [  # (lq, lk, kv heads, causal, mask, scale): square, Lq < Lk, Lq > Lk (rows with no key), GQA
    (16, 16, 4, False, None, None),
    (7, 19, 2, True, None, 0.3),
    (19, 7, 4, True, "bool", None),
    (12, 12, 1, True, None, -0.2),
    (9, 13, 4, False, "add", None),
]


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-math-lowp", "sdpa-flash"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_sdpa_ops_called_directly_give_the_bits_of_the_pinned_call(name, dtype):
    """Each SDPA backend calls its aten op itself (no process-wide flag): outputs and gradients bitwise equal
    to F.scaled_dot_product_attention pinned by sdpa_kernel (and the low-precision math flag), as before."""
    b = get_backend(name)
    g = torch.Generator().manual_seed(3)
    for lq, lk, hkv, causal, kind, scale in _SAME_BITS:
        q = torch.randn(2, 4, lq, 24, generator=g).to(dtype)
        k, v = (torch.randn(2, hkv, lk, 24, generator=g).to(dtype) for _ in "kv")
        mask = {"bool": torch.rand(lq, lk, generator=g) > 0.3, "add": torch.randn(1, 1, lq, lk, generator=g).to(dtype)}
        mask = mask.get(kind)
        got = []
        for fn in (lambda *a: _sdpa_pinned_by_flags(b, *a), lambda q, k, v, c, s, m: b.run(
                q, k, v, device="cpu", causal=c, scale=s, mask=m)):  # fmt: skip
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = fn(*leaves, causal, scale, mask)
            out.float().square().sum().backward()
            got.append([out.detach(), *(t.grad for t in leaves)])
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
        for a, c in zip(*got, strict=True):
            assert a.dtype == c.dtype == dtype and torch.equal(a.view(bits), c.view(bits)), (lq, lk, hkv, kind)


def test_math_lowp_really_runs_in_low_precision(device):
    q, k, v = qkv(64, 64, dtype=torch.bfloat16)
    ref = reference_attention(q.double(), k.double(), v.double())
    hi = (get_backend("sdpa-math").run(q, k, v, device=device).double() - ref).norm()
    lo = (get_backend("sdpa-math-lowp").run(q, k, v, device=device).double() - ref).norm()
    assert lo > 1.5 * hi
    assert not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()  # flag restored


@pytest.mark.parametrize("cls,name", [(SdpaBackend, "sdpa-flash"), (FlexBackend, "flex")])
def test_run_moves_inputs_to_the_device_and_back(cls, name, device, monkeypatch):
    """The adapter runs the kernel on the asked device whatever device the inputs came from; the output
    comes back, and (where the device has a backward) so do the gradients."""
    seen = []
    forward = cls.forward

    def spy(self, q, k, v, **kw):
        seen.append({t.device.type for t in (q, k, v)})
        return forward(self, q, k, v, **kw)

    monkeypatch.setattr(cls, "forward", spy)
    b = get_backend(name)
    backward = b.backward_reason(device) is None
    q, k, v = (t.requires_grad_(backward) for t in qkv(16, 16, dtype=torch.bfloat16))
    out = b.run(q, k, v, device=device)
    assert seen == [{device}] and out.device.type == "cpu"
    if backward:
        out.float().sum().backward()
        assert all(t.grad is not None and t.grad.device.type == "cpu" for t in (q, k, v))


def test_default_device_is_cuda_where_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == resolve_device(None) == "cpu"
    assert get_backend("sdpa-flash").default_device() == "cpu"
    assert get_backend("sdpa-efficient").default_device() == "cuda"  # it runs nowhere else
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == resolve_device(None) == resolve_device("cuda") == "cuda"
    assert resolve_device("cpu") == "cpu"
    assert get_backend("sdpa-flash").default_device() == "cuda" and get_backend("flex").default_device() == "cuda"
    assert get_backend("sim-flash").default_device() == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "", "CUDA", "cuda:0"])
def test_unknown_device_names_the_allowed_ones(bad):
    with pytest.raises(ValueError, match="expected one of cpu, cuda"):
        resolve_device(bad)
    with pytest.raises(ValueError, match="expected one of cpu, cuda"):
        run_backend_case(BackendCase(backend="sdpa-math", inputs=InputSpec(seq_len=8, heads=1)), device=bad)


def test_device_support_dtypes_and_backward_per_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # availability logic only; nothing runs
    flash, flex = get_backend("sdpa-flash"), get_backend("flex")
    assert flash.available(torch.float32, "cpu").ok and flash.available(torch.bfloat16, "cuda").ok
    fp32_cuda = flash.available(torch.float32, "cuda")
    assert not fp32_cuda.ok and "float32 not supported on cuda" in fp32_cuda.reason
    assert flex.backward_reason("cpu") and flex.backward_reason("cuda") is None
    assert not flex.available(torch.float64, "cuda").ok and flex.available(torch.float64, "cpu").ok
    cudnn = get_backend("sdpa-cudnn").available(torch.bfloat16, "cpu")
    assert not cudnn.ok and "CUDA GPU only" in cudnn.reason
    assert "cpu only" in get_backend("sim-flash").available(device="cuda").reason


def test_asking_for_cuda_without_one_says_why():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match=r"there is none here: .*(CPU build|no CUDA device)"):
        resolve_device("cuda")
    q, k, v = qkv(8, 8)
    with pytest.raises(ValueError, match="cannot run on cuda: needs an NVIDIA GPU"):
        get_backend("sdpa-flash").run(q, k, v, device="cuda")
    r = run_backend_case(BackendCase(backend="sdpa-flash", inputs=InputSpec(seq_len=8, heads=1)), device="cuda")
    assert r["status"] == "skipped" and "needs an NVIDIA GPU" in r["reason"] and r["config"]["device"] == "cuda"


def test_flex_is_compiled_on_cuda_and_eager_on_cpu():
    from torch.nn.attention.flex_attention import flex_attention

    assert flex_function("cpu") is flex_attention
    compiled = flex_function("cuda")  # torch.compile wraps lazily: nothing is compiled until it is called
    assert compiled is not flex_attention and compiled._torchdynamo_orig_callable is flex_attention
    assert flex_function("cuda") is compiled  # compiled once per process
    assert "torch.compile" in get_backend("flex").description


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


# --- the proof of which kernel ran, and where -----------------------------------------------------------

# Op names as a CUDA run records them (torch.profiler with ProfilerActivity.CUDA: dispatcher ops and the
# demangled kernel names). NOT recorded on this machine (it has no GPU): written from kernel names in
# published profiler traces (A100: PyTorch's vendored FlashAttention-2 `pytorch_flash::flash_fwd_kernel`,
# CUTLASS `fmha_cutlassF_bf16_aligned_64x64_rf_sm80`, cuDNN `cudnn_generated_fort_native_sdpa_sm80_...`),
# the kernel sources (flash-attn's `namespace flash`, FA3's `FlashAttnFwdSm90`) and Inductor's naming of
# template kernels (`triton_tem_fused_flex_attention_0`). benchmarks/gpu_check.sh records the real lists.
_FA2_TRAITS = "Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>"
CUDA_OPS = {
    "sdpa-math": [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_attention_math",
        "aten::_safe_softmax",
        "aten::_softmax",
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false, false>"
        "(float*, float const*, int, int, int, bool const*, int, bool)",
        "ampere_sgemm_64x64_nn",
    ],
    "sdpa-flash": [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_flash_attention_forward",
        f"void pytorch_flash::flash_fwd_kernel<pytorch_flash::{_FA2_TRAITS}, false, false, false, false, true, "
        "true, false, false>(pytorch_flash::Flash_fwd_params)",
    ],
    "sdpa-efficient": [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_efficient_attention_forward",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
    ],
    "sdpa-cudnn": [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_cudnn_attention_forward",
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_cga1x1x1_kernel0_0",
    ],
    "flex": ["Torch-Compiled Region: 0/0", "CompiledFunction", "triton_tem_fused_flex_attention_0"],
    "eager": [
        "aten::matmul",
        "aten::softmax",
        "aten::_softmax",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)",
    ],
    "flash-attn": [
        "flash_attn::_flash_attn_forward",
        f"void flash::flash_fwd_kernel<{_FA2_TRAITS}, false, false, false, false, true, true, false>"
        "(flash::Flash_fwd_params)",
    ],
    "flash-attn-3": [
        "flash_attn_3::fwd",
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
        "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, 128, 128, 128>>>>"
        "(flash::FlashAttnFwdSm90<>::Params)",
    ],
    "xformers": [
        "xformers::efficient_attention_forward_cutlass",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80>::Params)",
    ],
}


def _cpu_ops(name: str) -> list[str]:
    """The op names a real CPU run of `name` records (every op, as the proofs must not match any of them)."""
    from torch.profiler import ProfilerActivity, profile

    # as backends.profiling does: kineto reads its log level once per process, at the first profile; started
    # here below level 6, every later profile in this worker printed "USDT ... profiler_start" (test_readme's
    # `compare --preset fa4-fp8` line failed on it when xdist gave both to one worker)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    b = get_backend(name)
    q, k, v = qkv(16, 16, dtype=torch.float64 if name.startswith("sim") else torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        b.run(q, k, v, device="cpu")
    return sorted({e.key for e in prof.key_averages()})


@pytest.fixture(scope="module")
def cpu_op_lists() -> dict[str, list[str]]:
    return {name: _cpu_ops(name) for name in ("sdpa-math", "sdpa-flash", "flex", "eager", "sim-flash")}


@pytest.mark.parametrize("name", sorted(CUDA_OPS))
def test_cuda_proof_accepts_a_cuda_run_and_rejects_every_cpu_run(name, cpu_op_lists):
    proof = get_backend(name).proof_on("cuda")
    assert proof, f"{name} has no CUDA proof"
    kept = select_ops(CUDA_OPS[name], proof)  # what attention_ops keeps of a CUDA run
    assert proves(kept, proof) is True
    for cpu_name, ops in cpu_op_lists.items():
        assert proves(ops, proof) is False, f"{cpu_name}'s CPU ops wrongly prove {name} ran on CUDA"
    # a fused kernel's proof is not met by another backend's run (xformers dispatches to those kernels;
    # MATH and eager share the CUDA softmax kernel by design)
    if name not in ("sdpa-math", "eager", "xformers"):
        assert not [o for o in CUDA_OPS if o != name and proves(CUDA_OPS[o], proof)]


def test_the_cpu_flash_op_no_longer_proves_the_cuda_kernel(cpu_op_lists):
    """The old fragment `_scaled_dot_product_flash_attention` matched the CPU op `..._for_cpu` too."""
    flash = get_backend("sdpa-flash")
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in cpu_op_lists["sdpa-flash"]
    assert proves(cpu_op_lists["sdpa-flash"], flash.proof_on("cpu")) is True
    assert proves(cpu_op_lists["sdpa-flash"], flash.proof_on("cuda")) is False
    assert proves(CUDA_OPS["sdpa-flash"], flash.proof_on("cpu")) is False
    assert proves(CUDA_OPS["flex"], get_backend("flex").proof_on("cpu")) is False
    assert proves(["aten::_scaled_dot_product_attention_math"], get_backend("sdpa-math").proof_on("cuda")) is False


@pytest.mark.parametrize(
    "name,op",
    [
        ("sdpa-math", "aten::_scaled_dot_product_attention_math"),
        ("sdpa-flash", "_scaled_dot_product_flash_attention"),
        ("flex", "flex"),
        ("eager", "softmax"),
    ],
)
def test_profiler_proves_which_kernel_ran(name, op, device):
    b = get_backend(name)
    q, k, v = qkv(16, 16, dtype=torch.bfloat16)
    ops = attention_ops(lambda: b.run(q, k, v, device=device), b.proof_on(device), device=device)
    assert any(op in o.lower() or op in o for o in ops) and proves(ops, b.proof_on(device)), ops
    if name == "sdpa-math":
        assert not proves(ops, get_backend("sdpa-flash").proof_on(device))
    other = "cuda" if device == "cpu" else "cpu"
    if name in ("sdpa-flash", "flex"):  # these kernels have device-specific names
        assert not proves(ops, b.proof_on(other))


def test_sim_flash_proof_on_the_cpu():
    b = get_backend("sim-flash").configured(policy="fp64")
    q, k, v = qkv(16, 16, dtype=torch.float64)
    ops = attention_ops(lambda: b.run(q, k, v, device="cpu"), b.proof_on("cpu"), device="cpu")
    assert proves(ops, b.proof_on("cpu")) and b.proof_on("cuda") == ()


# --- the comparison on a device -------------------------------------------------------------------------


def test_backend_case_json_and_budget(device):
    case = BackendCase(backend="sdpa-flash", numerics="bf16", backward=True, inputs=InputSpec(seq_len=128, heads=2))
    r = run_backend_case(case, device=device)
    assert r["status"] == "ok" and r["kernel_verified"] is True and r["config"]["device"] == device
    assert set(r["candidate"]) == {"max_abs", "mean_abs", "rmse", "rel_l2"} and r["budget"]["passed"]
    assert all(r["grad"][g]["budget"]["passed"] for g in ("dq", "dk", "dv"))
    flex = run_backend_case(
        BackendCase(backend="flex", numerics="bf16", backward=True, inputs=InputSpec(seq_len=64, heads=2)),
        device=device,
    )
    if device == "cpu":
        assert flex["status"] == "skipped" and "no backward on the CPU" in flex["reason"]
    else:
        assert flex["status"] == "ok" and flex["kernel_verified"] is True and flex["grad"]["dq"]["budget"]["passed"]
    sim = run_backend_case(
        BackendCase(backend="sim-flash", numerics="bf16", inputs=InputSpec(seq_len=64, heads=1)), device=device
    )
    assert sim["status"] == "ok" and sim["config"]["device"] == "cpu"  # simulators run on the CPU
    skipped = run_backend_case(
        BackendCase(backend="flash-attn", numerics="bf16", inputs=InputSpec(seq_len=64)), device=device
    )
    if not torch.cuda.is_available():
        assert skipped["status"] == "skipped" and "GPU" in skipped["reason"]


class NoisyBackend(Backend):
    """Deliberately non-deterministic: adds fresh noise each call."""

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out + 1e-3 * torch.randn_like(out)


def test_determinism_detects_a_nondeterministic_kernel(device, monkeypatch):
    q, k, v = qkv(32, 32, dtype=torch.float64)
    noisy = NoisyBackend("noisy", "test")
    monkeypatch.setattr("flashcheck.backends.get_backend", lambda name: noisy if name == "noisy" else get_backend(name))
    method = Method(kernel="noisy", fmt=parse_format("fp32"), device=device)
    case = Case(inputs=InputSpec(seq_len=32, heads=2), method=method, determinism=3)
    bad = determinism(case, (q[:1], k[:1], v[:1]))
    assert not bad["forward_identical"] and not bad["batch_invariant"]
    good = run_backend_case(
        BackendCase(backend="sdpa-flash", determinism=3, backward=True, inputs=InputSpec(seq_len=64, heads=2)),
        device=device,
    )
    det = good["determinism"]
    assert det["forward_identical"]
    if device == "cpu":  # on CUDA, FA2 may split K/V by batch size and accumulates dq with atomics
        assert det["batch_invariant"] and det["backward_identical"]


# --- the CLI --------------------------------------------------------------------------------------------


def test_cli_backends_and_compare_json():
    res = runner.invoke(app, ["backends", "--json"])
    rows = {r["name"]: r for r in json.loads(res.output)["backends"]}
    assert rows["sdpa-flash"]["available"] and rows["sdpa-math-lowp"]["available"]
    assert rows["sdpa-flash"]["devices"] == ["cpu", "cuda"] and rows["sdpa-flash"]["device"] == default_device()
    one = runner.invoke(
        app, ["compare", "--backend", "sdpa-math", "--numerics", "fp16", "--seq-len", "64", "--heads", "2", "--json"]
    )
    assert one.exit_code == 0, one.output
    obj = json.loads(one.output)
    assert set(obj) >= {"config", "candidate", "baseline", "ratio"} and obj["config"]["device"] == default_device()
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
            "--device",
            "cpu",
            "--json",
        ],
    )
    assert many.exit_code == 0, many.output
    objs = json.loads(many.output)["backends"]
    assert len(objs) == 6 and {o["config"]["seq_len"] for o in objs} == {64, 96}
    assert {o["config"]["device"] for o in objs} == {"cpu"}
    assert any(o["config"]["label"] == "sim-flash[torch-cpu-flash@bf16]" for o in objs)
    fa = [o for o in objs if o["config"]["backend"] == "flash-attn"]
    assert all(o["status"] == "skipped" and "CUDA GPU only" in o["reason"] for o in fa)


def test_cli_device_in_the_human_output():
    res = runner.invoke(
        app, ["compare", "--backend", "sdpa-flash,flex", "--seq-len", "32", "--heads", "1", "--device", "cpu"]
    )
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    rows = [x for x in res.output.splitlines() if x.startswith("│ ") and ("sdpa-flash" in x or "flex" in x)]
    assert len(rows) == 2 and all("│ cpu" in x and "pass" in x for x in rows), res.output
    table = runner.invoke(app, ["backends", "--device", "cpu"])
    assert table.exit_code == 0 and "Traceback" not in table.output
    line = next(x for x in table.output.splitlines() if "sdpa-cudnn" in x)
    assert "│ cpu" in line and "│ no " in line and "CUDA GPU only" in line


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--backend", "nope"], "unknown backend"),
        (["--seq-len", "64,x", "--backend", "sdpa-math"], "seq-len"),
        (["--seq-len", "8,16"], "list"),
        (["--backend", "sim-flash", "--preset", "fa9"], "kernel preset"),
        (["--backend", "sdpa-math", "--device", "gpu"], "--device 'gpu' is not allowed; expected one of cpu, cuda"),
        (["--backend", "sdpa-math", "--device", ""], "--device ''"),
        (["--backend", "sdpa-math", "--device", "cuda:0"], "expected one of cpu, cuda"),
    ],
)
def test_compare_backend_bad_input_exits_2(args, needle):
    res = runner.invoke(app, ["compare", "--heads", "1", *args])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_cli_cuda_without_one_exits_2_with_the_reason():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for args in (["--backend", "sdpa-flash"], []):
        res = runner.invoke(app, ["compare", "--seq-len", "32", "--heads", "1", "--device", "cuda", *args])
        assert res.exit_code == 2 and "no CUDA device here" in res.output, res.output
        assert cuda_unavailable_reason() in res.output and "Traceback" not in res.output
    bad = runner.invoke(app, ["backends", "--device", "tpu"])
    assert bad.exit_code == 2 and "expected one of cpu, cuda" in bad.output


# --- on a GPU only ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name", ["sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn", "flash-attn-3", "flex", "eager"]
)
def test_gpu_backend_within_budget(name):
    if not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device: {cuda_unavailable_reason()}")
    avail = get_backend(name).available(torch.bfloat16, "cuda")
    if not avail.ok:
        pytest.skip(avail.reason)
    case = BackendCase(backend=name, numerics="bf16", backward=True, inputs=InputSpec(seq_len=1024, heads=8))
    r = run_backend_case(case, device="cuda")
    assert r["status"] == "ok" and r["config"]["device"] == "cuda", r
    assert r["kernel_verified"] is True, r["kernel_ops"]
    assert r["budget"]["passed"] and all(g["budget"]["passed"] for g in r["grad"].values())
