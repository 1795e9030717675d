"""Issue 46's pieces on cases whose answer is known: the look-back language (it needs attention: the current token
says nothing), the learning-rate schedule, the per-seed plateau rule, the power statement, the device check."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from flashcheck.training.data import lookback
from flashcheck.training.lossgap import context_free_loss, loss_gaps, plateau_sentence
from flashcheck.training.ratios import seeds_needed
from flashcheck.training.train import RunConfig


def _conditional_entropy(x: torch.Tensor, y: torch.Tensor, vocab: int) -> float:
    """H(y | x) in nats from the joint counts of two aligned token sequences."""
    counts = torch.bincount(x * vocab + y, minlength=vocab * vocab).double().view(vocab, vocab)
    joint, cond = counts / counts.sum(), counts / counts.sum(1, keepdim=True).clamp(min=1)
    seen = counts > 0
    return float(-(joint[seen] * cond[seen].log()).sum())


def test_lookback_needs_the_token_before_the_current_one():
    vocab, noise = 16, 0.2
    t = lookback(vocab, length=200_000, seed=3, noise=noise).tokens
    hit = 1 - noise + noise / vocab  # x[t+1] = perm(x[t-1]), or a uniform draw that may land on it too
    floor = -(hit * math.log(hit) + (vocab - 1) * (noise / vocab) * math.log(noise / vocab))
    assert _conditional_entropy(t[:-2], t[2:], vocab) == pytest.approx(floor, abs=0.01)  # look back: the floor
    assert context_free_loss(t, vocab) > math.log(vocab) - 0.05  # the current token alone: nearly nothing
    assert torch.equal(t, lookback(vocab, length=200_000, seed=3, noise=noise).tokens)  # seeded
    with pytest.raises(ValueError, match=r"noise=1\.5"):
        lookback(vocab, noise=1.5)


def test_warmup_then_cosine_schedule():
    cfg = RunConfig(name="x", steps=100, warmup=10, lr=1e-2, schedule="cosine")
    assert cfg.lr_at(1) == pytest.approx(1e-3) and cfg.lr_at(10) == pytest.approx(1e-2)
    assert cfg.lr_at(11) == pytest.approx(1e-2)  # the decay starts at the peak
    assert cfg.lr_at(100) == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert all(cfg.lr_at(s) > cfg.lr_at(s + 1) for s in range(11, 100))
    assert RunConfig(name="x", steps=5).lr_at(5) == RunConfig(name="x").lr  # constant by default
    assert "warmup" not in RunConfig(name="x").to_dict() and "device" not in RunConfig(name="x").to_dict()
    assert cfg.to_dict()["schedule"] == "cosine"
    for bad, match in (({"schedule": "step"}, "schedule 'step'"), ({"warmup": -1}, "warmup=-1"),
                       ({"device": "tpu"}, "device 'tpu'")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            RunConfig(name="x", **bad)


def _losses(levels: dict[str, list[float]], steps: int = 20) -> dict[str, list[float]]:
    return {f"{n}-s{s}": [5.0] * (steps - 2) + [x, x] for n, xs in levels.items() for s, x in enumerate(xs)}


def test_every_seed_must_leave_the_plateau():
    base = [2.0, 2.1, 2.95]  # mean 2.35 is below 3 - spread (0.52), the third seed is not
    runs = _losses({"base": base, "sage8": base, "sage8ft": base, "noattn": [3.01, 3.0, 2.99]})
    gap = loss_gaps(runs, [0, 1, 2], plateau=3.0)
    assert not gap["base_left_plateau"] and gap["variants"]["sage8"]["verdict"] == "inconclusive"
    assert "highest seed's loss 2.9500" in gap["variants"]["sage8"]["reason"]
    assert gap["attention_free"] == [3.01, 3.0, 2.99]
    assert "without attention (each position sees only itself) the runs reach 3" in plateau_sentence(gap)
    good = loss_gaps(_losses({"base": [2.0, 2.1, 2.05], "sage8": base, "sage8ft": base}), [0, 1, 2], plateau=3.0)
    assert good["base_left_plateau"] and good["attention_free"] is None
    assert "below it by more than the seed spread in every seed" in plateau_sentence(good)
    one = loss_gaps(_losses({"base": [2.0], "sage8": [2.0], "sage8ft": [2.0]}), [0], plateau=3.0)
    assert plateau_sentence(one).endswith("one seed gives no spread to judge the distance against.")


def test_power_statement_matches_the_t_interval():
    from scipy import stats

    num = [0.5 * math.exp(d) for d in (-0.3, 0.1, 0.4, -0.1)]
    p = seeds_needed(num, [1.0] * 4)
    logs = [math.log(x) for x in num]
    sd, m = stats.tstd(logs), abs(sum(logs) / 4)
    n = p["seeds"]
    assert p["sd_log"] == pytest.approx(sd) and p["distance"] == pytest.approx(m)
    assert stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) < m <= stats.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1)
    band = seeds_needed(num, [1.0] * 4, (0.2, 0.5))
    assert band["distance"] == pytest.approx(abs(sum(logs) / 4 - math.log(0.5))) and band["seeds"] > n
    assert seeds_needed([1.0, 1.0], [1.0, 1.0])["seeds"] is None  # the mean on the edge: no count decides it
    assert seeds_needed([0.5], [1.0])["seeds"] is None  # one seed: no spread


def test_cuda_is_refused_without_a_gpu(monkeypatch):
    from flashcheck.training.experiments import train_preset

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' is not allowed here"):
        train_preset("tiny", device="cuda")
    assert train_preset("tiny", device="cpu").runs[0].device == "cpu"


def test_bad_data_files_exit_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "short.txt").write_text("short")
    cases = [("bad.txt", "is not UTF-8 text"), ("short.txt", "has 5 characters; windows of 32 tokens need at least 34"),
             ("missing.txt", "does not exist")]  # fmt: skip
    for name, message in cases:
        args = ["train-study", "--preset", "tiny", "--data", str(tmp_path / name), "--out", str(tmp_path / "o")]
        res = CliRunner().invoke(app, args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
    assert not (tmp_path / "o" / "runs").exists()  # refused before any run started


def test_a_run_records_the_cpu_time_of_the_steps_it_trained(tmp_path):
    import json

    from flashcheck.training.model import GPTConfig
    from flashcheck.training.train import train

    tiny = GPTConfig(vocab=16, seq_len=16, layers=1, heads=2, dim=16)
    cfg = RunConfig(name="x", steps=4, save_every=2, batch=2, model=tiny, data="lookback", warmup=1, schedule="cosine")
    train(dataclasses.replace(cfg, steps=2), tmp_path / "r")  # two steps, then extended to four: resumes at 2
    res = train(cfg, tmp_path / "r")
    marker = json.loads((tmp_path / "r" / "complete.json").read_text())
    assert res["resumed_from"] == 2 and marker["steps_timed"] == 2 and 0 < marker["cpu_seconds"] < 60
    assert marker["config"] == json.loads(json.dumps(cfg.to_dict()))
