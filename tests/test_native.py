"""kernels.native.rounding: one-pass C rounding of P gives torch's bits, and the simulators fall back without it."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.numerics import parse_policy
from flashcheck.kernels import flash_attention
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import rounding as native
from flashcheck.kernels.sim import flash as flash_mod
from flashcheck.kernels.sim import ops as ops_mod
from flashcheck.kernels.sim.fp8 import round_inputs

HAS_CC = cbuild.compiler() is not None


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """native with its cached library forgotten and its build cache in tmp_path (restored afterwards)."""
    monkeypatch.setenv("FLASHCHECK_CACHE", str(tmp_path))
    native._library.cache_clear()
    yield native
    native._library.cache_clear()


def _specials(dtype: torch.dtype) -> torch.Tensor:
    """Random values over 60 binades, random bit patterns (NaNs among them), ties, subnormals and overflow."""
    g = torch.Generator().manual_seed(7)
    mags = torch.exp2(torch.randint(-60, 60, (20000,), generator=g).float())
    bits = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    fi = torch.finfo(dtype)
    edge = [fi.max, fi.max * 1.001, -fi.max * 1.01, fi.tiny / 2, fi.smallest_normal * 0.37]
    edge += [1 + 2.0**-8, 1 + 3 * 2.0**-8]
    edge += [1 + 2.0**-11, 1 + 3 * 2.0**-11, float("nan"), float("inf"), -0.0]
    return torch.cat([torch.randn(20000, generator=g) * mags, bits.view(torch.float32), torch.tensor(edge)])


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_c_rounding_gives_the_casts_bits(dtype):
    """Every value, NaNs included, ends with the bits of x.to(dtype).to(float32) (built here, at test time)."""
    assert native.status()["available"], native.status()["reason"]
    x = _specials(dtype)
    want = x.to(dtype).to(torch.float32)
    assert native.round_(x, dtype)
    assert torch.equal(x.view(torch.int32), want.view(torch.int32))
    y = x[:4097].clone()  # a length no vector width divides
    assert native.round_(y, dtype) and torch.equal(y.view(torch.int32), want[:4097].view(torch.int32))


def test_it_declines_what_it_does_not_round():
    """Non-contiguous, float64 or fp8 targets stay untouched (the caller casts)."""
    x = torch.randn(6, 8)
    before = x.clone()
    assert not native.round_(x[:, ::2], torch.bfloat16)
    assert not native.round_(x.double(), torch.bfloat16)
    assert not native.round_(x, torch.float8_e4m3fn)
    assert torch.equal(x, before)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
@pytest.mark.parametrize("policy", ["bf16-mixed", "fp16-mixed", "bf16"])
def test_the_simulator_moves_no_bit(policy, monkeypatch):
    """flash_attention with the C rounding equals itself with torch's casts, bit for bit (two query tiles)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 300, 32, generator=g) * 3 for _ in range(3))
    done = []
    real = ops_mod.native_round
    monkeypatch.setattr(ops_mod, "native_round", lambda x, dtype: done.append(real(x, dtype)) or done[-1])
    monkeypatch.setattr(flash_mod, "softmax_step", lambda *a: None)  # kernels.native.step's fused step and whole
    monkeypatch.setattr(flash_mod, "tile_forward", lambda *a, **kw: False)  # tiles (causal now too): their own tests
    fast = flash_attention(q, k, v, policy=policy, causal=True, return_lse=True)
    assert any(done)  # the C routine rounded some P
    monkeypatch.setattr(ops_mod, "native_round", lambda x, dtype: False)
    slow = flash_attention(q, k, v, policy=policy, causal=True, return_lse=True)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_no_compiler_falls_back_with_a_reason(fresh_native, monkeypatch):
    """Without a compiler: status says so, rnd_ casts through torch, and the values are the casts'."""
    monkeypatch.setenv("CC", "no-such-compiler-here")
    st = fresh_native.status()
    assert not st["available"] and "$CC=no-such-compiler-here: not found" in st["reason"], st["reason"]
    x = torch.randn(1000) * 1e3
    want = x.to(torch.bfloat16).float()
    assert torch.equal(ops_mod.rnd_(x, parse_policy("bf16-mixed"), "p"), want)


def test_the_switch_and_a_failed_build_are_reported(fresh_native, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHCHECK_NATIVE", "0")
    assert "FLASHCHECK_NATIVE=0" in fresh_native.status()["reason"]
    monkeypatch.delenv("FLASHCHECK_NATIVE")
    fresh_native._library.cache_clear()
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    st = fresh_native.status()
    assert not st["available"] and "did not build" in st["reason"] and "broken" in st["reason"]
    assert f"the compiler {broken} failed (exit 1): cc: error: this compiler is broken" in st["reason"], st["reason"]
    fresh_native._library.cache_clear()
    monkeypatch.setenv("CC", "/bin/false")  # no message: no Python repr either
    why = fresh_native.status()["reason"]
    assert "the compiler /bin/false failed (exit 1): no message" in why and "Command '" not in why, why


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_a_build_is_cached_and_reused(fresh_native, tmp_path):
    assert fresh_native.status()["available"]
    built = sorted(cbuild.cache_root().glob("rounding-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    fresh_native._library.cache_clear()
    assert fresh_native.status()["available"] and built[0].stat().st_mtime_ns == stamp


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp16", "fp32"])
def test_float32_inputs_skip_the_float64_round_trip_bit_for_bit(policy):
    """round_inputs of float32 tensors equals its float64 path's result and never returns the caller's tensor."""
    pol = parse_policy(policy)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g) * 100 for _ in range(3))
    fast = round_inputs(q, k, v, pol)
    slow = round_inputs(q.double(), k.double(), v.double(), pol)
    for a, b, src in zip(fast[:3], slow[:3], (q, k, v), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b) and a.data_ptr() != src.data_ptr()


def test_doctor_reports_the_rounding(monkeypatch):
    from typer.testing import CliRunner

    import flashcheck.backends as backends_mod
    from flashcheck.cli import app

    monkeypatch.setattr(backends_mod, "all_backends", lambda: [])  # their probes take seconds; not this test's
    from flashcheck.kernels.tensorcore import mma

    native._library.cache_clear()
    mma._native.cache_clear()
    monkeypatch.setenv("FLASHCHECK_NATIVE", "0")
    try:
        out = CliRunner().invoke(app, ["doctor", "--seq-len", "64"]).output
    finally:
        native._library.cache_clear()
        mma._native.cache_clear()  # doctor loaded the tensor-core chain too, with the switch off: forget that
    assert "simulator's P rounding: FLASHCHECK_NATIVE=0" in out


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_fused_max_step_gives_torchs_values():
    """max_sub_ equals amax, maximum, -inf -> 0 and sub_ in torch: rows of -inf, a -inf running max, ragged widths."""
    g = torch.Generator().manual_seed(3)
    for width in (128, 37):
        s = torch.randn(2, 3, 50, width, generator=g) * 30
        s[0, 0, :5] = -torch.inf  # fully masked rows
        s[1, 2, 7, ::3] = -torch.inf
        m = torch.randn(2, 3, 50, 1, generator=g) * 30
        m[0, 0, :3] = -torch.inf  # no key seen yet
        want_s = s.clone()
        m_new = torch.maximum(m, want_s.amax(dim=-1, keepdim=True))
        ms = torch.where(torch.isneginf(m_new), 0.0, m_new)
        want_s.sub_(ms)
        got = native.max_sub_(s, m)
        assert got is not None
        assert torch.equal(got[0], m_new) and torch.equal(got[1], ms) and torch.equal(s, want_s)
    assert native.max_sub_(torch.randn(4, 8)[:, ::2], torch.zeros(4, 1)) is None  # not contiguous: declined


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
@pytest.mark.parametrize("causal", [False, True])
def test_the_fused_max_step_moves_no_bit(causal, monkeypatch):
    import flashcheck.kernels.sim.flash as flash_mod

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 260, 64, generator=g) for _ in range(3))
    used = []
    real = flash_mod.max_sub_
    monkeypatch.setattr(flash_mod, "softmax_step", lambda *a: None)  # kernels.native.step's fused step: its own tests
    monkeypatch.setattr(flash_mod, "tile_forward", lambda *a, **kw: False)  # and its whole tiles in C
    monkeypatch.setattr(flash_mod, "max_sub_", lambda s, m: used.append(1) or real(s, m))
    fast = flash_attention(q, k, v, policy="bf16-mixed", causal=causal, block_k=64, return_lse=True)
    assert used  # D = 64: the scale folds, so the scores are NaN-free and the fused step ran
    monkeypatch.setattr(flash_mod, "max_sub_", lambda s, m: None)
    slow = flash_attention(q, k, v, policy="bf16-mixed", causal=causal, block_k=64, return_lse=True)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_a_linked_or_shared_cache_folder_is_not_loaded_from(fresh_native, tmp_path):
    """The cache folder a link planted elsewhere, or writable by others: nothing is built or loaded there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cbuild.cache_root().symlink_to(elsewhere)
    st = fresh_native.status()
    assert not st["available"] and "symbolic link" in st["reason"] and not list(elsewhere.iterdir())
    cbuild.cache_root().unlink()
    cbuild.cache_root().mkdir()
    cbuild.cache_root().chmod(0o777)  # ours but open to others: refused with the reason, left as it is
    fresh_native._library.cache_clear()
    st = fresh_native.status()
    assert not st["available"] and "writable by others (mode 0777)" in st["reason"] and "chmod go-w" in st["reason"]
    assert cbuild.cache_root().stat().st_mode & 0o777 == 0o777 and not list(cbuild.cache_root().iterdir())
    cbuild.cache_root().chmod(0o700)
    fresh_native._library.cache_clear()
    assert fresh_native.status()["available"]
    lib = next(cbuild.cache_root().glob("rounding-*.so"))
    assert lib.stat().st_mode & 0o022 == 0
    lib.chmod(0o777)  # a library others may write: not loaded
    fresh_native._library.cache_clear()
    st = fresh_native.status()
    assert not st["available"] and "writable by others" in st["reason"]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_rounded_copy_gives_the_casts_bits():
    """native.rounded: a fresh tensor with x.to(bf16).to(float32)'s bits, NaNs among the values; x untouched."""
    x = _specials(torch.bfloat16)
    keep = x.clone()
    got = native.rounded(x, torch.bfloat16)
    assert got is not None and got.data_ptr() != x.data_ptr()
    want = x.to(torch.bfloat16).to(torch.float32)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(x.view(torch.int32), keep.view(torch.int32))


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
@pytest.mark.parametrize("extra", [[], [0.0] * 3, [float("inf")], [float("nan")], [2.0**-149, -0.0]])
def test_abs_stats_and_prescale_answer_as_torch(extra, monkeypatch):
    """native.abs_stats gives torch's min / max / least nonzero of |x| (NaN max where x has a NaN), and
    ops.prescale_is_exact answers the same with it and without it."""
    g = torch.Generator().manual_seed(len(extra))
    x = torch.cat([torch.randn(1037, generator=g) * torch.exp2(torch.randint(-60, 20, (1037,), generator=g)),
                   torch.tensor(extra, dtype=torch.float32)])  # fmt: skip
    lo, hi, nz = native.abs_stats(x)
    a = x.abs()
    if torch.isnan(x).any():
        assert hi != hi
    else:
        assert (lo, hi) == (float(a.min()), float(a.max()))
    assert nz == float(a[a > 0].min())
    for q, k, scale in ((x.view(1, 1, -1, 1), x.view(1, 1, -1, 1), 0.125), (x[:64].view(1, 1, 8, 8),) * 2 + (2.0,)):
        fast = ops_mod.prescale_is_exact(q, k, scale)
        monkeypatch.setattr(ops_mod, "native_abs_stats", lambda t: None)
        assert ops_mod.prescale_is_exact(q, k, scale) == fast
        monkeypatch.undo()
