"""kernels.native.step: the fused FA2 step gives torch's bits (its routines against torch's ops, and the flash
simulator with it against the simulator without it), or disables itself and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flashcheck.kernels import flash_attention
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import step as native_step
from flashcheck.kernels.sim import flash

HAS_CC = cbuild.compiler() is not None
needs_step = pytest.mark.skipif(
    not HAS_CC or not native_step.status()["available"], reason="the fused step is off here (see its status)"
)


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return (t.float() + 0.0).view(torch.int32)  # + 0.0: a zero maximum's sign is free (see native_step)


@needs_step
@pytest.mark.parametrize("n", [1, 7, 8, 17, 37, 64, 128, 129, 511, 512, 2000, 70000])
@pytest.mark.parametrize("p_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_step_gives_torchs_bits(n, p_dtype, one_thread):
    """Random rows over a wide range (P with subnormals and zeros), ties and masked rows, every output."""
    if p_dtype == torch.float16 and not native_step._library()[0].fc_has_fp16():
        pytest.skip("no _Float16 in this compiler")
    for how in ("random", "tied", "masked"):
        s, m, l = native_step._case(n, 3 if n > 5000 else 40, how)
        want = native_step._torch_step(s.clone(), m, l, p_dtype)
        got_s = s.clone()
        got = native_step.softmax_step(got_s, m, l, p_dtype)
        assert got is not None
        for a, b in zip(want, (got_s, *got), strict=True):
            assert torch.equal(_bits(a), _bits(b)), (n, p_dtype, how)


@needs_step
def test_acc_update_gives_torchs_bits(one_thread):
    g = torch.Generator().manual_seed(1)
    o = torch.randn(2, 3, 40, 64, generator=g)
    alpha, pv = torch.rand(2, 3, 40, 1, generator=g), torch.randn(2, 3, 40, 64, generator=g) * 1e3
    for view in (o.clone(), o.clone()[:, :, 5:, :]):  # a causal step's rows: a strided view of the tile's o
        a, p = alpha[:, :, : view.shape[2]].contiguous(), pv[:, :, : view.shape[2]].contiguous()
        want = view.clone().mul_(a).add_(p)
        assert native_step.acc_update(view, a, p)
        assert torch.equal(_bits(view), _bits(want))


def test_off_where_torch_would_run_threaded():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        s, m, l = native_step._case(64, 4, "random")
        assert native_step.softmax_step(s, m, l, torch.float32) is None
    finally:
        torch.set_num_threads(old)


CASES = [
    ((1, 8, 1100, 600, 64), {"policy": "bf16-mixed"}),  # three query tiles: the pool runs at 2 threads
    ((1, 4, 700, 700, 64), {"policy": "fp32"}),
    ((2, 2, 333, 517, 64), {"policy": "bf16-mixed", "causal": True, "block_k": 100}),
    ((1, 2, 300, 300, 64), {"policy": "fp16-mixed", "causal": True}),
    ((1, 2, 300, 260, 64), {"policy": "bf16", "block_k": 37}),
    ((1, 2, 129, 300, 64), {"policy": "fp32", "block_k": 1}),
    # head dims whose scale is no power of two, causal over several query tiles, bottom-right alignment both ways,
    # grouped K / V heads (the 6th entry: Hkv)
    ((1, 8, 1100, 1100, 128), {"policy": "bf16-mixed", "causal": True}),
    ((1, 4, 260, 390, 96), {"policy": "bf16-mixed", "causal": True, "block_k": 64}),
    ((1, 2, 390, 260, 32), {"policy": "fp32", "causal": True}),
    ((1, 8, 700, 700, 128, 2), {"policy": "bf16-mixed", "causal": True}),
    ((2, 4, 300, 300, 256, 1), {"policy": "fp16-mixed"}),
]


def _run(shape, kw, seed=0):
    b, h, lq, lk, d = shape[:5]
    hkv = shape[5] if len(shape) > 5 else h
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n_h, n, d, generator=g) * 2 for n_h, n in ((h, lq), (hkv, lk), (hkv, lk)))
    return flash_attention(q, k, v, return_lse=True, **kw)


@needs_step
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tiles", [True, False])
def test_simulator_bits_unchanged(threads, tiles, monkeypatch):
    """The flash simulator with the fused step (and with or without whole tiles in C) and without it (torch's
    ops): the same output and LSE bits, on one thread and on two (the query tiles' pool: its workers run
    single-threaded, so the step runs fused)."""
    if tiles and not native_step.status()["tile_loop"]:
        pytest.skip(native_step.status()["tile_reason"])
    calls = []
    real, real_tile = native_step.softmax_step, native_step.tile_forward

    def counting(*a):
        out = real(*a)
        calls.append(out is not None)
        return out

    def counting_tile(*a, **kw):
        out = real_tile(*a, **kw)
        calls.append(out)
        return out

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape, kw in CASES:
            monkeypatch.setattr(flash, "softmax_step", counting)
            monkeypatch.setattr(flash, "tile_forward", counting_tile if tiles else lambda *a, **kw: False)
            got = _run(shape, kw)
            monkeypatch.setattr(flash, "softmax_step", lambda *a, **kw: None)
            monkeypatch.setattr(flash, "tile_forward", lambda *a, **kw: False)
            want = _run(shape, kw)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (shape, kw)
    finally:
        torch.set_num_threads(old)
    assert any(calls)  # the fused step (or tile) did run


needs_tile = pytest.mark.skipif(
    not HAS_CC or not native_step.status()["tile_loop"], reason="the tile loop is off here (see its status)"
)


@needs_tile
@pytest.mark.parametrize("case", range(len(native_step._TILE_CASES)))
@pytest.mark.parametrize("p_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tile_forward_gives_the_step_loops_bits(case, p_dtype, one_thread):
    """A whole tile in C against the step loop with torch's bmm: ragged key blocks, unaligned head offsets,
    several heads and batches, causal steps (top and bottom alignment) on part of the rows, a scale that is no
    power of two, grouped K / V heads, head dims 16 to 256, user masks (bool, float, broadcast), every output."""
    if p_dtype == torch.float16 and not native_step._library()[0].fc_has_fp16():
        pytest.skip("no _Float16 in this compiler")
    shape, spans, how = native_step._TILE_CASES[case]
    q, k, v = native_step._tile_case(shape, sliced=how is not None)
    how = native_step._tile_how(shape, how)  # a user mask where the case names one
    want = native_step._torch_tile(q, k, v, spans, p_dtype, how)
    b, h, rows, _ = q.shape
    o = torch.zeros(b, h, rows, v.shape[-1])
    m, l = torch.full((b, h, rows, 1), -float("inf")), torch.zeros(b, h, rows, 1)
    starts, scale, causal, mask = (*how, None)[:4] if how is not None else (None, 1.0, None, None)
    assert native_step.tile_forward(
        q, k, v, spans, o, m, l, p_dtype, starts=starts, scale=scale, causal=causal, mask=mask
    )
    for a, got in zip(want, (o, m, l), strict=True):
        assert torch.equal(_bits(a), _bits(got)), (shape, p_dtype)


@needs_tile
def test_tile_forward_takes_expanded_heads(one_thread):
    """K and V shared across heads (stride 0, as expand_kv_heads leaves grouped-query heads): the same bits as
    their copies."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 24, 32, generator=g)
    k, v = (torch.randn(1, 1, 50, 32, generator=g).expand(1, 4, 50, 32) for _ in range(2))
    spans = [(0, 25), (25, 50)]
    outs = []
    for kk, vv in ((k, v), (k.contiguous(), v.contiguous())):
        o, m, l = torch.zeros(1, 4, 24, 32), torch.full((1, 4, 24, 1), -float("inf")), torch.zeros(1, 4, 24, 1)
        assert native_step.tile_forward(q, kk, vv, spans, o, m, l, torch.bfloat16)
        outs.append((o, m, l))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(_bits(a), _bits(b))


def test_tile_forward_off_where_torch_would_run_threaded():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = native_step._tile_case((1, 2, 2, 9, 70, 16, 16))
        o, m, l = torch.zeros(1, 2, 9, 16), torch.full((1, 2, 9, 1), -float("inf")), torch.zeros(1, 2, 9, 1)
        assert not native_step.tile_forward(q, k, v, [(0, 70)], o, m, l, torch.float32)
        assert torch.equal(o, torch.zeros_like(o))
    finally:
        torch.set_num_threads(old)


_CHILD = """
import json, torch
from flashcheck.kernels.sim import flash
from flashcheck.kernels.native import step as native_step
from tests.test_native_step import CASES, _run
torch.set_num_threads(1)
outs = [_run(s, kw) for s, kw in CASES]
flash.softmax_step = lambda *a, **kw: None
flash.tile_forward = lambda *a, **kw: False
same = all(torch.equal(a, b) for (s, kw), got in zip(CASES, outs) for a, b in zip(got, _run(s, kw)))
print(json.dumps({"status": native_step.status(), "same": same}))
"""


def _child(env: dict) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([os.path.join(root, "src"), root])}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=full, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _capabilities() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        flags = []
    return ["default", *(["avx2"] if "avx2" in flags else []), *(["avx512"] if "avx512f" in flags else [])]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
@pytest.mark.parametrize("cap", _capabilities())
def test_each_cpu_capability_matches_or_is_off(cap):
    """Under ATEN_CPU_CAPABILITY=cap the step is on and moves no bit, or it is off and says why."""
    res = _child({"ATEN_CPU_CAPABILITY": cap})
    assert res["same"]
    assert res["status"]["available"] or res["status"]["reason"]


def test_native_off_says_so_and_keeps_the_bits():
    res = _child({"FLASHCHECK_NATIVE": "0"})
    assert res["same"] and not res["status"]["available"]
    assert "FLASHCHECK_NATIVE=0" in res["status"]["reason"]


def test_doctor_reports_the_step():
    from flashcheck import doctor

    line = doctor._native_step()
    assert set(line) >= {"available", "reason", "capability", "tile_loop", "tile_reason"}


@needs_tile
@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_heads_run_without_a_repeated_copy(threads, monkeypatch):
    """A forward (no autograd) of grouped K / V heads: the C tiles read each group for its query heads (K and V are
    never repeated), and the output and LSE are the bits of the forward that repeats them (autograd on, and the
    step loop with torch's ops), over several query tiles, causal, D = 128."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 8, 1100, 128, generator=g)
    k, v = (torch.randn(1, 2, 1100, 128, generator=g) for _ in range(2))
    kw = {"policy": "bf16-mixed", "causal": True, "return_lse": True}
    real, repeats = flash.expand_kv_heads, []
    monkeypatch.setattr(flash, "expand_kv_heads", lambda *a: repeats.append(1) or real(*a))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            fast = flash_attention(q, k, v, **kw)
        assert not repeats
        want = flash_attention(*(t.clone().requires_grad_(True) for t in (q, k, v)), **kw)
        assert repeats
        monkeypatch.setattr(flash, "softmax_step", lambda *a, **kw: None)
        monkeypatch.setattr(flash, "tile_forward", lambda *a, **kw: False)
        with torch.no_grad():
            loop = flash_attention(q, k, v, **kw)  # grouped heads too: the loop repeats them where it runs
    finally:
        torch.set_num_threads(old)
    for a, b, c in zip(fast, want, loop, strict=True):
        assert torch.equal(a.view(torch.int32), b.detach().view(torch.int32))
        assert torch.equal(a.view(torch.int32), c.view(torch.int32))
