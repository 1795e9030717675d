"""kernels.sim.memory: the estimate grows as the kernels do, refuses what cannot fit with the largest size that
does, and stays an upper bound of the peak a real comparison reaches (VmHWM in a fresh
process: ru_maxrss would carry the pytest parent's high-water mark across fork + exec)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flashcheck.core.inputs import InputSpec
from flashcheck.kernels.sim import memory
from flashcheck.kernels.sim.memory import Footprint, InsufficientMemory, check_fits, estimate_bytes, largest_fitting
from flashcheck.measure.compare import CompareConfig


def fp(seq_len: int, **kw) -> Footprint:
    return Footprint(**{"batch": 1, "heads": 8, "seq_len": seq_len, "head_dim": 64, **kw})


def test_every_kernel_grows_linearly_without_a_backward():
    big = 2**16
    for kernels in (("standard",), ("flash",), ("flash", "standard")):
        est = [estimate_bytes(fp(n, kernels=kernels)) for n in (big, 2 * big)]
        assert 1.9 < est[1] / est[0] <= 2.1, kernels
    std = [estimate_bytes(fp(n, kernels=("standard",), backward=True)) for n in (big, 2 * big)]
    assert 3.9 < std[1] / std[0] <= 4.0  # autograd keeps every chunk's scores: L x L in all
    fl = estimate_bytes(fp(big, kernels=("flash",)))
    assert estimate_bytes(fp(big, kernels=("flash",), backward=True)) > 4 * fl  # the reference's graph is L x L


def test_refusal_names_the_sizes_the_estimate_and_the_largest_length_that_fits():
    avail = 8 * 2**30
    with pytest.raises(InsufficientMemory) as info:
        check_fits(fp(10_000_000), available=avail)
    err = info.value
    budget = int(memory.HEADROOM * avail)
    assert estimate_bytes(fp(err.largest_seq_len)) <= budget < estimate_bytes(fp(err.largest_seq_len + 1))
    msg = str(err)
    assert "seq_len=10000000" in msg and "8.0 GiB is available now and a run may plan on 90% of it (7.2 GiB)" in msg
    assert f"the largest seq_len that fits is {err.largest_seq_len}" in msg
    assert isinstance(err, ValueError)  # so the CLI exits 2 and a study records the case as skipped


def test_a_batch_that_cannot_fit_at_any_length_says_so():
    with pytest.raises(InsufficientMemory, match="even seq_len=1 does not fit") as info:
        check_fits(fp(1024, batch=10**22), available=2**33)
    assert info.value.largest_seq_len == 0


def test_fits_returns_the_estimate_and_unknown_memory_refuses_nothing(monkeypatch):
    assert check_fits(fp(1024), available=2**40) == estimate_bytes(fp(1024))
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert check_fits(fp(10**9)) == estimate_bytes(fp(10**9))


def test_largest_fitting_is_a_binary_search():
    assert largest_fitting(lambda n: n * n, 100, 10**30) == 10
    assert largest_fitting(lambda n: n * n, 0, 50) == 0


def test_available_bytes_reads_meminfo_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    avail = memory.available_bytes()
    with open("/proc/meminfo") as f:
        line = next(x for x in f if x.startswith("MemAvailable:"))
    assert avail is not None and abs(avail - int(line.split()[1]) * 1024) < 2**30


_PEAK = """
import json, sys
import torch
torch.set_num_threads(1)
from flashcheck.core.inputs import InputSpec
from flashcheck.measure.compare import CompareConfig, run_compare
kernel, policy, heads, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
run_compare(CompareConfig(kernel=kernel, numerics=policy, inputs=InputSpec(heads=1, seq_len=64)))
base = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] * 1024
run_compare(CompareConfig(kernel=kernel, numerics=policy, inputs=InputSpec(heads=heads, seq_len=length)))
print(json.dumps([int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] * 1024 - base))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel,policy,heads,length",
    [("flash", "bf16-mixed", 4, 2048), ("flash", "fp64", 4, 1536), ("standard", "bf16-mixed", 8, 2048)],
)
def test_estimate_is_an_upper_bound_of_the_measured_peak(kernel, policy, heads, length):
    """Peak RSS above the warmed-up process, in a fresh process; measured 0.61-0.83 of the estimate at
    H=8, L=1024..4096 (see kernels/sim/memory.py). The bound must hold and not be loose by more than 2.5x.
    Standard at H=8, L=2048 (0.81 here; its L x L scores still dominate the peak): 4.5 s, where L=4096 took 10."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, kernel, policy, str(heads), str(length)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    peak = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = CompareConfig(kernel=kernel, numerics=policy, inputs=InputSpec(heads=heads, seq_len=length))
    est = estimate_bytes(cfg.footprint())
    assert 0.4 * est <= peak <= est, f"peak {peak / 2**20:.0f} MiB vs estimate {est / 2**20:.0f} MiB"
