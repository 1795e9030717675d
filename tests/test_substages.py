"""explain's sub-stages (measure.substages): the exact_inputs knob against inputs rounded by hand (a slow oracle),
the dominant sub-stage of sage1 in words, and the classic policies' attribution as it was."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.inputs import InputSpec
from flashcheck.core.numerics import Format, parse_policy
from flashcheck.kernels import flash_attention
from flashcheck.measure.attribution import attribute
from flashcheck.measure.substages import substages

runner = CliRunner()


def _qkv(seed: int, n: int = 40, d: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, d, generator=g, dtype=torch.float64) for _ in range(3))


def _each(t: torch.Tensor, f) -> torch.Tensor:
    """f applied to every element, one Python float at a time (the slow oracle's loop)."""
    return torch.tensor([f(x) for x in t.flatten().tolist()], dtype=torch.float64).view(t.shape)


def _fp16(x: float) -> float:
    return struct.unpack("<e", struct.pack("<e", x))[0]  # CPython packs a double to binary16, nearest-even


def _e4m3(y: float) -> float:
    """y rounded to fp8-e4m3 (3 fraction bits, smallest normal 2^-6, saturating at 448), nearest-even."""
    y = max(-448.0, min(448.0, y))
    if y == 0.0:
        return 0.0
    e = max(math.frexp(y)[1], -5)  # |y| = m 2^e, 1/2 <= m < 1; subnormals share 2^-6's spacing
    ulp = 2.0 ** (e - 4)
    return round(y / ulp) * ulp  # Python's round: halves to even


def _int8_block(t: torch.Tensor) -> torch.Tensor:
    """SageAttention's INT8 per-block quantisation of one block (every row of t [..., L, D]): scale amax/127 + 1e-7
    in float32, values rounded half away from zero, element by element."""
    out = torch.empty_like(t)
    for b in range(t.shape[0]):
        for h in range(t.shape[1]):
            x32 = t[b, h].to(torch.float32)
            scale = x32.abs().max() / 127.0 + 1e-7  # float32 arithmetic, as the kernel
            y = (x32 / scale).tolist()
            s = float(scale)
            q = [[math.copysign(math.floor(abs(v) + 0.5), v) * s for v in row] for row in y]
            out[b, h] = torch.tensor(q, dtype=torch.float32).to(torch.float64)  # (q * scale) in float32
    return out


def _run(q, k, v, policy, **kw) -> torch.Tensor:
    return flash_attention(q, k, v, policy=policy, block_q=128, block_k=64, **kw)


def test_exact_inputs_rounds_only_qk_or_only_v_sage1():
    """sage1 with exact_inputs=v (Q and K quantised: INT8 per block, K smoothed; V exact) is the kernel with its
    input stage in FP64 run on Q, K quantised by hand; exact_inputs=qk is the same on V rounded to fp16 by hand."""
    q, k, v = _qkv(0)
    pol = parse_policy("sage1")
    hand = pol.replace(input=Format.FP64)  # every other stage as sage1; the input knobs inert at FP64
    qh, kh = _int8_block(q), _int8_block(k - k.mean(dim=-2, keepdim=True))
    vh = _each(v, _fp16)
    assert torch.equal(_run(q, k, v, pol.replace(exact_inputs="v")), _run(qh, kh, v, hand))
    assert torch.equal(_run(q, k, v, pol.replace(exact_inputs="qk")), _run(q, k, vh, hand))
    full = _run(q, k, v, pol)
    assert torch.equal(full, _run(qh, kh, vh, hand))  # both rounded: the preset itself
    assert not torch.equal(full, _run(q, k, v, pol.replace(exact_inputs="qk")))


def test_exact_inputs_rounds_only_qk_or_only_v_fp8():
    """fa4-fp8 (per-tensor e4m3 inputs, with its P scaling, emulated exp2 and rcp.approx): the same, with each
    tensor scaled by amax/448 and rounded to e4m3 by hand."""
    q, k, v = _qkv(1)
    pol = parse_policy("fa4-fp8")
    hand = pol.replace(input=Format.FP64)

    def e4m3(t: torch.Tensor) -> torch.Tensor:
        scale = t.abs().amax() / 448.0
        return _each(t / scale, _e4m3) * scale

    qh, kh, vh = e4m3(q), e4m3(k), e4m3(v)
    assert torch.equal(_run(q, k, v, pol.replace(exact_inputs="v"), exp2=True), _run(qh, kh, v, hand, exp2=True))
    assert torch.equal(_run(q, k, v, pol.replace(exact_inputs="qk"), exp2=True), _run(q, k, vh, hand, exp2=True))


def test_exact_inputs_is_inert_by_default_and_checked():
    q, k, v = _qkv(2)
    base = parse_policy("bf16-mixed")
    assert base.exact_inputs == "" and base.knobs() == {} and "exact_inputs" not in base.to_dict()
    wide = base.replace(input=Format.FP64)
    assert torch.equal(_run(q, k, v, wide), _run(q, k, v, wide.replace(exact_inputs="qk")))  # nothing to keep
    assert parse_policy("sage1,exact_inputs=qk").exact_inputs == "qk"
    with pytest.raises(ValueError, match=r"exact_inputs 'k'.*qk, v"):
        parse_policy("sage1,exact_inputs=k")
    assert substages(base) == () and substages(parse_policy("fp16")) == ()


def test_explain_names_sage1s_dominant_substage():
    """Tiny case: sage1's error is its INT8 Q/K quantisation (V in fp16 and the fp16 P barely matter)."""
    spec = InputSpec(batch=1, heads=1, seq_len=64, head_dim=32)
    a = attribute(parse_policy("sage1"), spec, block_q=128, block_k=64, exp2=True)
    assert a.dominant == "input" and a.dominant_substage == "input:qk"
    assert a.dominant_words() == "Q/K quantisation (INT8 per-block, K smoothed)"
    assert a.sub_raised["input:qk"] < 0.2 * a.full < a.sub_raised["input:v"]
    assert a.sub_alone["input:qk"] > 5 * a.sub_alone["input:v"] > 0
    d = a.to_dict()
    assert d["dominant_substage"] == "input:qk" and d["substages"]["input:v"]["label"] == "V rounding to fp16"


def test_explain_cli_prints_the_substage_in_words(tmp_path):
    args = ["explain", "--preset", "sage1", "--seq-len", "64", "--heads", "1", "--head-dim", "32", "--out"]
    res = runner.invoke(app, [*args, str(tmp_path)])
    assert res.exit_code == 0, res.output
    first = next(line for line in res.output.splitlines() if "dominant stage" in line)
    assert "within it: Q/K quantisation (INT8 per-block, K smoothed)" in first
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["dominant_stage"] == "input" and data["dominant_substage"] == "input:qk"


def test_classic_attribution_has_no_substages():
    spec = InputSpec(batch=1, heads=1, seq_len=64, head_dim=16)
    a = attribute(parse_policy("bf16-mixed"), spec, block_k=32)
    assert a.sub_alone == a.sub_raised == {} and a.dominant_substage is None
    assert set(a.to_dict()) == {"policy", "metric", "full", "alone", "raised", "output_share", "dominant_stage"}
