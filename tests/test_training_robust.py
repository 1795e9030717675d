"""train-study and drift under faults: a run killed at every write resumes bit-identically; malformed
safetensors headers, NaN/Inf weights and bad numbers are named (exit 2 / exit 1); sharded checkpoints
read as one; progress; the human (non --json) output of both commands."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import audited_figures
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.training import train as train_mod
from flashcheck.training.checkpoints import CheckpointError, open_checkpoint, save_safetensors, series
from flashcheck.training.drift import check_limits, compare_checkpoints, compare_series
from flashcheck.training.experiments import train_preset, train_runs
from flashcheck.training.model import GPTConfig
from flashcheck.training.train import RunConfig, run_complete, train

pytestmark = pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules

runner = CliRunner()
TINY = GPTConfig(vocab=32, seq_len=32, layers=1, heads=2, dim=32)
CFG = RunConfig(name="r", attention="flash:bf16-mixed", steps=4, save_every=2, batch=2, model=TINY)


@pytest.fixture(autouse=True)
def _torch_globals():
    """train() sets one thread and deterministic algorithms for its process; give the test process back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def _row(output: str, *cells: str) -> bool:
    """Whether a table row starts with these cells (rich's box characters between them)."""
    pattern = r"^[│|]\s*" + r"\s*[│|]\s*".join(map(re.escape, cells)) + r"\s*[│|]"
    return re.search(pattern, output, flags=re.M) is not None


# ---- train-study: killed at any write, resumed bit-identically ----------------------------------------


class Killed(BaseException):
    """Stands for SIGKILL: nothing after the kill point runs (a BaseException, so no handler catches it)."""


def _fingerprint(run_dir: Path) -> dict:
    """Every file of a finished run, tensors by value (bit-exact), JSON by content; no temporary files. The
    completion marker's CPU time (a measurement of this machine, not a result) is checked and left out."""
    out = {}
    for p in sorted(run_dir.rglob("*")):
        rel = p.relative_to(run_dir).as_posix()
        if p.is_dir() or p.name == ".lock":
            continue
        assert not p.name.startswith("."), f"leftover temporary file {rel}"
        if p.suffix == ".pt":
            obj = torch.load(p, weights_only=True)  # every file train() writes loads without unpickling code
            out[rel] = _flat(obj)
        else:
            out[rel] = json.loads(p.read_text())
        if rel == "complete.json":
            assert out[rel].pop("cpu_seconds") >= 0 and out[rel].pop("steps_timed") >= 0
    return out


def _flat(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    if isinstance(obj, list | tuple):
        return {k: v for i, val in enumerate(obj) for k, v in _flat(val, f"{prefix}{i}.").items()}
    if isinstance(obj, torch.Tensor):
        return {prefix: (obj.dtype, tuple(obj.shape), obj.view(-1).view(torch.uint8).tolist())}  # the bits
    return {prefix: obj}


def _writes(monkeypatch, kill_at: int | None = None, torn: bool = False) -> list[str]:
    """Record train()'s file writes in order; with kill_at, the write of that index is made (or, torn,
    only a partial temporary file of it is left) and then the process 'dies'."""
    log: list[str] = []
    real_torch, real_text = train_mod.save_torch, train_mod.write_atomic

    def step(path: Path, write) -> None:
        log.append(Path(path).name)
        if kill_at is not None and len(log) - 1 == kill_at:
            if torn:
                Path(path).with_name(f".{Path(path).stem}.dead0000beef.tmp{Path(path).suffix}").write_bytes(b"PK\x03")
                raise Killed
            write()
            raise Killed
        write()

    monkeypatch.setattr(train_mod, "save_torch", lambda obj, path: step(path, lambda: real_torch(obj, path)))
    monkeypatch.setattr(train_mod, "write_atomic", lambda path, data: step(path, lambda: real_text(path, data)))
    return log


def test_run_killed_at_every_write_resumes_bit_identically(tmp_path, monkeypatch):
    """A kill while write k is under way leaves writes 0..k-1 and a partial temporary file (torn); a kill
    after the last write leaves a complete run. Every such state resumes to the uninterrupted run's bits."""
    data = train_mod.load_data(CFG)
    log = _writes(monkeypatch)
    reference = train(CFG, tmp_path / "ref", data)
    monkeypatch.undo()
    assert log == [
        "config.json",
        "step_000000.pt",
        "step_000002.pt",
        "state.pt",
        "step_000004.pt",
        "state.pt",
        "losses.json",  # the kill point: the last weights file is on disk, losses.json is not
        "complete.json",
    ]
    expected = _fingerprint(tmp_path / "ref")
    for k, torn in [*((k, True) for k in range(len(log))), (len(log) - 1, False)]:
        run_dir = tmp_path / f"kill{k}{'torn' if torn else ''}"
        _writes(monkeypatch, kill_at=k, torn=torn)
        with pytest.raises(Killed):
            train(CFG, run_dir, data)
        monkeypatch.undo()
        assert run_complete(run_dir, CFG) == (not torn)
        resumed = train(CFG, run_dir, data)
        assert resumed["losses"] == reference["losses"], (k, torn)
        assert _fingerprint(run_dir) == expected, (k, torn)
    (run_dir / "losses.json").unlink()  # deleted by hand: not complete any more, rebuilt from state.pt
    assert not run_complete(run_dir, CFG)
    assert train(CFG, run_dir, data)["losses"] == reference["losses"] and _fingerprint(run_dir) == expected


@pytest.mark.slow
def test_train_study_resumes_after_a_kill_between_last_weights_and_losses(tmp_path, monkeypatch, tiny_train_study_run):
    """The issue's case through the CLI: run `base` has its last weights and state but no losses.json. The
    uninterrupted reference is the session's (conftest.tiny_train_study_run: the same command, human output);
    its other runs, finished, are copied beside the killed one (a study killed in its last run), so the rerun
    resumes `base` alone (test_training's killed_train_study computes every run twice)."""
    study = train_preset("tiny")
    base = next(r for r in study.runs if r.name == "base-s0")
    out, ref = tmp_path / "killed", tiny_train_study_run.folder
    _writes(monkeypatch, kill_at=6)  # losses.json: see the order above
    with pytest.raises(Killed):
        train(base, out / "runs" / "base-s0")
    monkeypatch.undo()
    assert (out / "runs" / "base-s0" / "weights" / f"step_{base.steps:06d}.pt").exists()
    assert not (out / "runs" / "base-s0" / "losses.json").exists()
    for run in study.runs:
        if run.name != base.name:
            shutil.copytree(ref / "runs" / run.name, out / "runs" / run.name)
    args = ["train-study", "--preset", "tiny", "--out", str(out), "--workers", "2", "--quiet"]
    with audited_figures(save=False):  # no PNG of this study is read: audited, not rendered
        res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    res = tiny_train_study_run
    assert res.exit_code == 0 and "Traceback" not in res.output and not res.crashed, res.output
    _check_train_study_human(res, ref)
    a, b = (json.loads((o / "summary.json").read_text()) for o in (out, ref))
    assert a["pairs"] == b["pairs"] and a["ratios"] == b["ratios"] and a["final_loss"] == b["final_loss"]
    for run in study.runs:
        assert _fingerprint(out / "runs" / run.name) == _fingerprint(ref / "runs" / run.name), run.name


class _Planted:
    """A pickle payload: unpickling it calls open(marker, "w"), i.e. runs code of the file's author."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_planted_state_pt_runs_nothing_and_is_one_line_exit_2(tmp_path):
    """A crafted state.pt in a run folder without complete.json: re-running the study must not unpickle
    its objects (weights_only=True); the user sees one error line naming the file, exit 2."""
    study = train_preset("tiny")
    out, marker = tmp_path / "out", tmp_path / "code-ran"
    for run in study.runs:  # every run, so whichever the worker starts first meets one
        (out / "runs" / run.name).mkdir(parents=True)
        torch.save({"step": _Planted(marker), "losses": []}, out / "runs" / run.name / "state.pt")
    res = runner.invoke(app, ["train-study", "--preset", "tiny", "--out", str(out), "--workers", "1", "--quiet"])
    assert not marker.exists(), "unpickling state.pt ran the planted code"
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and "state.pt" in lines[0] and "nothing in it was run" in lines[0], lines
    # the refused global is named, and torch's advice to load with weights_only=False is not passed on
    assert "io.open" in lines[0] and "weights_only" not in lines[0], lines


def test_a_planted_pickle_given_to_drift_runs_nothing_and_names_what_was_refused(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"w": _Planted(marker)}, tmp_path / "evil.pt")
    res = runner.invoke(app, ["drift", str(tmp_path / "evil.pt"), str(tmp_path / "evil.pt")])
    assert not marker.exists(), "unpickling evil.pt ran the planted code"
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "io.open" in res.output and "nothing in it was run" in res.output, res.output
    assert "weights_only" not in res.output, res.output
    with open(tmp_path / "raw.pt", "wb") as f:  # a raw pickle (no torch.save zip): torch warns before it refuses
        pickle.dump({"w": _Planted(marker)}, f, protocol=4)
    res = subprocess.run([sys.executable, "-m", "flashcheck.cli", "drift", str(tmp_path / "raw.pt"),
                          str(tmp_path / "raw.pt")], capture_output=True, text=True)  # fmt: skip
    assert not marker.exists() and res.returncode == 2, res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "nothing in it was run" in lines[0], lines


def _check_train_study_human(res, out: Path) -> None:
    """Human output (tiny: the smoke-test note and no verdict), a row per ratio and per pair and seed, the
    report line; progress on stderr."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == [] and f"no verdicts: {summary['note']}" in res.stdout.splitlines()
    assert not re.search(r": (holds|does not hold|inconclusive) — ", res.stdout), res.stdout
    for name, r in summary["ratios"].items():
        assert _row(res.stdout, name, f"{r['value']:.3g}", "no interval", "1"), res.stdout
    for name, p in summary["pairs"].items():
        for seed, c in p["seeds"].items():
            lo, hi = c["fit"]["window"]
            cells = (name, seed, f"{c['wasserstein'][-1]:.3e}", f"{c['max_abs'][-1]:.3e}", f"{c['fit']['slope']:+.3e}")
            assert _row(res.stdout, *cells) and f"steps {lo}-{hi}" in res.stdout, res.stdout
    assert f"report: {out}/report.html" in res.stdout
    total = sum(r.steps for r in train_preset("tiny").runs)
    lines = res.stderr.splitlines()
    last = max(i for i, x in enumerate(lines) if x.startswith("train-study "))
    assert re.fullmatch(rf"train-study {total}/{total}, \d+ s, run [\w-]+ step \d+", lines[last]), lines
    parts = len(train_preset("tiny").pairs) + 1  # the analysis after training has its own progress
    assert all(x.startswith("analysis ") for x in lines[last + 1 :]), lines
    assert re.fullmatch(rf"analysis {parts}/{parts}, \d+ s, report written", lines[-1]), lines


def test_tied_max_human_output_and_progress(tmp_path, monkeypatch):
    """`--preset tied-max` at a small size (the preset's own size takes minutes)."""
    import functools

    from flashcheck.training import tied_max

    small = functools.partial(tied_max.tied_max_report, seq_len=32, heads=2, head_dim=16)
    monkeypatch.setattr(tied_max, "tied_max_report", small)
    res = runner.invoke(app, ["train-study", "--preset", "tied-max", "--out", str(tmp_path), "--steps", "4"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    ids = ["tied_max_bias", "tied_max_sign", "delta_fp32_fix", "max_adjust_fix"]
    assert [f["id"] for f in summary["findings"]] == ids and summary["seeds"] == 3
    for f in summary["findings"]:
        line = f"{f['id']}: {f['status']} — {f['claim']}. Measured: {f['measured']}"  # the claim, as study prints it
        assert f["claim"] and line in res.stdout.splitlines(), res.stdout
        assert "99th percentile of the untied control" in f["measured"]
    assert f"report: {tmp_path}/report.html, report.md, summary.json" in res.stdout
    assert re.fullmatch(r"train-study 24/24, \d+ s, untied control seed 2", res.stderr.splitlines()[-1]), res.stderr
    res = runner.invoke(app, ["train-study", "--preset", "tied-max", "--out", str(tmp_path), "--lr", "0.1"])
    assert res.exit_code == 2 and "--lr not allowed with --preset tied-max" in res.output


def test_run_folder_of_another_configuration_or_in_use_is_refused(tmp_path):
    train(CFG, tmp_path / "r")
    other = dataclasses.replace(CFG, lr=1e-2)
    with pytest.raises(ValueError, match=r"another configuration \(lr differ\)"):
        train(other, tmp_path / "r")
    longer = dataclasses.replace(CFG, steps=6)
    assert train(longer, tmp_path / "r")["resumed_from"] == 4  # more steps: extends the run
    assert json.loads((tmp_path / "r" / "config.json").read_text())["steps"] == 6
    with pytest.raises(ValueError, match="trained to step 6, past steps=4"):
        train(CFG, tmp_path / "r")
    fd = os.open(tmp_path / "r" / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"4242\n", 0)
        with pytest.raises(ValueError, match=r"in use by another process \(PID 4242\)"):
            train(longer, tmp_path / "r")
    finally:
        os.close(fd)
    res = runner.invoke(app, ["train-study", "--preset", "tiny", "--out", ""])
    assert res.exit_code == 2 and "--out '' is empty" in res.output


def test_train_runs_progress_counts_every_step(tmp_path):
    runs = train_preset("tiny").runs[:2]
    seen: list[tuple[int, int, str]] = []
    train_runs(runs, tmp_path, workers=2, on_progress=lambda d, t, n: seen.append((d, t, n)))
    assert all(run_complete(tmp_path / "runs" / r.name, r) for r in runs)
    total = sum(r.steps for r in runs)
    assert seen and all(t == total for _, t, _ in seen) and seen[-1][0] == total
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    assert all(re.fullmatch(r"run (base|flash)-s0 step \d+", n) for _, _, n in seen)


# ---- drift: malformed safetensors headers ------------------------------------------------------------


def _st(path: Path, header, data: bytes = b"", raw: bytes | None = None) -> Path:
    head = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
MALFORMED = [
    ("list", [{"w": F32x2}], b"", "the header is a JSON list"),
    ("no_offsets", {"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "tensor 'w': entry lacks data_offsets"),
    ("reversed", {"w": {**F32x2, "data_offsets": [8, 0]}}, b"\0" * 8, "tensor 'w': data_offsets [8, 0] are reversed"),
    ("shape", {"w": {**F32x2, "shape": [3]}}, b"\0" * 8, "tensor 'w': shape [3] of F32 needs 12 bytes"),
    ("truncated", {"w": F32x2}, b"\0" * 4, "tensor 'w': data_offsets [0, 8] pass the end of the data (4 bytes)"),
    ("gap", {"w": F32x2, "v": {**F32x2, "data_offsets": [12, 20]}}, b"\0" * 20, "tensor 'v': data_offsets [12, 20]"),
    ("dtype", {"w": {**F32x2, "dtype": "Q7"}}, b"\0" * 8, "tensor 'w': unknown dtype 'Q7'"),
    ("negative", {"w": {**F32x2, "shape": [-2]}}, b"\0" * 8, "tensor 'w': shape [-2]"),
    ("entry_list", {"w": [0, 8]}, b"\0" * 8, "tensor 'w': entry is a JSON list"),
    ("metadata", {"__metadata__": {"a": 1}, "w": F32x2}, b"\0" * 8, "__metadata__ must map names to strings"),
    ("trailing", {"w": F32x2}, b"\0" * 12, "4 bytes of data after the last tensor"),
    ("not_json", None, b"", "the header is not JSON"),
    ("header_len", None, b"", "does not fit the file"),
    ("empty", None, b"", "shorter than the 8-byte header length"),
]


@pytest.mark.parametrize(("case", "header", "data", "needle"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_safetensors_exit_2_naming_file_and_tensor(tmp_path, case, header, data, needle):
    from safetensors import SafetensorError, safe_open

    path = tmp_path / f"{case}.safetensors"
    if case == "not_json":
        _st(path, None, raw=b"{not json")
    elif case == "header_len":
        path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    elif case == "empty":
        path.write_bytes(b"")
    else:
        _st(path, header, data)
    with pytest.raises(SafetensorError), safe_open(str(path), framework="pt"):  # the library rejects it too
        pass
    good = tmp_path / "good.safetensors"
    save_safetensors({"w": torch.ones(2)}, good)
    for args in ([str(path), str(good)], [str(good), str(path)], [str(path), str(good), "--json"]):
        res = runner.invoke(app, ["drift", *args])
        assert res.exit_code == 2, (case, res.output)
        assert "Traceback" not in res.output
        line = res.output.strip().splitlines()[-1]
        assert line.startswith(f"error: {str(path)!r} is not a valid safetensors file") and needle in line, line


def test_valid_edge_case_safetensors_are_read(tmp_path):
    """What the validation must not reject: scalars, empty tensors, fp8, metadata, bf16 (our writer's output
    read back by the library)."""
    from safetensors.torch import save_file

    t = {
        "scalar": torch.tensor(3.0),
        "empty": torch.zeros(0, 4),
        "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
        "bf": torch.tensor([1.5, 2.5], dtype=torch.bfloat16),
    }
    save_file(t, tmp_path / "lib.safetensors", metadata={"format": "pt"})
    save_safetensors({k: v for k, v in t.items() if k != "f8"}, tmp_path / "ours.safetensors")
    r = compare_checkpoints(tmp_path / "lib.safetensors", tmp_path / "ours.safetensors")
    assert r.mismatches["only_in_a"] == ["f8"] and set(r.per_tensor) == {"scalar", "bf"} and r.max_abs == 0
    reader = open_checkpoint(tmp_path / "lib.safetensors")
    assert reader.keys()["f8"] == ((2,), torch.float8_e4m3fn)
    assert torch.equal(reader.tensor("bf"), t["bf"]) and reader.tensor("f8").float().tolist() == [0.5, -2.0]


def test_safetensors_missing_or_too_old_is_a_clear_error(tmp_path, monkeypatch):
    import sys
    import types

    save_safetensors({"w": torch.ones(2)}, tmp_path / "a.safetensors")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # not installed
    res = runner.invoke(app, ["drift", str(tmp_path / "a.safetensors"), str(tmp_path / "a.safetensors")])
    assert res.exit_code == 2 and "needs the safetensors package (>= 0.8)" in res.output, res.output
    old = types.ModuleType("safetensors")
    old.__version__ = "0.4.5"
    old.safe_open = lambda filename, framework, device="cpu": None  # no backend= before 0.8
    monkeypatch.setitem(sys.modules, "safetensors", old)
    with pytest.raises(CheckpointError, match=r"safetensors 0\.4\.5 is too old"):
        open_checkpoint(tmp_path / "a.safetensors")


# ---- drift: NaN / Inf, bad numbers -------------------------------------------------------------------


def test_nonfinite_weights_are_counted_and_fail_loudly(tmp_path):
    g = torch.Generator().manual_seed(0)
    a = {"blocks.0.w": torch.randn(100, generator=g), "blocks.1.w": torch.randn(50, generator=g), "head": torch.ones(3)}
    b = {k: v + 0.25 for k, v in a.items()}
    b["blocks.0.w"][[3, 7, 9]] = torch.tensor([math.nan, math.inf, -math.inf])
    a["head"][0] = math.nan
    save_safetensors(a, tmp_path / "a.safetensors")
    save_safetensors(b, tmp_path / "b.safetensors")
    r = compare_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert r.nonfinite == {"blocks.0.w": {"a": 0, "b": 3, "numel": 100}, "head": {"a": 1, "b": 0, "numel": 3}}
    assert (
        set(r.per_tensor) == {"blocks.1.w"}
        and r.max_abs == pytest.approx(0.25)
        and r.wasserstein == pytest.approx(0.25)
    )
    res = runner.invoke(app, ["drift", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    err = res.stderr.strip().splitlines()[-1]
    assert (
        err.startswith("error: NaN/Inf weights")
        and "blocks.0.w (A: 0, B: 3 of 100)" in err
        and "head (A: 1, B: 0 of 3)" in err
    )
    assert _row(res.stdout, "0", "1", "2.500e-01", "2.500e-01"), res.stdout  # 1 tensor measured
    res = runner.invoke(app, ["drift", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["pairs"][0]["nonfinite"]["head"] == {
        "a": 1,
        "b": 0,
        "numel": 3,
    }
    save_safetensors({"w": torch.full((4,), math.nan)}, tmp_path / "n.safetensors")
    res = runner.invoke(app, ["drift", str(tmp_path / "n.safetensors"), str(tmp_path / "n.safetensors"), "--json"])
    out = json.loads(res.stdout)["pairs"][0]
    assert res.exit_code == 1 and out["max_abs"] is None and out["wasserstein"] is None and "NaN" not in res.stdout


def test_chunked_scans_do_not_depend_on_the_chunk_size(tmp_path, monkeypatch):
    """Big tensors are scanned in chunks (no full-size temporaries): a chunk of 7 values must give what
    one chunk gives, NaN counts included (a tensor of several chunks was once counted wrongly)."""
    from flashcheck.training import drift

    g = torch.Generator().manual_seed(3)
    a = {"blocks.0.w": torch.randn(100, generator=g), "blocks.1.w": torch.randn(37, generator=g), "x": torch.ones(50)}
    b = {k: v * 1.5 + 0.1 for k, v in a.items()}
    b["x"][[5, 20, 49]] = torch.tensor([math.nan, math.inf, math.nan])
    save_safetensors(a, tmp_path / "a.safetensors")
    save_safetensors(b, tmp_path / "b.safetensors")
    runs = []
    for chunk in (drift.CHUNK, 7):
        monkeypatch.setattr(drift, "CHUNK", chunk)
        for kw in ({}, {"exact_limit": 10, "sketch_points": 8}):
            runs.append(compare_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors", **kw))
    for one, chunked in ((runs[0], runs[2]), (runs[1], runs[3])):
        assert chunked.nonfinite == one.nonfinite == {"x": {"a": 0, "b": 3, "numel": 50}}
        assert chunked.max_abs == one.max_abs and chunked.method == one.method
        assert chunked.wasserstein == pytest.approx(one.wasserstein, rel=1e-12)
        assert chunked.wasserstein_bound == pytest.approx(one.wasserstein_bound, rel=1e-12)
        for name, m in one.per_tensor.items():
            assert chunked.per_tensor[name]["wasserstein"] == pytest.approx(m["wasserstein"], rel=1e-12)
    assert runs[1].wasserstein_bound > 0  # the sketch path ran


BAD_NUMBERS = [
    ["--exact-limit", "-5"],
    ["--exact-limit", "-1"],
    ["--exact-limit", "1e3"],
    ["--exact-limit", "abc"],
    ["--exact-limit", ""],
    ["--sketch-points", "0"],
    ["--sketch-points", "-3"],
    ["--sketch-points", "2.5"],
    ["--sketch-points", "nan"],
]


@pytest.mark.parametrize("flags", BAD_NUMBERS, ids=[" ".join(f) for f in BAD_NUMBERS])
def test_drift_bad_numbers_exit_2(tmp_path, flags):
    save_safetensors({"w": torch.ones(2)}, tmp_path / "a.safetensors")
    res = runner.invoke(app, ["drift", str(tmp_path / "a.safetensors"), str(tmp_path / "a.safetensors"), *flags])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert flags[0] in res.output


def test_drift_limits_in_the_library_and_empty_paths():
    for kw in ({"sketch_points": 0, "exact_limit": 1}, {"sketch_points": 4, "exact_limit": -5}):
        with pytest.raises(ValueError, match="is not allowed"):
            check_limits(**kw)
    with pytest.raises(ValueError, match="exact_limit=-5"):
        compare_series("a", "b", exact_limit=-5)
    res = runner.invoke(app, ["drift", "", "x"])
    assert res.exit_code == 2 and "checkpoint A '' is empty" in res.output


# ---- drift: sharded checkpoints ----------------------------------------------------------------------


def _gpt2(seed: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


@pytest.fixture(scope="module")
def hf_saves(tmp_path_factory):
    """A tiny GPT-2 saved by transformers whole and in 4 shards (with the index), and a copy changed in
    shard 1 only."""
    root = tmp_path_factory.mktemp("hf")
    model = _gpt2(0)
    model.save_pretrained(root / "whole")
    model.save_pretrained(root / "sharded", max_shard_size="40KB")
    index = json.loads((root / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    first = sorted(name for name, shard in index.items() if shard.startswith("model-00001-of-"))[0]
    with torch.no_grad():
        dict(model.named_parameters())[first].add_(0.5)
    model.save_pretrained(root / "changed", max_shard_size="40KB")
    return root, index, first


def test_sharded_checkpoint_is_read_as_one(hf_saves, tmp_path):
    root, index, first = hf_saves
    shards = sorted(p.name for p in (root / "sharded").glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3 and len(set(index.values())) == len(shards)
    r = compare_series(root / "sharded", root / "whole")[0]
    assert set(r.per_tensor) == set(index) and r.max_abs == 0 and not any(r.mismatches.values())
    changed = compare_series(root / "sharded", root / "changed")[0]
    assert changed.max_abs == pytest.approx(0.5) and {k for k, v in changed.per_tensor.items() if v["max_abs"]} == {
        first
    }
    by_shard = compare_checkpoints(root / "sharded" / shards[-1], root / "changed" / "model.safetensors.index.json")
    assert set(by_shard.per_tensor) == set(index)  # a shard's path opens its whole checkpoint
    no_index = tmp_path / "no_index"
    shutil.copytree(root / "changed", no_index)
    (no_index / "model.safetensors.index.json").unlink()
    again = compare_series(root / "sharded", no_index)[0]
    assert again.per_tensor == changed.per_tensor  # the -of- naming alone
    res = runner.invoke(app, ["drift", str(root / "sharded"), str(root / "changed")])
    assert res.exit_code == 0 and _row(res.stdout, "0", str(len(index)), "5.000e-01"), res.output


def test_series_of_sharded_checkpoints_by_step(hf_saves, tmp_path):
    root, index, _ = hf_saves
    for step, src in ((10, "sharded"), (20, "changed")):
        shutil.copytree(root / src, tmp_path / "hf" / f"checkpoint-{step}")
        (tmp_path / "hf" / f"checkpoint-{step}" / "optimizer.pt").write_bytes(b"not weights")  # as Trainer saves
    torch.save({"x": torch.ones(1)}, tmp_path / "hf" / "checkpoint-10" / "rng_state.pth")
    (tmp_path / "flat").mkdir()
    g = torch.Generator().manual_seed(0)
    for step in (10, 20):
        w = {f"blocks.{i}.w": torch.randn(8, generator=g) for i in range(4)}
        save_safetensors(dict(list(w.items())[:2]), tmp_path / "flat" / f"step{step}-00001-of-00002.safetensors")
        save_safetensors(dict(list(w.items())[2:]), tmp_path / "flat" / f"step{step}-00002-of-00002.safetensors")
    assert sorted(series(tmp_path / "hf")) == [10, 20] and sorted(series(tmp_path / "flat")) == [10, 20]
    pairs = compare_series(tmp_path / "hf", tmp_path / "hf")
    assert [p.step for p in pairs] == [10, 20] and all(set(p.per_tensor) == set(index) for p in pairs)
    assert len(compare_series(tmp_path / "flat", tmp_path / "flat")[0].per_tensor) == 4


def test_broken_sharded_checkpoints_exit_2(hf_saves, tmp_path):
    root, index, first = hf_saves
    cases = {}
    missing = tmp_path / "missing"
    shutil.copytree(root / "sharded", missing)
    shard1 = index[first]
    (missing / shard1).unlink()
    cases["missing"] = (missing, f"shard {shard1!r} (of tensor")
    no_idx = tmp_path / "no_idx"
    shutil.copytree(missing, no_idx)
    (no_idx / "model.safetensors.index.json").unlink()
    cases["missing_no_index"] = (no_idx, f"lacks {shard1}")
    bad_map = tmp_path / "bad_map"
    shutil.copytree(root / "sharded", bad_map)
    wm = dict(index)
    wm[first] = next(s for s in sorted(set(index.values())) if s != shard1)
    (bad_map / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    cases["bad_map"] = (bad_map, f"maps tensor {first!r} to {wm[first]}, which does not hold it")
    not_index = tmp_path / "not_index"
    shutil.copytree(root / "sharded", not_index)
    (not_index / "model.safetensors.index.json").write_text("[1, 2]")
    cases["not_index"] = (not_index, 'expected {"weight_map"')
    escape = tmp_path / "escape"
    shutil.copytree(root / "sharded", escape)
    (escape / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {first: "../x.safetensors"}}))
    cases["escape"] = (escape, "is not a checkpoint file")
    dup = tmp_path / "dup"
    dup.mkdir()
    save_safetensors({"w": torch.ones(2)}, dup / "m-1-of-2.safetensors")
    save_safetensors({"w": torch.ones(2)}, dup / "m-2-of-2.safetensors")
    cases["duplicate"] = (dup, "tensor 'w' is in two shards, m-1-of-2.safetensors and m-2-of-2.safetensors")
    for case, (folder, needle) in cases.items():
        res = runner.invoke(app, ["drift", str(folder), str(root / "whole")])
        assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, (case, res.output)
    with pytest.raises(CheckpointError, match="holds no single checkpoint"):
        open_checkpoint(tmp_path)


def test_planted_dcp_metadata_runs_nothing_and_is_exit_2(tmp_path):
    """torch reads a distributed checkpoint's .metadata with pickle.load: drift unpickles it with only the
    metadata's own classes allowed, so a planted one runs nothing (exit 2 naming the folder); a real one reads."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(3), "n": {"b": torch.zeros(2, dtype=torch.bfloat16)}}, checkpoint_id=str(tmp_path / "ok"))
    assert open_checkpoint(tmp_path / "ok").tensor("n.b").dtype == torch.bfloat16
    shutil.copytree(tmp_path / "ok", tmp_path / "bad")
    marker = tmp_path / "code-ran"
    (tmp_path / "bad" / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
    res = runner.invoke(app, ["drift", str(tmp_path / "bad"), str(tmp_path / "ok")])
    assert not marker.exists(), "unpickling .metadata ran the planted code"
    assert res.exit_code == 2 and "is not a readable distributed checkpoint" in res.output, res.output
    assert "Traceback" not in res.output


def _two_shards(folder: Path, index: bool) -> list[Path]:
    folder.mkdir(parents=True)
    paths = [folder / f"m-{i}-of-2.safetensors" for i in (1, 2)]
    for i, p in enumerate(paths):
        save_safetensors({f"w{i}": torch.full((2,), float(i))}, p)
    if index:
        wm = {f"w{i}": p.name for i, p in enumerate(paths)}
        (folder / "m.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return paths


@pytest.mark.parametrize("index", [True, False], ids=["index", "of-names"])
def test_shard_linked_outside_its_folder_is_refused(tmp_path, index):
    """A shard that is a symbolic link to a file elsewhere is not followed (exit 2 naming it); the Hugging
    Face cache's snapshots/<rev>/ -> ../../blobs/ links are read."""
    outside = tmp_path / "secret.safetensors"
    save_safetensors({"w1": torch.ones(2)}, outside)
    paths = _two_shards(tmp_path / "ckpt", index)
    paths[1].unlink()
    paths[1].symlink_to(outside)
    res = runner.invoke(app, ["drift", str(tmp_path / "ckpt"), str(tmp_path / "ckpt")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "m-2-of-2.safetensors' is a link to" in res.output and "outside its folder" in res.output
    repo = tmp_path / "models--org--m"
    for p in _two_shards(repo / "snapshots" / "abc123", index):
        blob = repo / "blobs" / f"h{p.name[2]}"
        blob.parent.mkdir(exist_ok=True)
        p.rename(blob)
        p.symlink_to(Path("..", "..", "blobs", blob.name))
    reader = open_checkpoint(repo / "snapshots" / "abc123")
    assert sorted(reader.keys()) == ["w0", "w1"] and reader.tensor("w1").tolist() == [1.0, 1.0]
    reader.close()


# ---- drift: progress and human output ----------------------------------------------------------------


def test_drift_human_output_and_progress(tmp_path):
    g = torch.Generator().manual_seed(0)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    for step in (10, 20):
        w = {"blocks.0.w": torch.randn(64, generator=g), "head.weight": torch.randn(8, generator=g)}
        save_safetensors(w, tmp_path / "a" / f"step_{step}.safetensors")
        save_safetensors({k: v + step / 80 for k, v in w.items()}, tmp_path / "b" / f"step_{step}.safetensors")
    seen = []
    pairs = compare_series(tmp_path / "a", tmp_path / "b", on_progress=lambda d, t, n: seen.append((d, t, n)))
    assert [(d, t) for d, t, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert seen[0][2] == "step 10 blocks.0.w" and seen[-1][2] == "step 20 head.weight"
    res = runner.invoke(app, ["drift", str(tmp_path / "a"), str(tmp_path / "b")])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "weight deviation A vs B" in res.stdout
    for p in pairs:
        assert p.max_abs == pytest.approx(p.step / 80) and p.wasserstein == pytest.approx(p.step / 80)  # a shift
        assert _row(res.stdout, str(p.step), "2", f"{p.max_abs:.3e}", f"{p.wasserstein:.3e}", "exact (±0.0e+00)")
    assert re.fullmatch(r"drift 4/4, \d+ s, step 20 head\.weight", res.stderr.strip()), res.stderr
    res = runner.invoke(app, ["drift", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0 and res.stderr == "" and len(json.loads(res.stdout)["pairs"]) == 2


def test_train_runs_a_killed_worker_interrupts_and_a_rerun_resumes(tmp_path):
    """A training worker SIGKILLed mid-run (the OOM killer) ends the study with StudyInterrupted, never a hang
    (core.pool: no lock shared between workers); the same call again completes every run. A run's own error comes
    back with its type (a folder of another configuration: ValueError)."""
    import multiprocessing
    import signal

    from flashcheck.training.experiments import StudyInterrupted

    runs = train_preset("tiny").runs[:2]
    killed: list[int] = []

    def kill_one(done: int, total: int, note: str) -> None:
        workers = [p for p in multiprocessing.active_children() if p.name == "flashcheck-worker"]
        if not killed and workers:
            killed.append(workers[0].pid)
            os.kill(workers[0].pid, signal.SIGKILL)

    with pytest.raises(StudyInterrupted, match="worker process died"):
        train_runs(runs, tmp_path, workers=2, on_progress=kill_one)
    assert killed
    train_runs(runs, tmp_path, workers=2)
    assert all(run_complete(tmp_path / "runs" / r.name, r) for r in runs)
    other = [dataclasses.replace(runs[0], lr=runs[0].lr * 2)]
    with pytest.raises(ValueError, match=r"another configuration \(lr differ\)"):
        train_runs(other, tmp_path, workers=1)
