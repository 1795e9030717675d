"""Scale (issue 15), the faster paths: a power-of-two softmax scale folded into Q, and the reference and standard
kernels' chunks formed in one reused buffer, change no bit. Oracles: the autograd paths (out of place, the scale
applied to the scores) and a direct float32/float64 product."""

from __future__ import annotations

import math

import pytest
import torch
from tests.helpers import scale_qkv

from flashcheck.kernels.sim import flash as flash_mod
from flashcheck.kernels.sim import ops
from flashcheck.kernels.sim import reference as reference_mod
from flashcheck.kernels.sim import standard as standard_mod
from flashcheck.kernels.sim.ops import prescale_is_exact
from flashcheck.kernels.sim.reference import reference_attention
from flashcheck.kernels.sim.standard import standard_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spread", [0, 30])
def test_an_allowed_fold_gives_the_products_bits(dtype, spread):
    """Where prescale_is_exact says yes, (s q) k^T == s (q k^T) bit for bit, on data spanning 2^+-spread."""
    g = torch.Generator().manual_seed(spread)
    q = torch.randn(4, 37, 64, generator=g, dtype=dtype) * torch.exp2(torch.randint(-spread, spread + 1, (4, 37, 64)))
    k = torch.randn(4, 53, 64, generator=g, dtype=dtype)
    for s in (0.125, 2.0**-5, 4.0, 1.0):
        assert prescale_is_exact(q, k, s)
        assert torch.equal(torch.matmul(q * s, k.transpose(-1, -2)), torch.matmul(q, k.transpose(-1, -2)) * s)


def test_the_fold_is_refused_where_it_would_change_bits():
    """Two subnormal products: scaled after the sum they round once (to 2^-149), scaled before it twice (to 0)."""
    tiny = 3 * 2.0**-149
    q, k = torch.tensor([[tiny, tiny]]), torch.ones(1, 2)
    late, early = torch.matmul(q, k.T) * 0.125, torch.matmul(q * 0.125, k.T)
    assert late.item() == 2.0**-149 and early.item() == 0.0  # the hazard is real
    assert not prescale_is_exact(q, k, 0.125)


@pytest.mark.parametrize(
    "q,k,s,why",
    [
        (torch.ones(2, 4), torch.ones(3, 4), 0.3, "not a power of two"),
        (torch.ones(2, 4), torch.ones(3, 4), -0.125, "negative"),
        (torch.ones(2, 4), torch.ones(3, 4), math.inf, "infinite"),
        (torch.ones(2, 4).half(), torch.ones(3, 4).half(), 0.125, "narrower than float32"),
        (torch.tensor([[1.0, math.nan]]), torch.ones(3, 2), 0.125, "NaN input"),
        (torch.tensor([[1.0, math.inf]]), torch.ones(3, 2), 0.125, "inf input"),
        (torch.full((2, 4), 2.0**100), torch.full((3, 4), 2.0**26), 0.125, "products near overflow"),
        (torch.full((2, 4), 2.0**-110), torch.ones(3, 4), 0.125, "scaled operand below full precision"),
        (torch.ones(0, 4), torch.ones(3, 4), 0.125, "empty"),
    ],
)
def test_the_fold_is_refused_outside_its_proof(q, k, s, why):
    assert not prescale_is_exact(q, k, s), why


def test_all_zero_operands_fold():
    assert prescale_is_exact(torch.zeros(2, 4), torch.randn(3, 4), 0.125)


POLICIES = ("fp64", "bf16-mixed", "fp16", "baseline-fp8", "fp32")
SETTINGS = [
    dict(),  # D = 16: scale 1/4, folded
    dict(scale=0.3),  # not folded
    dict(causal=True),
    dict(mask="bool"),
]


def _mask(setting: dict, lq: int, lk: int) -> dict:
    if setting.get("mask") != "bool":
        return setting
    return {**setting, "mask": torch.rand(1, 2, lq, lk, generator=torch.Generator().manual_seed(4)) > 0.3}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_standard_in_place_chunks_equal_the_autograd_path_bit_for_bit(policy, setting, monkeypatch):
    """No-grad chunks (reused buffer, in-place steps, folded scale) == the out-of-place path autograd takes,
    whole and in chunks of 10 rows (the buffer then serves chunks of two sizes)."""
    lq, lk = 57, 70
    q, k, v = scale_qkv(lq, lk, seed=7)
    kw = _mask(setting, lq, lk)
    want = standard_attention(q.clone().requires_grad_(), k, v, policy=policy, **kw).detach()
    folds = []
    real = standard_mod.prescale_is_exact
    monkeypatch.setattr(standard_mod, "prescale_is_exact", lambda *a: folds.append(real(*a)) or folds[-1])
    with torch.no_grad():
        for rows in (None, 10):
            assert torch.equal(standard_attention(q, k, v, policy=policy, chunk_rows=rows, **kw), want), rows
    assert folds == [setting.get("scale") is None] * 2


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_in_place_chunks_equal_the_autograd_path_bit_for_bit(setting, dtype, monkeypatch):
    lq, lk = 57, 70
    q, k, v = (t.to(dtype) for t in scale_qkv(lq, lk, seed=8))
    kw = _mask(setting, lq, lk)
    want = [t.detach() for t in reference_attention(q.clone().requires_grad_(), k, v, return_lse=True, **kw)]
    monkeypatch.setattr(reference_mod, "REFERENCE_BLOCK_BYTES", 2 * 70 * 8 * 12)  # 12 rows per chunk
    with torch.no_grad():
        for chunk in (1024, 9):
            got = reference_attention(q, k, v, return_lse=True, chunk=chunk, **kw)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), chunk


@pytest.mark.parametrize("policy", POLICIES)
def test_flash_folds_a_power_of_two_scale_and_keeps_its_bits(policy, monkeypatch):
    """D = 16 (scale 1/4): the fold is taken, and the output and LSE equal the run that scales every score block."""
    q, k, v = scale_qkv(70, 90, seed=9)
    seen = []
    real = flash_mod.prescale_is_exact
    monkeypatch.setattr(flash_mod, "prescale_is_exact", lambda *a: seen.append(real(*a)) or seen[-1])
    folded = flash_mod.flash_attention(q, k, v, policy=policy, block_k=32, return_lse=True)
    monkeypatch.setattr(flash_mod, "prescale_is_exact", lambda *a: False)
    plain = flash_mod.flash_attention(q, k, v, policy=policy, block_k=32, return_lse=True)
    assert seen == [True]
    assert all(torch.equal(a, b) for a, b in zip(folded, plain, strict=True))


def test_safe_max_replaces_only_minus_inf():
    m = torch.tensor([-math.inf, math.inf, math.nan, -3.0, 0.0], dtype=torch.float16)
    got = ops.safe_max(m)
    assert got.dtype == torch.float16
    assert got[0] == 0 and got[1] == math.inf and math.isnan(got[2]) and got[3] == -3 and got[4] == 0


@pytest.mark.parametrize("kernel", ["reference", "standard", "flash"])
def test_the_fold_never_writes_into_the_callers_tensors(kernel):
    q, k, v = scale_qkv(40, 50, seed=10)
    before = [t.clone() for t in (q, k, v)]
    with torch.no_grad():
        if kernel == "reference":
            reference_attention(q, k, v, chunk=8)
        elif kernel == "standard":
            standard_attention(q, k, v, policy="fp64", chunk_rows=8)
        else:
            flash_mod.flash_attention(q, k, v, policy="fp64", block_k=16)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before, strict=True))


_FIRST_CALL = """
import hashlib, torch
from flashcheck.kernels.sim.reference import reference_attention
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 8, 512, 64, generator=g, dtype=torch.float64) for _ in range(3))
torch.matmul(q, k.transpose(-1, -2))  # a BLAS call first, as a user's code may make
with torch.no_grad():
    outs = [reference_attention(q, k, v) for _ in range(2)]
print(int(torch.equal(*outs)), hashlib.md5(outs[0].numpy().tobytes()).hexdigest())
"""


def test_the_first_reference_of_a_process_has_the_bits_of_every_later_one():
    """ops.settle_exp: without it, about one fresh process in four computed its first exp inaccurately on one
    thread (FP64 reference off by up to 5e-10 on half the heads). Eight fresh processes one after another (at
    once, on two cores, the fault rarely shows), two threads each: every first call equals the second, and every
    process gets the same bits (run as users run it: no OMP_NUM_THREADS, which hides the fault)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    runs = [
        subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, env=env) for _ in range(8)
    ]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    lines = [r.stdout.split() for r in runs]
    assert [line[0] for line in lines] == ["1"] * 8
    assert len({line[1] for line in lines}) == 1
