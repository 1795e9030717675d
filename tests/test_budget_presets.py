"""The acceptance rule catches broken kernels; presets explain the real CPU kernel; attribution; doctor."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from flashcheck.backends.eager import eager_attention
from flashcheck.cli import app
from flashcheck.core.budget import check_budget, rounding_floor
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.metrics import rel_l2
from flashcheck.core.numerics import parse_policy, round_to
from flashcheck.kernels import flash_attention, reference_attention
from flashcheck.kernels.sim.presets import KERNEL_PRESETS, resolve
from flashcheck.measure.attribution import attribute
from flashcheck.testing import assert_attention_close

runner = CliRunner()


def sdpa(q, k, v, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def drops_last_key_block(q, k, v, causal=False):
    """A broken kernel: forgets the last 16 keys (a classic ragged-tile bug)."""
    return sdpa(q, k[..., :-16, :], v[..., :-16, :], causal=False)


def p_in_fp8(fmt):
    def kernel(q, k, v, causal=False):
        """A broken kernel: rounds P to fp8 before P·V."""
        out = flash_attention(
            q.double(), k.double(), v.double(), policy=f"bf16-mixed,p={fmt}", causal=causal, block_k=32
        )
        return out.to(q.dtype)

    return kernel


def sdpa_math(q, k, v, causal=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return sdpa(q, k, v, causal)


def test_budget_passes_real_and_simulated_kernels():
    q, k, v = make_qkv(InputSpec(batch=1, heads=4, seq_len=256, head_dim=64))
    ref = reference_attention(q, k, v)
    low = [t.bfloat16() for t in (q, k, v)]
    base = eager_attention(*low)
    assert check_budget(sdpa(*low), ref, base)
    assert check_budget(flash_attention(q, k, v, policy="bf16-mixed").bfloat16(), ref, base)


# P in e4m3 (3 mantissa bits) is within 2x of *plain bf16 PyTorch*, whose bf16 scores err as much; it is
# caught against a baseline that keeps fp32 softmax (SDPA math), as real kernels do. e5m2 is caught by both.
@pytest.mark.parametrize(
    "broken,baseline",
    [
        (drops_last_key_block, eager_attention),
        (p_in_fp8("fp8-e5m2"), eager_attention),
        (p_in_fp8("fp8-e4m3"), sdpa_math),
    ],
)
def test_budget_catches_broken_kernels(broken, baseline):
    q, k, v = make_qkv(InputSpec(batch=1, heads=4, seq_len=256, head_dim=64))
    ref = reference_attention(q, k, v)
    low = [t.bfloat16() for t in (q, k, v)]
    res = check_budget(broken(*low), ref, baseline(*low))
    assert not res and res.failed()[0].name in ("max", "mean")
    assert "FAIL" in res.message() and res.share_over > 0


def test_budget_fails_nan_and_reports_views():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    out = ref.clone().float()
    out[0, 0] = float("nan")
    res = check_budget(out, ref, ref.float(), rule="peers")
    assert not res and [c.name for c in res.failed()] == ["max", "mean", "nonfinite"]
    grid = torch.linspace(0.1, 0.9, 101, dtype=torch.float64)
    assert rounding_floor(grid, torch.bfloat16) > rounding_floor(grid, torch.float16) > 0
    with pytest.raises(ValueError, match="shapes differ"):
        check_budget(torch.zeros(2), torch.zeros(3), torch.zeros(2))


def test_pytest_helper_passes_and_fails_readably():
    assert_attention_close(sdpa, dtype=torch.bfloat16, shapes=((1, 2, 64, 32),), backward=True)
    assert_attention_close(
        lambda q, k, v, causal: flash_attention(q, k, v, policy="fp16-mixed", causal=causal).to(q.dtype),
        dtype=torch.float16,
        shapes=((1, 2, 96, 32),),
    )
    with pytest.raises(AssertionError, match=r"check\(s\) failed") as err:
        assert_attention_close(drops_last_key_block, shapes=((1, 2, 128, 32),), causal=(False,))
    assert "value/bound" in str(err.value) and "causal=False" in str(err.value)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("length", [128, 512, 1024])  # the kernel's three query tile sizes: 32, 64, 256
def test_torch_cpu_flash_preset_explains_the_real_kernel(fmt, length):
    q, k, v = make_qkv(InputSpec(batch=1, heads=4, seq_len=length, head_dim=64, seed=length))
    rounded = [round_to(t, fmt) for t in (q, k, v)]
    ref = reference_attention(*rounded)
    dtype = torch.bfloat16 if fmt == "bf16" else torch.float16
    real = rel_l2(sdpa(*(t.to(dtype) for t in rounded)), ref)
    sim = rel_l2(flash_attention(q, k, v, **resolve("torch-cpu-flash", fmt, length, length, 64, False)), ref)
    assert abs(sim / real - 1) < 0.25, f"sim {sim:.3e} vs real {real:.3e}"
    # and the standard simulator under the uniform policy does not: the preset's structure matters
    uniform = rel_l2(flash_attention(q, k, v, policy=fmt, block_k=512), ref)
    assert abs(uniform / real - 1) > 0.25


def test_presets_resolve_tiles_and_policies():
    assert resolve("torch-cpu-flash", "bf16", 100, 100, 64, False)["block_q"] == 32
    assert resolve("torch-cpu-flash", "bf16", 5000, 5000, 64, False)["block_q"] == 256
    fa2 = resolve("fa2-gpu", "fp16", 1024, 1024, 128, True)
    assert fa2["exp2"] and (fa2["block_q"], fa2["block_k"]) == (128, 64) and fa2["policy"].score.value == "fp32"
    fa3 = resolve("fa3-fp8", "fp8-e4m3", 1024, 1024, 128, False)
    assert (fa3["block_q"], fa3["block_k"]) == (128, 224) and fa3["policy"].hadamard
    with pytest.raises(ValueError, match="fp8"):
        resolve("fa3-fp8", "bf16", 64, 64, 64, False)
    assert {"torch-cpu-flash", "jax-xla", "jax-xla-fused", "fa2-gpu", "fa3-fp8"} <= set(KERNEL_PRESETS)


def test_attribution_finds_the_stage():
    spec = InputSpec(batch=1, heads=2, seq_len=128, head_dim=32)
    only_out = attribute(parse_policy("output=bf16"), spec, block_k=32)
    assert only_out.alone["output"] == only_out.full and only_out.raised["output"] < 1e-12
    assert only_out.output_share == 1.0 and only_out.dominant == "output"
    p8 = attribute(parse_policy("bf16-mixed,p=fp8-e4m3"), spec, block_k=32)
    assert p8.dominant == "p" and p8.alone["p"] > p8.alone["output"]
    mixed = attribute(parse_policy("bf16-mixed"), spec, block_k=32)
    assert mixed.alone["score"] < 1e-6 < mixed.alone["input"]  # fp32 stages barely matter


def test_explain_cli(tmp_path):
    res = runner.invoke(
        app,
        [
            "explain",
            "--preset",
            "torch-cpu-flash",
            "--numerics",
            "bf16",
            "--seq-len",
            "128",
            "--heads",
            "2",
            "--out",
            str(tmp_path),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["alone"]) == {"input", "score", "stats", "p", "accum", "output"}
    assert (tmp_path / "figures" / "explain.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["dominant_stage"] == data["dominant_stage"]
    bad = runner.invoke(app, ["explain", "--metric", "cosine", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "metric" in bad.output


def test_doctor_json():
    res = runner.invoke(app, ["doctor", "--json", "--seq-len", "256"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["torch"] == torch.__version__ and "determinism" in rep
    if not torch.cuda.is_available():
        assert rep["gpu"] is None and not rep["flash_attn"]["importable"]
        assert rep["flash_attn"]["python_tag"] == "cp311" or rep["flash_attn"]["python_tag"].startswith("cp3")
        assert any("CPU build" in p for p in rep["flash_attn"]["problems"])
        assert rep["sdpa_choice"]["kernel"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
    bad = runner.invoke(app, ["doctor", "--dtype", "fp8-e4m3"])
    assert bad.exit_code == 2
