"""One deterministic training run: weights every K steps, loss per step, resumable from its last save."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from flashcheck.training.data import TokenStream, synthetic, text_file
from flashcheck.training.model import GPT, GPTConfig, make_attention

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """A run. `attention`: see make_attention; `precision`: autocast format of the model (fp32 = none);
    `seed`: initialisation; `data_seed`: batch order; `data`: "synthetic" or a text file path."""

    name: str
    attention: str = "standard:fp32"
    precision: str = "fp32"
    seed: int = 0
    data_seed: int = 0
    data: str = "synthetic"
    steps: int = 200
    save_every: int = 20
    batch: int = 16
    lr: float = 3e-3
    block: int = 32
    model: GPTConfig = dataclasses.field(default_factory=GPTConfig)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}; expected one of {', '.join(PRECISIONS)}")
        for name in ("steps", "save_every", "batch", "block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_data(cfg: RunConfig) -> TokenStream:
    return synthetic(vocab=cfg.model.vocab, seed=1234) if cfg.data == "synthetic" else text_file(cfg.data)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def weights_path(run_dir: Path, step: int) -> Path:
    return run_dir / "weights" / f"step_{step:06d}.pt"


def saved_steps(run_dir: Path) -> list[int]:
    folder = Path(run_dir) / "weights"
    if not folder.exists():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(r"step_(\d+)\.pt", p.name)))


def train(cfg: RunConfig, run_dir: str | Path, data: TokenStream | None = None) -> dict:
    """Train (or resume) the run in run_dir; returns {"losses": [...], "steps": n, "resumed_from": s}."""
    run_dir = Path(run_dir)
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = data or load_data(cfg)
    mcfg = dataclasses.replace(cfg.model, vocab=max(cfg.model.vocab, data.vocab))
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg, make_attention(cfg.attention, cfg.block))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", enabled=cfg.precision == "fp16")
    losses: list[float] = []
    start = 0
    state_path = run_dir / "state.pt"
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        scaler.load_state_dict(state["scaler"])
        start, losses = state["step"], state["losses"]
    else:
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        _atomic_save(model.state_dict(), weights_path(run_dir, 0))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    for step in range(start + 1, cfg.steps + 1):
        x, y = data.batch(step, cfg.batch, mcfg.seq_len, cfg.data_seed)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        if step % cfg.save_every == 0 or step == cfg.steps:
            _atomic_save(model.state_dict(), weights_path(run_dir, step))
            _atomic_save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "scaler": scaler.state_dict(),
                    "step": step,
                    "losses": losses,
                },
                state_path,
            )
    (run_dir / "losses.json").write_text(json.dumps(losses))
    return {"losses": losses, "steps": cfg.steps, "resumed_from": start}
