"""One deterministic training run: weights every K steps, loss per step; every file written atomically and
a completion marker last, so a run killed at any point resumes to the same bits."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from flashcheck.core.fileio import (
    LinkRefused,
    atomic_target,
    load_refusal,
    make_folder,
    open_own,
    open_plain,
    remove_plain,
    write_atomic,
)
from flashcheck.core.jsonguard import read_json
from flashcheck.training.data import TokenStream, lookback, synthetic, text_file
from flashcheck.training.model import GPT, GPTConfig, make_attention

PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("constant", "cosine")
DEVICES = ("cpu", "cuda")  # cuda: written for users with a GPU, not run on this project's CPU-only machines
MARKER = "complete.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """A run. `attention`: see make_attention; `precision`: autocast format of the model (fp32 = none);
    `seed`: initialisation; `data_seed`: batch order; `data`: "synthetic" (order-2 Markov), "lookback" (the
    skip-bigram language of data.lookback, which needs attention) or a text file path. `warmup`: steps of linear
    learning-rate warm-up; `schedule`: "constant" or "cosine" (decay to 0 at the last step, after the warm-up).
    `then_attention` (optional): the attention from step `then_from` + 1 on (a switch mid-run, e.g. 8-bit
    attention for the second half: "fine-tuning"); left out of to_dict while unset, so the configuration
    of a run without it reads as before it existed (warmup, schedule and device likewise while at their defaults).
    `device`: "cpu" or "cuda" (the model, batches and autocast there; weights are saved as CPU tensors)."""

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
    then_attention: str = ""
    then_from: int = 0
    warmup: int = 0
    schedule: str = "constant"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}; expected one of {', '.join(PRECISIONS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}; expected one of {', '.join(DEVICES)}")
        if type(self.warmup) is not int or self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} must be a non-negative integer")
        for name in ("steps", "save_every", "batch", "block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.then_attention and not self.then_from > 0:
            raise ValueError(f"then_from={self.then_from} must be a positive step when then_attention is set")
        if self.then_from and not self.then_attention:
            raise ValueError(f"then_from={self.then_from} needs then_attention")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not self.then_attention:  # runs without a switch keep the configuration they had before it existed
            del d["then_attention"], d["then_from"]
        if not self.warmup and self.schedule == "constant":
            del d["warmup"], d["schedule"]
        if self.device == "cpu":
            del d["device"]
        return d

    def lr_at(self, step: int) -> float:
        """The learning rate of step 1..steps: linear warm-up over `warmup` steps, then constant or a cosine
        decay that reaches 0 after the last step."""
        if step <= self.warmup:
            return self.lr * step / self.warmup
        if self.schedule == "constant":
            return self.lr
        done = (step - self.warmup - 1) / max(1, self.steps - self.warmup)
        return self.lr * 0.5 * (1 + math.cos(math.pi * done))


def load_data(cfg: RunConfig) -> TokenStream:
    if cfg.data == "lookback":
        return lookback(vocab=cfg.model.vocab, seed=1234)
    return synthetic(vocab=cfg.model.vocab, seed=1234) if cfg.data == "synthetic" else text_file(cfg.data)


def save_torch(obj: object, path: Path) -> None:
    """torch.save, atomically (temporary file in the same folder, fsync, rename)."""
    with atomic_target(path) as tmp:
        torch.save(obj, tmp)


def weights_path(run_dir: Path, step: int) -> Path:
    return run_dir / "weights" / f"step_{step:06d}.pt"


def saved_steps(run_dir: Path) -> list[int]:
    folder = Path(run_dir) / "weights"
    if not folder.exists():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(r"step_(\d+)\.pt", p.name)))


def _config_json(cfg: RunConfig) -> dict:
    return json.loads(json.dumps(cfg.to_dict()))


def run_complete(run_dir: str | Path, cfg: RunConfig) -> bool:
    """True when the run's completion marker (written after every other file of the run) names cfg and
    its losses.json is there (a run whose files were deleted by hand is resumed from state.pt)."""
    if Path(run_dir).is_symlink():  # never complete: training it refuses the link (LinkRefused)
        return False
    try:
        marker = read_json(Path(run_dir) / MARKER, "a run's completion marker", follow=False)
        losses = read_json(Path(run_dir) / "losses.json", "a run's losses", follow=False)
    except (OSError, ValueError):  # absent, damaged or a link: not complete (a link is refused when training)
        return False
    if not isinstance(losses, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in losses):
        return False  # forged or mistyped: the run is resumed from state.pt, which rewrites it
    return isinstance(marker, dict) and marker.get("config") == _config_json(cfg) and len(losses) == cfg.steps


@contextmanager
def _claim(cfg: RunConfig, run_dir: Path) -> Iterator[None]:
    """Hold the run folder (an flock, released by the kernel if this process dies), check that it holds this
    run (config.json; written when new) and remove temporary files that killed writes left. A run folder, its
    weights/ or its lock that is a symbolic link is refused (LinkRefused): nothing is written through it."""
    make_folder(run_dir.parent, "the folder of a train-study's runs")
    make_folder(run_dir, "a run folder")
    make_folder(run_dir / "weights", "a run's weights folder")
    fd = open_plain(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644, what="a run's lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ValueError(f"run folder {str(run_dir)!r} is in use by another process (PID {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _check_config(cfg, run_dir / "config.json")
        for tmp in [*run_dir.glob(".*.tmp*"), *(run_dir / "weights").glob(".*.tmp*")]:
            remove_plain(tmp)  # a link of that name is not the tool's: left alone
        yield
    finally:
        os.close(fd)


def _check_config(cfg: RunConfig, path: Path) -> None:
    """config.json must name this run; only `steps` may differ (a run extended to more steps: _train
    rewrites it once the saved state is known to be at most that far)."""
    new = _config_json(cfg)
    if not path.exists() and not path.is_symlink():
        write_atomic(path, json.dumps(new, indent=2))
        return
    try:
        old = read_json(path, "a run's configuration", follow=False)
    except (OSError, ValueError) as exc:  # LinkRefused is a ValueError
        raise ValueError(f"{str(path)!r} cannot be read ({exc}); delete its run folder to train again") from None
    if old != new:
        old = old if isinstance(old, dict) else {}
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k != "steps")
        if differ:
            raise ValueError(
                f"{str(path.parent)!r} holds a run with another configuration ({', '.join(differ)} differ); "
                "use another --out folder or delete this one"
            )


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    data: TokenStream | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> dict:
    """Train (or resume) the run in run_dir; returns {"losses": [...], "steps": n, "resumed_from": s}.

    Files: config.json, weights/step_NNNNNN.pt every save_every steps, state.pt (resume point), losses.json,
    then complete.json last (with the CPU seconds of the steps this call trained, steps_timed); each written
    atomically, so a run killed anywhere resumes bit-identically.
    on_progress(step, cfg.steps, cfg.name) after each step (and once with the step it starts from). Trains on one
    thread with deterministic algorithms, and gives the caller's thread count and flag back."""
    run_dir = Path(run_dir)
    with _claim(cfg, run_dir):
        if run_complete(run_dir, cfg):
            losses = read_json(run_dir / "losses.json", "a run's losses", follow=False)
            return {"losses": losses, "steps": cfg.steps, "resumed_from": cfg.steps}
        threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        warn_only, fill = torch.is_deterministic_algorithms_warn_only_enabled(), _fill_flag()
        torch.set_num_threads(1)
        if cfg.device == "cuda":  # cuBLAS is deterministic only with a fixed workspace (set before its first use)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        _fill_flag(False)  # see _fill_flag: the same bits, 5-17% less CPU per step
        try:
            return _train(cfg, run_dir, data or load_data(cfg), on_progress)
        finally:  # the caller's process gets its own settings back
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
            _fill_flag(fill)


def _fill_flag(value: bool | None = None) -> bool:
    """torch.utils.deterministic.fill_uninitialized_memory (set to value when given; returns the old value).
    With deterministic algorithms on, torch fills every fresh tensor with NaN so that a kernel reading memory it
    never wrote shows it; each op of a training step writes all of its output before reading it, so the fill
    moves no bit (benchmarks/train_bit_identity.py compares every run kind) and cost 5-17% of a step's CPU time
    in its profile (the simulator's score-sized temporaries, forward and backward)."""
    import torch.utils.deterministic as deterministic

    old = bool(deterministic.fill_uninitialized_memory)
    if value is not None:
        deterministic.fill_uninitialized_memory = value
    return old


def _train(cfg: RunConfig, run_dir: Path, data: TokenStream, on_progress) -> dict:
    cpu0 = time.process_time()  # this process's CPU time: what the run costs on an idle core, whatever the load
    mcfg = dataclasses.replace(cfg.model, vocab=max(cfg.model.vocab, data.vocab))
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg, make_attention(cfg.attention, cfg.block)).to(cfg.device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scaler = torch.amp.GradScaler(cfg.device, enabled=cfg.precision == "fp16")
    start, losses = _resume(run_dir, cfg.steps, model, opt, scaler)
    if read_json(run_dir / "config.json", "a run's configuration", follow=False) != _config_json(
        cfg
    ):  # extended to more steps
        write_atomic(run_dir / "config.json", json.dumps(_config_json(cfg), indent=2))
    if on_progress is not None:
        on_progress(start, cfg.steps, cfg.name)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    later = make_attention(cfg.then_attention, cfg.block) if cfg.then_attention else None
    for step in range(start + 1, cfg.steps + 1):
        if later is not None and step > cfg.then_from:  # also right at a resume past the switch
            for blk in model.blocks:
                blk.attention = later
            later = None
        if cfg.warmup or cfg.schedule != "constant":  # set every step: a resumed run gets the same rate
            for group in opt.param_groups:
                group["lr"] = cfg.lr_at(step)
        x, y = (t.to(cfg.device) for t in data.batch(step, cfg.batch, mcfg.seq_len, cfg.data_seed))
        with torch.autocast(cfg.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        if step % cfg.save_every == 0 or step == cfg.steps:
            save_torch(_on_cpu(model.state_dict()), weights_path(run_dir, step))
            state = {"model": _on_cpu(model.state_dict()), "opt": opt.state_dict(), "scaler": scaler.state_dict()}
            save_torch({**state, "step": step, "losses": losses}, run_dir / "state.pt")
        if on_progress is not None:
            on_progress(step, cfg.steps, cfg.name)
    write_atomic(run_dir / "losses.json", json.dumps(losses))
    timed = {"cpu_seconds": time.process_time() - cpu0, "steps_timed": cfg.steps - start}
    marker = {"config": _config_json(cfg), "final_loss": losses[-1], **timed}
    write_atomic(run_dir / MARKER, json.dumps(marker, indent=2))
    return {"losses": losses, "steps": cfg.steps, "resumed_from": start}


def _on_cpu(tensors: dict) -> dict:
    """A state dict's tensors on the CPU (the same tensors when already there: files read alike on any machine)."""
    return {k: v.cpu() for k, v in tensors.items()}


def _resume(run_dir: Path, steps: int, model: GPT, opt, scaler) -> tuple[int, list[float]]:
    """Load the last saved state (step, losses so far); with none, save the step-0 weights and start at 0."""
    state_path = run_dir / "state.pt"
    if not state_path.exists() and not state_path.is_symlink():  # a link is refused by _load_state
        save_torch(_on_cpu(model.state_dict()), weights_path(run_dir, 0))
        return 0, []
    state = _load_state(state_path)
    if state["step"] > steps:
        raise ValueError(f"{str(run_dir)!r} is trained to step {state['step']}, past steps={steps}; raise steps")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    scaler.load_state_dict(state["scaler"])
    return state["step"], state["losses"]


STATE_KEYS = ("model", "opt", "scaler", "step", "losses")


def _load_state(path: Path) -> dict:
    """state.pt as train() writes it (tensors, dicts, lists and plain numbers only), read with
    weights_only=True: a file planted in the run folder can hold no object whose unpickling runs code."""
    try:
        with open_own(path, "a run's resume point") as f:  # never an outside state through a link (LinkRefused)
            state = torch.load(f, map_location="cpu", weights_only=True)
    except LinkRefused:
        raise
    except Exception as exc:  # damaged outside flashcheck (every write is atomic), or not flashcheck's
        raise ValueError(
            f"{str(path)!r} cannot be read as a train-study resume point ({load_refusal(exc)}); delete it to retrain"
        ) from None
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS) or not isinstance(state["step"], int):
        raise ValueError(f"{str(path)!r} is not a train-study resume point (expected keys {', '.join(STATE_KEYS)})")
    return state
