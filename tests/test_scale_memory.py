"""Scale (issue 15), memory at long L: the FP64 reference writes its query chunks into one output (no list, no
cat copy; a float32 Q converted one chunk at a time), the standard kernel likewise, metrics hold one temporary
of the inputs' size, and simulators take the inputs uncopied — each with the numbers it gave before, bit for
bit (oracles: the former expressions, written out here)."""

from __future__ import annotations

import pytest
import torch
from tests.helpers import scale_qkv

from flashcheck.core import metrics
from flashcheck.kernels.sim import reference as reference_mod
from flashcheck.kernels.sim import standard as standard_mod
from flashcheck.kernels.sim.reference import reference_attention
from flashcheck.kernels.sim.standard import standard_attention


def _reference_one_block(q, k, v, causal: bool, mask=None):
    """The reference as one L x L block, out of place (the former code path with chunk = Lq), its two products
    formed in the fixed row blocks of kernels.sim.tiles.mm_blocks (tests/test_scale.py checks those)."""
    from flashcheck.kernels.sim.masks import tile_bias
    from flashcheck.kernels.sim.tiles import mm_blocks

    lq, lk = q.shape[-2], k.shape[-2]
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scores = mm_blocks(q, k.transpose(-1, -2), None, rows_total=lq) * q.shape[-1] ** -0.5
    bias = tile_bias((0, lq), (0, lk), lq, lk, causal=causal, mask=mask, dtype=torch.float64)
    scores = scores if bias is None else scores + bias
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    denom = e.sum(dim=-1, keepdim=True)
    dead = denom == 0
    out = mm_blocks(e, v, None, rows_total=lq) / torch.where(dead, torch.ones_like(denom), denom)
    return out, torch.where(dead, torch.full_like(denom, float("-inf")), m + torch.log(denom)).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lq,lk,causal", [(70, 70, True), (90, 33, True), (33, 90, False)])
def test_reference_in_chunks_written_in_place_equals_one_block_bit_for_bit(dtype, lq, lk, causal, monkeypatch):
    q, k, v = (t.to(dtype) for t in scale_qkv(lq, lk, seed=lq + lk))
    mask = torch.rand(1, 1, lq, lk, generator=torch.Generator().manual_seed(2)) > 0.2
    for m in (None, mask):
        want = _reference_one_block(q, k, v, causal, m)
        for chunk in (8, 13, 1024):
            got = reference_attention(q, k, v, causal=causal, mask=m, chunk=chunk, return_lse=True)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"chunk={chunk}"
    seen = []
    real = reference_mod._rows_into
    monkeypatch.setattr(reference_mod, "_rows_into", lambda *a: seen.append(a[4]) or real(*a))
    monkeypatch.setattr(reference_mod, "REFERENCE_BLOCK_BYTES", 8 * 2 * lk * 10)  # 10 rows of fp64 scores
    assert torch.equal(reference_attention(q, k, v, causal=causal), _reference_one_block(q, k, v, causal)[0])
    assert seen[0] == (0, 10) and seen[-1][1] == lq  # the byte cap sets the chunk (a short tail joins the last)
    assert all(10 <= r1 - r0 < 10 + 8 for r0, r1 in seen)


def test_reference_with_autograd_gives_one_blocks_output():
    q, k, v = scale_qkv(40, 40, seed=4)
    grads = []
    for chunk in (40, 8):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = reference_attention(*leaves, causal=True, chunk=chunk)
        assert torch.equal(out.detach(), _reference_one_block(q, k, v, True)[0])
        out.sum().backward()
        grads.append([t.grad for t in leaves])
    # dK and dV add up the chunks' contributions, so their last bits depend on the chunking
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp64", "fp16"])
def test_standard_with_autograd_equals_the_in_place_output_bit_for_bit(policy, monkeypatch):
    """Without autograd chunks are written into one output; with it they are concatenated: the same bits."""
    q, k, v = scale_qkv(60, 50, seed=8)
    monkeypatch.setattr(standard_mod, "CHUNK_BYTES", 2 * 50 * 8 * 9)  # 9 rows per chunk
    with torch.no_grad():
        plain = standard_attention(q, k, v, policy=policy, causal=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    graph = standard_attention(*leaves, policy=policy, causal=True)
    assert torch.equal(plain, graph.detach())
    assert torch.equal(plain, standard_attention(q, k, v, policy=policy, causal=True, chunk_rows=60))


# The metrics as written before they shared one temporary: the oracle for their bits.
FORMER = {
    "max_abs": lambda a, b: float((a - b).abs().max()),
    "mean_abs": lambda a, b: float((a - b).abs().mean()),
    "rmse": lambda a, b: float(torch.sqrt(((a - b) ** 2).mean())),
    "rel_l2": lambda a, b: float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)),
    "std_diff": lambda a, b: float((a - b).std(unbiased=False)),
}


@pytest.mark.parametrize("name", sorted(FORMER))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_metrics_with_one_temporary_give_the_former_bits_and_leave_inputs_alone(name, dtype):
    g = torch.Generator().manual_seed(3)
    b = torch.randn(2, 3, 257, 16, generator=g, dtype=torch.float64)
    a = (b + torch.randn(b.shape, generator=g, dtype=torch.float64) * 1e-3).to(dtype)
    a0, b0 = a.clone(), b.clone()
    assert getattr(metrics, name)(a, b) == FORMER[name](a.double(), b)
    assert torch.equal(a, a0) and torch.equal(b, b0)


def test_max_ulp_with_one_temporary_gives_the_former_bits():
    from flashcheck.core.numerics import spacing

    g = torch.Generator().manual_seed(4)
    b = torch.randn(3, 100, generator=g, dtype=torch.float64)
    a = b + torch.randn(b.shape, generator=g, dtype=torch.float64) * 1e-6
    assert metrics.max_ulp(a, b, "bf16") == float(((a - b).abs() / spacing(b, "bf16")).max())


@pytest.mark.parametrize("kernel", ["flash", "standard", "splitkv"])
@pytest.mark.parametrize("policy", ["fp64", "bf16-mixed", "fa3-fp8", "baseline-fp8"])
def test_simulators_never_write_into_their_inputs(kernel, policy):
    """Method.prepare hands a simulator the shared float64 inputs uncopied; a run, forward and backward, leaves
    them as they were (fp64 policies see the very tensors: rounding to fp64 is the identity)."""
    from flashcheck.core.numerics import parse_policy
    from flashcheck.measure.method import Method
    from flashcheck.measure.runs import run_float64

    pol = parse_policy(policy)
    if pol.fp8_scaling == "block" and kernel == "standard":
        pytest.skip("per-block FP8 scaling needs the flash kernel's tiles")
    tiled = kernel != "standard"
    m = Method(kernel=kernel, policy=pol, block_q=16 if tiled else 0, block_k=16 if tiled else 0,
               algorithm="fa2" if tiled else "")  # fmt: skip
    q, k, v = scale_qkv(48, 48, seed=6)
    before = [t.clone() for t in (q, k, v)]
    args = m.prepare(q, k, v)
    assert all(a is t for a, t in zip(args, (q, k, v), strict=True))
    run_float64(m.runner(causal=True), args)
    if kernel != "splitkv":  # split-KV runs forward only
        run_float64(m.runner(causal=True), args, torch.ones(1, 2, 48, 16, dtype=torch.float64))
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before, strict=True))


_CASE_PEAK = """
import sys
from flashcheck.core.inputs import InputSpec
from flashcheck.measure.case import Case, run_case
from flashcheck.measure.method import parse_method
spec = InputSpec(seq_len=int(sys.argv[2]), heads=4, head_dim=int(sys.argv[3]))
rec = run_case(Case(inputs=spec, method=parse_method(sys.argv[1])))
assert rec.status == "ok", rec.reason
print([int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] * 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method,head_dim", [("sdpa-math:bf16", 16), ("flash:bf16-mixed", 64)])
def test_study_case_estimate_is_an_upper_bound_of_a_fresh_workers_peak(method, head_dim):
    """A study case's estimate (the worker process included) against the VmHWM of a fresh process running it;
    sdpa-math holds L x L scores (it measured 0.85 GiB at L=4096 against a chunked-model estimate of 0.63).
    sdpa-math at head dim 16: the L x L scores, whose bound this guards, as at 64, in two thirds of the time
    (peak 0.88 GiB against 0.60 without the scores' term, 1.73 with it); flash stays at 64, where the
    allocator's spread was measured (at 16 the bound holds by 12% only)."""
    import subprocess
    import sys

    from flashcheck.study.cases import expand
    from flashcheck.study.config import StudyConfig, Sweep
    from flashcheck.study.memory import estimate_case_bytes

    length = 4096  # where the chunked model alone fell below sdpa-math's peak
    sweep = Sweep(question="q", methods=(method,), seq_lens=(length,), blocks=((128, 128),), heads=4, seeds=(0,),
                  head_dims=(head_dim,))  # fmt: skip
    case = expand(StudyConfig(name="s", sweeps=(sweep,)))[0]
    assert case.head_dim == head_dim
    args = [sys.executable, "-c", _CASE_PEAK, method, str(length), str(head_dim)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300)
    peak = int(out.stdout.strip().splitlines()[-1])
    assert peak <= estimate_case_bytes(case) <= 3 * peak
