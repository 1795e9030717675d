"""`flashcheck train-study`: runs that differ in exactly one factor, their weight deviation, the paper's ratios."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flashcheck.core.fileio import DiskFull, LinkRefused, UnsafeFile, full_error, make_folder, refuse_link, write_atomic
from flashcheck.core.jsonguard import read_json
from flashcheck.core.lifeline import exit_with_parent
from flashcheck.core.pool import send_to_parent
from flashcheck.training.drift import compare_series
from flashcheck.training.lossgap import context_free_loss, loss_gaps, plateau_sentence, sentence
from flashcheck.training.model import GPTConfig
from flashcheck.training.ratios import conclusion, describe_slope, findings, growth_fit, ratio_by_step, ratios
from flashcheck.training.train import RunConfig, load_data, run_complete, train


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainStudy:
    """Seed groups of runs that differ in one factor. pairs: (pair name, run a, run b, factor, seed), one of
    each pair per seed, so every ratio has one value per seed. verdicts: False for a smoke test (tiny)."""

    name: str
    runs: tuple[RunConfig, ...]
    pairs: tuple[tuple[str, str, str, str, int], ...]
    verdicts: bool = True
    overrides: dict = dataclasses.field(default_factory=dict)


PAIRS = ("flash_vs_baseline", "seed_vs_seed", "bf16_vs_fp32", "fp16_vs_fp32")
RESEED = 1000  # the re-seeded run of seed group s initialises with seed s + RESEED
# imported once in the fork server workers start from; torch._dynamo too: torch.optim imports it at a worker's
# first optimizer (821 modules, 1.0 s of CPU in every worker otherwise)
PRELOAD = ["torch", "torch._dynamo", "flashcheck.training.experiments"]
EIGHT_BIT, SAGE8, SAGE8FT = "sagebwd", "sage8", "sage8ft"  # the 8-bit attention (make_attention) and its runs
NOATTN = "noattn"  # the attention-free control of each seed group (make_attention's "none")


def _groups(name: str, base: RunConfig, seeds: int, policy: str, verdicts: bool = True) -> TrainStudy:
    """Per seed s (initialisation s, batch order s): base (standard attention, fp32 model), flash (Flash
    attention, same policy), reseed (initialisation s + RESEED), bf16 and fp16 (autocast); the 8-bit
    attention runs of the loss-gap check (training.lossgap): sage8 (SageBwd-like attention from step 1,
    "pretraining") and sage8ft (the base run's attention for the first half of the steps, then SageBwd-like:
    "fine-tuning"); and noattn (each position sees only itself: the loss a model reaches without attention).
    The 8-bit and attention-free runs are in no weight-deviation pair."""
    runs, pairs = [], []
    for s in range(seeds):
        b = dataclasses.replace(base, name=f"base-s{s}", attention=f"standard:{policy}", seed=s, data_seed=s)
        runs += [
            b,
            dataclasses.replace(b, name=f"flash-s{s}", attention=f"flash:{policy}"),
            dataclasses.replace(b, name=f"reseed-s{s}", seed=s + RESEED),
            dataclasses.replace(b, name=f"bf16-s{s}", precision="bf16"),
            dataclasses.replace(b, name=f"fp16-s{s}", precision="fp16"),
            dataclasses.replace(b, name=f"{SAGE8}-s{s}", attention=EIGHT_BIT),
            dataclasses.replace(b, name=f"{SAGE8FT}-s{s}", then_attention=EIGHT_BIT, then_from=max(1, base.steps // 2)),
            dataclasses.replace(b, name=f"{NOATTN}-s{s}", attention="none"),
        ]
        names = (f"flash-s{s}", f"reseed-s{s}", f"bf16-s{s}", f"fp16-s{s}")
        factors = ("attention", "seed", "format", "format")
        pairs += [(p, b.name, n, f, s) for p, n, f in zip(PAIRS, names, factors, strict=True)]
    return TrainStudy(name=name, runs=tuple(runs), pairs=tuple(pairs), verdicts=verdicts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    """A train-study's size and schedule. data "lookback" (training.data.lookback): the next token is a function
    of the one before the current token, so the loss falls below the current-token loss only once attention
    looks back; warm-up then cosine decay, so the runs' tail losses settle (a small seed spread)."""

    model: GPTConfig
    batch: int
    steps: int
    save_every: int
    seeds: int
    lr: float = 1e-2
    warmup: int = 0
    schedule: str = "cosine"
    data: str = "lookback"


# every preset's attention policy is bf16-mixed (fp32 softmax statistics and accumulator, what real kernels do)
# unless --policy says otherwise; sizes and timings in docs/training-claim.md
PRESETS = {
    "tiny": Preset(model=GPTConfig(vocab=32, seq_len=32, layers=1, heads=2, dim=32), batch=4, steps=12, save_every=4,
                   seeds=1, warmup=2),
    "quick": Preset(model=GPTConfig(vocab=64, seq_len=64, layers=2, heads=4, dim=64), batch=8, steps=160,
                    save_every=10, seeds=5, warmup=16),
    # peak 1e-2 left 2 of 5 seeds on the plateau at 3 layers (tail 4.02, 3.90 vs 4.14); 5e-3 over 400 steps takes
    # every seed to 1.41-1.45 (docs/training-claim.md)
    "paper": Preset(model=GPTConfig(vocab=64, seq_len=128, layers=3, heads=4, dim=64), batch=8, steps=400,
                    save_every=20, seeds=5, lr=5e-3, warmup=40),
    "full": Preset(model=GPTConfig(vocab=64, seq_len=256, layers=6, heads=8, dim=256), batch=32, steps=5000,
                   save_every=100, seeds=5, warmup=250),
}  # fmt: skip
TRAIN_PRESETS = tuple(PRESETS)


def train_preset(
    name: str,
    *,
    steps: int | None = None,
    save_every: int | None = None,
    seeds: int | None = None,
    lr: float | None = None,
    policy: str | None = None,
    device: str | None = None,
    data: str | None = None,
) -> TrainStudy:
    """A preset, optionally with fewer/more steps, another save interval, seed count, learning rate,
    attention policy (a study at other conditions), device ("cuda": a GPU; ValueError without one) or data
    ("lookback", "synthetic" or a UTF-8 text file, read at character level; checked here). With steps and no
    save_every, saves about 8 times; the warm-up stays the preset's share of the steps."""
    if name not in PRESETS:
        allowed = ", ".join([*TRAIN_PRESETS, "tied-max"])
        raise ValueError(f"unknown train-study preset {name!r}; expected one of {allowed}")
    pre = PRESETS[name]
    for flag, value in (("steps", steps), ("save_every", save_every), ("seeds", seeds)):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{flag}={value!r} is not allowed; it must be a positive integer")
    if lr is not None and not (isinstance(lr, float | int) and 0 < lr < 1):
        raise ValueError(f"lr={lr!r} is not allowed; it must be a number in (0, 1)")
    if policy is not None:
        from flashcheck.core.numerics import parse_policy

        parse_policy(policy)  # ValueError naming the allowed policies
    if device is not None:
        _check_device(device)
    if data is not None:
        _check_data(data, pre.model.seq_len)
    every = pre.save_every
    if steps is not None and save_every is None:
        every = min(every, max(1, steps // 8))
    n_steps = steps or pre.steps
    if save_every is not None and save_every > n_steps:  # one save at step 0 and the last: no curve, no slope
        raise ValueError(f"save_every={save_every} is not allowed; it must be at most the run's steps ({n_steps})")
    base = RunConfig(
        name="base",
        steps=n_steps,
        save_every=save_every or every,
        batch=pre.batch,
        lr=float(lr) if lr is not None else pre.lr,
        model=pre.model,
        warmup=pre.warmup * n_steps // pre.steps,
        schedule=pre.schedule,
        device=device or "cpu",
        data=data or pre.data,
    )
    overrides = dict(steps=steps, save_every=save_every, seeds=seeds, lr=lr, policy=policy, device=device, data=data)
    study = _groups(name, base, seeds or pre.seeds, policy or "bf16-mixed", verdicts=name != "tiny")
    return dataclasses.replace(study, overrides={k: v for k, v in overrides.items() if v is not None})


def _check_data(data: str, seq_len: int) -> None:
    """ValueError unless data names a built-in language or a UTF-8 text file long enough for one window."""
    from flashcheck.training.data import text_file

    if data in ("lookback", "synthetic"):
        return
    if not data.strip():
        raise ValueError("data='' is not allowed; give lookback, synthetic or a UTF-8 text file")
    n = text_file(data).tokens.numel()  # ValueError: missing, or not UTF-8
    if n < seq_len + 2:
        raise ValueError(
            f"text file {data!r} has {n} characters; windows of {seq_len} tokens need at least {seq_len + 2}"
        )


def _check_device(device: str) -> None:
    """ValueError unless device is cpu, or cuda with a CUDA device present."""
    from flashcheck.training.train import DEVICES

    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device='cuda' is not allowed here: torch sees no CUDA device (torch.cuda.is_available())")


class StudyInterrupted(RuntimeError):
    """Training stopped before every run completed (a worker died); rerunning resumes it."""


class NonFiniteWeights(RuntimeError):
    """A run's weights hold NaN or Inf (it diverged): the pairs cannot be measured."""


def _worker_init(parent_pid: int | None = None) -> None:
    if parent_pid is not None:  # a train-study killed by SIGKILL takes its workers with it
        exit_with_parent(parent_pid)


def _run(args: tuple[RunConfig, str]) -> str:
    cfg, folder = args
    last = [0.0]

    def report(step: int, total: int, name: str) -> None:
        now = time.monotonic()
        if step in (0, total) or now - last[0] >= 0.2:  # a few messages a second
            last[0] = now
            send_to_parent((name, step))

    train(cfg, folder, on_progress=report)
    return cfg.name


def run_train_study(
    study: TrainStudy,
    out: str | Path,
    *,
    workers: int | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    on_analysis: Callable[[int, int, str], None] | None = None,
) -> dict:
    """Train every run not yet complete (resuming any that stopped), then measure the pairs and write the
    report, holding `out`'s folder lock (FolderLocked, a ValueError naming the holder's PID, when another
    study or train-study has it). on_progress(steps done, steps of the runs to train, note) while training;
    on_analysis(parts done, parts, note) while measuring the pairs and writing the report."""
    from flashcheck.core.lock import folder_lock

    out = Path(out)
    try:
        make_folder(out / "runs", "the folder of a train-study's runs")
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r} is not writable: {exc.strerror or exc}") from None
    with folder_lock(out, "train-study"):  # a second train-study on `out` is refused at once, naming this one
        try:
            train_runs(study.runs, out, workers=workers, on_progress=on_progress)
            return analyse(study, out, on_progress=on_analysis)
        except DiskFull as exc:
            raise full_error(exc, exc.path, bytes_left(study, out)) from exc


REPORT_BYTES = 16 * 2**20  # room for report.html, report.md, summary.json and figures/


def bytes_left(study: TrainStudy, out: Path) -> int:
    """About what the runs not yet complete still write (fp32 weights at each save, the resume state with
    AdamW's two moments), and room for the report: the space a full disk needs freed."""
    from flashcheck.training.model import GPT

    need = REPORT_BYTES
    for r in study.runs:
        if not run_complete(out / "runs" / r.name, r):
            params = sum(p.numel() for p in GPT(r.model, attention=None).parameters())
            need += 4 * params * (r.steps // r.save_every + 2 + 3)
    return need


def train_runs(
    runs: tuple[RunConfig, ...] | list[RunConfig],
    out: Path,
    *,
    workers: int | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> None:
    """Train the runs not yet complete into out/runs/NAME, in worker processes (fresh torch state each)
    whose steps come back through a queue: on_progress(steps done, steps of these runs, note)."""
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ValueError(f"workers={workers!r} is not allowed; it must be a positive integer")
    for r in runs:  # a run folder that is a link is refused before any run starts
        refuse_link(Path(out) / "runs" / r.name, "a run folder")
    todo = [(r, str(Path(out) / "runs" / r.name)) for r in runs if not run_complete(Path(out) / "runs" / r.name, r)]
    if todo:
        _train_all(todo, workers or os.cpu_count() or 1, on_progress)


# a worker's errors that are the user's input, not the tool's fault: one line, exit 2 (a link refused, a file
# of a run's folder that is not a plain file, a folder of another configuration)
_USAGE_ERRORS = ("ValueError", LinkRefused.__name__, UnsafeFile.__name__)


def _train_all(todo: list[tuple[RunConfig, str]], workers: int, on_progress) -> None:
    """The runs in a core.pool.WorkerPool (one private pipe per worker: a worker killed at any instant costs its
    own run, never a lock the others wait on), their steps sent back as they train."""
    from flashcheck.core.pool import WorkerPool, fresh_context

    total, steps = sum(r.steps for r, _ in todo), dict.fromkeys((r.name for r, _ in todo), 0)
    queue = list(todo)
    ctx = fresh_context(PRELOAD)  # fresh torch state each; never plain fork once JAX or a BLAS pool runs
    with WorkerPool(min(workers, len(todo)), ctx, _worker_init, (os.getpid(),)) as pool:
        while queue or pool.running():
            while queue and pool.idle():
                item = queue.pop(0)
                pool.submit(item[0].name, _run, item)
            for kind, _name, value in pool.events(0.25):
                if kind == "emit":
                    name, step = value
                    steps[name] = max(steps[name], step)
                    if on_progress is not None:
                        on_progress(sum(steps.values()), total, f"run {name} step {step}")
                elif kind == "error":  # a run's error (e.g. a folder of another configuration) ends the study
                    kind_of, _, message = value.partition(": ")
                    raise (ValueError(message) if kind_of in _USAGE_ERRORS else RuntimeError(value))
                elif kind == "died":
                    raise StudyInterrupted(
                        "a training worker process died (killed, or out of memory); every finished step is saved: "
                        "run the same command again to resume"
                    )
            if not pool.running() and not pool.idle() and queue:
                raise StudyInterrupted("every training worker process died; run the same command again to resume")


def _pair_curve(out: Path, pname: str, a: str, b: str) -> dict:
    """One pair of one seed: W1 and max-abs over the model, per layer and per tensor, at every saved step,
    and the growth-phase fit of W1 (NonFiniteWeights if a run diverged)."""
    res = compare_series(out / "runs" / a / "weights", out / "runs" / b / "weights")
    _check_finite(pname, a, b, res)
    steps, w1 = [p.step for p in res], [p.wasserstein for p in res]
    return {
        "runs": [a, b],
        "steps": steps,
        "max_abs": [p.max_abs for p in res],
        "wasserstein": w1,
        "per_layer": {name: [p.per_layer[name]["wasserstein"] for p in res] for name in res[-1].per_layer},
        "per_tensor": {
            name: {m: [p.per_tensor[name][m] for p in res] for m in ("max_abs", "wasserstein")}
            for name in res[-1].per_tensor
        },
        "fit": growth_fit(steps, w1),
    }


def _curves(study: TrainStudy, out: Path, on_pair: Callable[[int, str], None] | None = None) -> dict:
    """{pair: {factor, seeds: {seed: curve}}} for every pair of every seed group; on_pair(pairs done, note)
    after each."""
    curves: dict = {}
    for i, (pname, a, b, factor, seed) in enumerate(study.pairs, 1):
        entry = curves.setdefault(pname, {"factor": factor, "seeds": {}})
        entry["seeds"][str(seed)] = _pair_curve(out, pname, a, b)
        if on_pair is not None:
            on_pair(i, f"{pname} seed {seed}")
    return curves


def _conditions(study: TrainStudy) -> dict:
    base = study.runs[0]
    return {
        "model": dataclasses.asdict(base.model),
        "batch": base.batch,
        "steps": base.steps,
        "save_every": base.save_every,
        "lr": base.lr,
        "attention_policy": base.attention.partition(":")[2],
        "seeds": len({p[4] for p in study.pairs}),
        "overrides": study.overrides,
    }


SMOKE_NOTE = (
    "tiny is a smoke test (one seed, a few steps): it checks that training, resuming and the report work "
    "and gives no verdicts; run --preset quick or paper for ratios with intervals"
)


def analyse(study: TrainStudy, out: Path, on_progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Deviation curves of each pair and seed, growth-phase slopes, the paper's ratios with intervals over
    seeds, findings (none for a smoke test); writes summary.json, report.md/html and the figures.
    on_progress(parts done, parts, note): a part is a pair of one seed, and the report last."""

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bits on any machine; a pool of threads on a busy one is 4x slower
    try:
        return _analyse(study, out, on_progress)
    finally:
        torch.set_num_threads(threads)


def _analyse(study: TrainStudy, out: Path, on_progress: Callable[[int, int, str], None] | None) -> dict:
    from flashcheck.training.train_report import write_train_report

    parts = len(study.pairs) + 1
    tell = on_progress or (lambda done, total, note: None)
    tell(0, parts, "comparing the weights of each pair")
    curves = _curves(study, out, lambda done, note: tell(done, parts, f"pair {note}"))
    r = ratios(curves)
    runs = out / "runs"
    losses = {x.name: read_json(runs / x.name / "losses.json", "a run's losses", follow=False) for x in study.runs}
    summary = {
        "study": study.name,
        "conditions": _conditions(study),
        "verdicts": study.verdicts,
        "note": "" if study.verdicts else SMOKE_NOTE,
        "ratios": r,
        "ratio_by_step": ratio_by_step(curves),
        "findings": findings(r) if study.verdicts else [],
        "slopes": {p: {s: describe_slope(p, c["fit"]) for s, c in e["seeds"].items()} for p, e in curves.items()},
        "pairs": curves,
        "runs": [run.to_dict() for run in study.runs],
        "final_loss": {k: v[-1] for k, v in losses.items()},
    }
    summary["cpu"] = _cpu(study, runs)
    summary["conclusion"] = conclusion(summary)
    gap = _loss_gap(study, losses)
    if gap is not None:
        summary["loss_gap"] = gap
        line = sentence(gap, study.runs[0].batch * study.runs[0].model.seq_len)
        summary["conclusion"].insert(len(summary["conclusion"]) - 1 if study.verdicts else 1, line)
        summary["conclusion"].insert(0, plateau_sentence(gap))
    tell(parts - 1, parts, "report and figures")
    write_atomic(out / "summary.json", json.dumps(summary, indent=2, default=_json_default))
    write_train_report(summary, losses, out)
    tell(parts, parts, "report written")
    return summary


def _cpu(study: TrainStudy, runs: Path) -> dict:
    """The training runs' CPU seconds as their completion markers recorded them (per step, so a resumed run
    counts the steps its last call trained): {seconds: estimated for every step of every run, runs_timed}.
    On an idle machine the training takes about seconds / workers."""
    total, timed = 0.0, 0
    for r in study.runs:
        try:
            m = read_json(runs / r.name / "complete.json", "a run's completion marker", follow=False)
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("steps_timed"):
            total += m["cpu_seconds"] / m["steps_timed"] * r.steps
            timed += 1
    return {"seconds": total, "runs_timed": timed, "runs": len(study.runs)}


def _loss_gap(study: TrainStudy, losses: dict) -> dict | None:
    """The 8-bit runs' loss gap to the base runs (training.lossgap), None for a study without them."""
    seeds = sorted({p[4] for p in study.pairs})
    variants = tuple(v for v in (SAGE8, SAGE8FT) if seeds and f"{v}-s{seeds[0]}" in losses)
    if not variants:
        return None
    data = load_data(study.runs[0])
    return loss_gaps(losses, seeds, plateau=context_free_loss(data.tokens, data.vocab), variants=variants)


def _json_default(x):
    raise TypeError(f"not JSON serialisable: {x!r}")


def _check_finite(pname: str, a: str, b: str, pairs: list) -> None:
    bad = [
        f"step {p.step} {name} ({a}: {n['a']}, {b}: {n['b']} of {n['numel']} values)"
        for p in pairs
        for name, n in p.nonfinite.items()
    ]
    if bad:
        raise NonFiniteWeights(f"pair {pname}: NaN/Inf weights (the run diverged): {'; '.join(bad[:5])}")
