"""`flashcheck judge FILE`: dumps written without torch, judged exactly as `compare --backend` judges the same
inputs and outputs; malformed (hostile) files refused with the reason and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.inputs import InputSpec, make_grad, make_mask, make_qkv
from flashcheck.measure.method import parse_method
from flashcheck.measure.runs import run_float64

runner = CliRunner()

NUMPY_ONLY_DUMP = """
import sys
import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(0)
q = rng.standard_normal((1, 4, 64, 32)).astype(np.float16)  # [B, H, L, D]
k, v = (rng.standard_normal((1, 2, 64, 32)).astype(np.float16) for _ in range(2))  # 2 K/V heads (GQA)
s = q.astype(np.float32) @ np.repeat(k, 2, axis=1).astype(np.float32).transpose(0, 1, 3, 2) * 0.125
s += np.where(np.tril(np.ones((64, 64), bool)), 0, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
out = (p / p.sum(-1, keepdims=True)) @ np.repeat(v, 2, axis=1).astype(np.float32)
save_file({"q": q, "k": k, "v": v, "out.mine": out.astype(np.float16)}, sys.argv[1],
          metadata={"causal": "true", "scale": "0.125"})
assert "torch" not in sys.modules
"""


def _judge(path, *flags):
    return runner.invoke(app, ["judge", str(path), *flags])


def test_a_dump_written_with_numpy_alone_is_judged(tmp_path):
    path = tmp_path / "dump.safetensors"
    subprocess.run([sys.executable, "-c", textwrap.dedent(NUMPY_ONLY_DUMP), str(path)], check=True)
    res = _judge(path)
    assert res.exit_code == 0, res.output
    assert "out.mine" in res.output and "fp16" in res.output and "eager:fp16" in res.output and "pass" in res.output
    head = res.output.splitlines()[0]
    assert head.endswith(
        "B=1 H=4 Hkv=2 Lq=64 D=32, judged in fp16 (baseline eager PyTorch in fp16), scale 0.125, causal"
    )
    data = json.loads(_judge(path, "--json").output)
    cfg = data["config"]
    assert (cfg["heads"], cfg["kv_heads"], cfg["causal"], cfg["scale"], cfg["numerics"]) == (4, 2, True, 0.125, "fp16")
    assert data["budget"]["passed"] and 0 < data["candidate"]["max_abs"] < 1e-2


def _bf16_bits(x: torch.Tensor) -> np.ndarray:
    """A float64 tensor of bf16 values as numpy bf16 (ml_dtypes), without rounding anything."""
    import ml_dtypes

    return x.to(torch.float32).numpy().astype(ml_dtypes.bfloat16)


def _compare_json(*flags):
    res = runner.invoke(app, ["compare", "--backend", "sdpa-math", "--numerics", "bf16", "--json", *flags])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_judge_reproduces_compares_numbers_for_sdpa_math(tmp_path, suffix):
    """sdpa-math's bf16 output on compare's inputs (GQA, causal, left padding), with its gradients for compare's
    dO, dumped to a file: judge prints compare's errors, ratios, budgets and gradients, to the bit."""
    from safetensors.numpy import save_file

    flags = ["--seq-len", "96", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--batch", "2", "--causal"]
    flags += ["--padding", "left:0.25", "--seed", "3"]
    want = _compare_json(*flags)
    spec = InputSpec(batch=2, heads=4, kv_heads=2, seq_len=96, head_dim=32, padding="left:0.25", seed=3)
    q, k, v = make_qkv(spec)
    mask = make_mask(spec)
    m = parse_method("sdpa-math:bf16")
    b = m.backend()
    out, _ = run_float64(lambda *t: b.run(*t, device="cpu", causal=True, mask=mask), m.prepare(q, k, v))
    arrays = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "mask": mask.numpy()}
    if suffix == ".safetensors":
        save_file({**arrays, "out": _bf16_bits(out)}, str(tmp_path / "d.safetensors"), metadata={"causal": "true"})
    else:  # npz has no bf16: the values in float32, the format as a setting
        np.savez(tmp_path / "d.npz", **arrays, out=out.float().numpy(), causal=np.array(True), dtype=np.array("bf16"))
    got = json.loads(_judge(tmp_path / f"d{suffix}", "--json", "--rule", "peers").output)
    for key in ("candidate", "baseline", "ratio", "vs_rounded_inputs", "budget", "baseline_impl"):
        assert got[key] == want[key], key


def test_judge_reproduces_compares_gradients(tmp_path):
    from safetensors.numpy import save_file

    want = _compare_json("--seq-len", "64", "--heads", "2", "--head-dim", "16", "--backward", "--causal")
    spec = InputSpec(heads=2, seq_len=64, head_dim=16)
    q, k, v = make_qkv(spec)
    do = make_grad(q.shape, spec.seed)
    m = parse_method("sdpa-math:bf16")
    out, g = run_float64(m.runner(causal=True), m.prepare(q, k, v), do)
    arrays = {"q": q, "k": k, "v": v, "out": out, "grad_out": do, "dq": g[0], "dk": g[1], "dv": g[2]}
    save_file({n: _bf16_bits(t) if n in ("out", "dq", "dk", "dv") else t.numpy() for n, t in arrays.items()},
              str(tmp_path / "g.safetensors"), metadata={"causal": "1"})  # fmt: skip
    got = json.loads(_judge(tmp_path / "g.safetensors", "--json", "--rule", "peers").output)
    assert got["candidate"] == want["candidate"] and got["budget"] == want["budget"]
    assert got["grad"] == want["grad"]
    res = _judge(tmp_path / "g.safetensors")
    assert "dq:ok dk:ok dv:ok" in res.output


def test_over_budget_exits_1_and_several_outputs_each_get_a_row(tmp_path):
    q, k, v = make_qkv(InputSpec(heads=2, seq_len=64, head_dim=16))
    good = parse_method("sdpa-math:fp16").run(q, k, v)
    bad = good.clone()
    bad[0, 0, 5] += 0.05  # one row off by far more than fp16 rounds
    np.savez(tmp_path / "two.npz", q=q.half().numpy(), k=k.half().numpy(), v=v.half().numpy(),
             **{"out.good": good.half().numpy(), "out.bad": bad.half().numpy()})  # fmt: skip
    res = _judge(tmp_path / "two.npz")
    assert res.exit_code == 1, res.output
    rows = {line.split()[1]: line for line in res.output.splitlines() if "out." in line}
    assert "pass" in rows["out.good"] and "FAIL" in rows["out.bad"]


def test_a_one_percent_gain_error_fails_flashcheck_rule_and_passes_the_peers(tmp_path):
    """out = 1.01 x a correct bf16 output: the peers' max test (k=2) lets it through, judge's default rule
    (flashcheck: the bias and row views) fails it; --rule names the rule in the table's heading."""
    from safetensors.numpy import save_file

    q, k, v = make_qkv(InputSpec(heads=2, seq_len=64, head_dim=16))
    m = parse_method("sdpa-math:bf16")
    out, _ = run_float64(m.runner(), m.prepare(q, k, v))
    gained = (out * 1.01).to(torch.bfloat16).double()
    save_file(
        {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "out": _bf16_bits(gained)}, str(tmp_path / "g.safetensors")
    )
    peers = _judge(tmp_path / "g.safetensors", "--rule", "peers")
    assert peers.exit_code == 0 and "pass" in peers.output and "the peers' rule" in peers.output, peers.output
    res = _judge(tmp_path / "g.safetensors")
    assert res.exit_code == 1 and "FAIL" in res.output and "flashcheck's rule" in res.output, res.output
    data = json.loads(_judge(tmp_path / "g.safetensors", "--json").output)
    assert data["budget"]["rule"] == "flashcheck" and not data["budget"]["passed"]
    failed = {c["name"] for c in data["budget"]["checks"] if not c["passed"]}
    assert failed & {"bias", "row"}, data["budget"]
    bad = _judge(tmp_path / "g.safetensors", "--rule", "strict")
    assert bad.exit_code == 2 and "'strict'" in bad.output and "peers, flashcheck" in bad.output, bad.output


def _good_arrays():
    q, k, v = (t.float().numpy() for t in make_qkv(InputSpec(heads=2, seq_len=32, head_dim=16)))
    return {"q": q, "k": k, "v": v, "out": q.copy()}


def _malformed(tmp_path, case):
    a = _good_arrays()
    path = tmp_path / "bad.npz"
    if case == "missing":
        del a["v"]
    elif case == "shape":
        a["out"] = a["out"][:, :, :16]
    elif case == "int":
        a["out"] = a["out"].astype(np.int32)
    elif case == "bf16 in npz":
        import ml_dtypes

        a["out"] = a["out"].astype(ml_dtypes.bfloat16)
    elif case == "object":
        a["out"] = np.array([object()], dtype=object)
    elif case == "unknown name":
        a["Q"] = a["q"]
    elif case == "scale":
        a["scale"] = np.array(-1.0)
    elif case == "dtype":
        a["dtype"] = np.array("fp8-e4m3")
    elif case == "grads":
        a["dq"] = a["q"]
    np.savez(path, **a)
    if case == "lying header":  # the npy header of q claims 1000x more rows than its data holds
        import zipfile

        with zipfile.ZipFile(path) as z:
            members = {n: z.read(n) for n in z.namelist()}
        members["q.npy"] = members["q.npy"].replace(b"(1, 2, 32, 16)", b"(1, 2, 32000, 16)", 1)
        with zipfile.ZipFile(path, "w") as z:
            for n, data in members.items():
                z.writestr(n, data)
    if case == "not npy":  # a zip member that is no .npy file (a torch .pt renamed .npz is such a zip)
        import zipfile

        with zipfile.ZipFile(path, "a") as z:
            z.writestr("extra", b"hello")
    return path


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("missing", "misses tensor(s) v"),
        ("not npy", "member 'extra' is not a .npy array"),
        ("shape", "tensor 'out' has shape (1, 2, 16, 16); expected"),
        ("int", "unknown dtype int32"),
        ("bf16 in npz", "store the values as float32 and set dtype='bf16'"),
        ("object", "allow_pickle=False"),
        ("lying header", "but its header's shape [1, 2, 32000, 16] of float32 needs"),
        ("unknown name", "unknown name(s) 'Q'"),
        ("scale", "scale '-1.0' is not allowed"),
        ("dtype", "unknown dtype 'fp8-e4m3'"),
        ("grads", "need grad_out"),
    ],
)
def test_malformed_npz_exits_2_with_the_reason(tmp_path, case, reason):
    res = _judge(_malformed(tmp_path, case))
    assert res.exit_code == 2 and reason in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def _safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


@pytest.mark.parametrize(
    ("header", "data", "reason"),
    [
        ({"q": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype 'I32'"),
        ({"q": {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [0, 4]}}, b"\0" * 4, "do not hold shape"),
        ({"q": {"dtype": "F32", "shape": [1], "data_offsets": [0, 2**40]}}, b"\0" * 4, "do not hold shape"),
        ({"q": {"dtype": "F32", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 4]}}, b"\0" * 4, "at most 4"),
        ({"__metadata__": {"scale": 1}}, b"", "__metadata__ must map names to strings"),
    ],
)
def test_hostile_safetensors_headers_are_refused_before_reading(tmp_path, header, data, reason):
    path = tmp_path / "h.safetensors"
    path.write_bytes(_safetensors_bytes(header, data))
    res = _judge(path)
    assert res.exit_code == 2 and reason in res.output and "Traceback" not in res.output, res.output


def test_header_length_past_the_file_and_other_file_types_are_refused(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes((2**62).to_bytes(8, "little") + b"{}")
    assert "header length" in _judge(path).output
    (tmp_path / "x.pt").write_bytes(b"\x80\x02")  # a pickle is never opened
    res = _judge(tmp_path / "x.pt")
    assert res.exit_code == 2 and "expected .safetensors or .npz" in res.output
    assert "is not a file" in _judge(tmp_path / "none.npz").output


def test_a_zip_member_bigger_than_allowed_is_refused_before_inflating(tmp_path):
    from flashcheck.measure.dumpfile import DumpError, read_dump

    path = tmp_path / "big.npz"
    np.savez_compressed(path, q=np.zeros((1, 1, 512, 512), np.float32))  # 1 MiB inflated, a few KiB on disk
    with pytest.raises(DumpError, match="more than the 100000 bytes a dump may take here"):
        read_dump(path, max_bytes=100_000)


def test_a_small_file_naming_a_long_sequence_is_refused_before_computing(tmp_path, monkeypatch):
    import flashcheck.kernels.sim.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)  # 1 MiB free
    q = np.zeros((1, 1, 2048, 1), np.float16)
    np.savez(tmp_path / "long.npz", q=q, k=q, v=q, out=q)
    res = _judge(tmp_path / "long.npz")
    assert res.exit_code == 2 and "needs about" in res.output and "Traceback" not in res.output, res.output


def test_a_header_nested_500000_levels_deep_is_one_line_exit_2(tmp_path):
    """json.loads raises RecursionError on such a header (a traceback, exit 1): the nesting is bounded first."""
    raw = b"[" * 500_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    res = _judge(path)
    assert res.exit_code == 2 and "nests brackets more than" in res.output and "Traceback" not in res.output, res.output
