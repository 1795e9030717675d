"""O held in the P·V MMA's units (kernels.sim.mma_ops.held_v_scale, pv_accumulate(held=True), kernels.sim.flash's
finalize) against a hand-written loop that follows FA4's forward (Dao-AILab/flash-attention
flash_attn/cute/flash_fwd_sm100.py at 0251105a: the fp32 O accumulator rescaled in place, the P·V MMA
accumulating into it, then O * (rcp_approx(row_sum) * v_descale) in the correction epilogue; FA3's
hopper/softmax.h finalize(v_descale) folds the same factor into 1 / row_sum)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck.core.numerics import parse_policy
from flashcheck.kernels.native.mma import operands
from flashcheck.kernels.sim.flash import _held_factor
from flashcheck.kernels.sim.fp8 import round_inputs
from flashcheck.kernels.sim.mma_ops import MMAOperands, Operand, held_v_scale, pv_accumulate
from flashcheck.kernels.sim.presets import default_format, resolve
from flashcheck.kernels.tensorcore.mma import B200, mma_matmul

PS = 256.0  # FA4's P in 2^8 units (max_offset 8)


def _steps(seed: int, n: int = 4):
    """(P codes [1, 1, 6, 32], alpha [1, 1, 6, 1] float32, V codes [1, 1, 32, 8]) for n key blocks, and the row
    sum l [1, 1, 6, 1] (float32, P in units of 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = operands("e4m3", (1, 1, 6, 32), 10 * seed + i).abs().float()
        vc = operands("e4m3", (1, 1, 32, 8), 10 * seed + i + 5).float()
        alpha = torch.exp2(-torch.rand(1, 1, 6, 1, generator=g) * 4).float() if i else torch.zeros(1, 1, 6, 1)
        out.append((p, alpha, vc))
    return out, torch.rand(1, 1, 6, 1, generator=g) * 30 + 1


def _oracle(steps, l: torch.Tensor, v_scale: float) -> np.ndarray:
    """The loop as the source writes it, in float32 numpy (the MMA by tensorcore.mma's model)."""
    o = np.zeros((6, 8), np.float32)
    for p, alpha, vc in steps:
        o = o * alpha[0, 0].numpy().astype(np.float32)  # the correction warps' rescale of the fp32 accumulator
        c = torch.from_numpy(o + np.float32(0.0)).view(1, 1, 6, 8)
        o = mma_matmul(p, vc, B200, c=c, fmt="e4m3")[0, 0].numpy()  # the MMA accumulates into O (units)
    row_sum = l[0, 0].numpy().astype(np.float32) * np.float32(PS)
    scale = (np.float32(1.0) / row_sum).astype(np.float32) * np.float32(v_scale)  # rcp_approx(row_sum) * v_descale
    return (o * scale.astype(np.float32)).astype(np.float32)


def _simulated(steps, l, v_scale: float, held: bool) -> torch.Tensor:
    pol = parse_policy("fa4-fp8")
    vs = torch.full((1, 1, 1, 1), v_scale, dtype=torch.float64)
    o = torch.zeros(1, 1, 6, 8)
    for p, alpha, vc in steps:
        pe, ve = Operand(p, torch.ones(1, 1, 1, 1, dtype=torch.float64), "e4m3"), Operand(vc, vs, "e4m3")
        if held:
            pv_accumulate(pe, ve, o, PS, pol, B200, alpha=alpha, buf=torch.empty(o.shape), held=True)
        else:  # the per-step conversion: O in values, to MMA units and back at every block
            pv_accumulate(pe, ve, o, PS, pol, B200, alpha=alpha, buf=torch.empty(o.shape))
    if held:
        return o * _held_factor(l, l == 0, vs, pol)
    return o * torch.reciprocal(l)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_held_o_equals_the_source_loop(seed):
    steps, l = _steps(seed)
    v_scale = float(torch.tensor(0.37 / 448, dtype=torch.float32))  # FA4's v_descale is a float32
    want = _oracle(steps, l, v_scale)
    got = _simulated(steps, l, v_scale, held=True)[0, 0].numpy()
    assert np.array_equal(want.view(np.int32), got.view(np.int32))


def test_per_step_conversion_fails_the_oracle_unless_the_unit_is_a_power_of_two():
    def old_equals_oracle(seed: int, v_scale: float) -> bool:
        steps, l = _steps(seed)
        old = _simulated(steps, l, v_scale, held=False)[0, 0].numpy()
        return np.array_equal(_oracle(steps, l, v_scale).view(np.int32), old.view(np.int32))

    assert all(old_equals_oracle(seed, 2.0**-9) for seed in (1, 2, 3))  # exact conversions: the same bits
    v_scale = float(torch.tensor(0.37 / 448, dtype=torch.float32))  # unit = v_scale / 256: the conversions round
    assert not all(old_equals_oracle(seed, v_scale) for seed in (1, 2, 3))


def test_which_presets_hold_o_in_units():
    q = torch.randn(1, 2, 64, 32)
    # fa4-fp4 (NVFP4 V: block-scaled values, one tensor descale) and sage3-fp4 (FP4 V, no tensor scale) hold O too
    cases = (("fa4-fp8", True), ("fa4-fp4", True), ("sage3-fp4", True), ("fa3-fp8", False), ("fa3-fp8-fp22", False),
             ("sage2-hopper", False))  # fmt: skip
    for name, held in cases:
        kw = resolve(name, default_format(name), 64, 64, 32, False)
        pol, parts = kw["policy"], {}
        qr, kr, vr, _ = round_inputs(q, q, q, pol, block_q=kw["block_q"], block_k=kw["block_k"], parts=parts)
        ops = MMAOperands.make(qr, kr, vr, pol, kw["block_q"], kw["block_k"], parts)
        assert (held_v_scale(ops, pol, qr.dtype) is not None) == held, name
