"""flashcheck's rounding (core.numerics.round_to) against an independent oracle, bit for bit: ml_dtypes' casts
(the NumPy dtypes JAX uses) for bf16, fp8 e4m3/e5m2, fp6 e2m3/e3m2 and fp4 e2m1, NumPy's own float16 for
fp16 — on every value of each format, on every midpoint between neighbours (the ties, and the float64 numbers
just either side of them), and on random float64 and float32 values from the subnormals to past the largest
finite value.

fp8, fp6 and fp4 saturate in flashcheck (FA3's and the microscaling conversions clamp to +-max), where a plain cast
overflows to NaN (e4m3fn) or inf (e5m2): for them the oracle is the cast of the value clamped to +-max."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck.core.numerics import info, round_to

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is in the test extra")

FORMATS = {  # flashcheck format -> (oracle dtype, unsigned integer of its width)
    "bf16": (ml_dtypes.bfloat16, np.uint16),
    "fp16": (np.float16, np.uint16),
    "fp8-e4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
    "fp8-e5m2": (ml_dtypes.float8_e5m2, np.uint8),
    # the sub-byte formats of the microscaling presets (ml_dtypes stores each in a byte), where flashcheck has them
    "fp6-e2m3": (ml_dtypes.float6_e2m3fn, np.uint8),
    "fp6-e3m2": (ml_dtypes.float6_e3m2fn, np.uint8),
    "fp4-e2m1": (ml_dtypes.float4_e2m1fn, np.uint8),
}
SATURATING = ("fp8", "fp6", "fp4")  # flashcheck clamps these to +-max; a plain cast overflows (or has no inf)


def _every_finite_value(fmt: str) -> np.ndarray:
    """Every finite value of the format, as float64, in increasing order (both zeros)."""
    dtype, uint = FORMATS[fmt]
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = np.arange(np.iinfo(uint).max + 1, dtype=np.uint64).astype(uint).view(dtype).astype(np.float64)
    return np.sort(values[np.isfinite(values)])


def _oracle_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    dtype, uint = FORMATS[fmt]
    if fmt.startswith(SATURATING):
        x = np.clip(x, -info(fmt).max, info(fmt).max)
    with np.errstate(over="ignore"):  # past max + half an ulp: inf, as round_to gives
        return x.astype(dtype).view(uint)


def _flashcheck_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """round_to's result as the format's bits (converting a value of the format is exact)."""
    dtype, uint = FORMATS[fmt]
    out = round_to(torch.from_numpy(x), fmt).numpy()
    return out.astype(dtype).view(uint)


def _assert_same_bits(x: np.ndarray, fmt: str) -> None:
    got, want = _flashcheck_bits(x, fmt), _oracle_bits(x, fmt)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{fmt}: {bad.size} of {x.size} differ, first x={x[bad[0]]!r}: {got[bad[0]]} vs {want[bad[0]]}"
    )


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_value_of_the_format_is_kept(fmt):
    values = _every_finite_value(fmt)
    assert values.size == {"bf16": 65536 - 2 * 128, "fp16": 65536 - 2 * 1024}.get(fmt, values.size)  # less inf/NaN
    _assert_same_bits(values, fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_ties_and_their_neighbours_round_as_the_oracle(fmt):
    """Every midpoint between adjacent values (exact in float64: the formats have at most 11 bits) rounds to
    the even neighbour, and the float64 numbers just below and above it to the nearer one."""
    values = np.unique(_every_finite_value(fmt))  # -0 and +0 are one point on the line
    mid = (values[:-1] + values[1:]) / 2
    assert np.all((mid > values[:-1]) & (mid < values[1:]))  # exact midpoints, no rounding
    top = values[-1] + (values[-1] - values[-2]) / 2  # the tie past max: inf for bf16/fp16 (even), max for fp8
    mid = np.concatenate([mid, [top, -top]])
    for x in (mid, np.nextafter(mid, -np.inf), np.nextafter(mid, np.inf)):
        _assert_same_bits(x, fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_float64_values_round_as_the_oracle(fmt):
    """Log-uniform magnitudes from below the smallest subnormal to 4x past the largest finite value, both signs;
    for bf16 and fp16, whose casts overflow, past max + half an ulp they become inf in both."""
    fi = info(fmt)
    rng = np.random.default_rng(2405)
    smallest = 2.0 ** (fi.min_exp - fi.precision)
    mags = np.exp(rng.uniform(np.log(smallest / 4), np.log(fi.max * 4), 200_000))
    x = mags * rng.choice([-1.0, 1.0], mags.size)
    _assert_same_bits(x, fmt)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8-e4m3", "fp8-e5m2"])
def test_random_float32_values_round_as_the_oracle(fmt):
    """float32 inputs take torch's cast (one rounding: float32 holds each of these formats' values)."""
    rng = np.random.default_rng(7)
    x32 = (rng.standard_normal(100_000) * np.exp(rng.uniform(-12, 12, 100_000))).astype(np.float32)
    dtype, uint = FORMATS[fmt]
    got = round_to(torch.from_numpy(x32), fmt).numpy().astype(dtype).view(uint)
    want = _oracle_bits(x32, fmt)
    assert np.array_equal(got, want)


def test_torch_alone_rounds_float64_twice_where_the_oracle_and_flashcheck_round_once():
    """Why flashcheck does not use torch's cast for float64: it goes through float32 (the oracle would catch a
    regression to it). 1 + 2^-8 + 2^-40 is just above a bf16 tie; float32 drops the 2^-40, then bf16 ties to 1."""
    x = np.array([1 + 2**-8 + 2**-40])
    assert torch.from_numpy(x).to(torch.bfloat16).item() == 1.0
    assert (
        _oracle_bits(x, "bf16")[0]
        == _flashcheck_bits(x, "bf16")[0]
        != np.array([1.0]).astype(ml_dtypes.bfloat16).view(np.uint16)[0]
    )
