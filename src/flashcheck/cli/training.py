"""`flashcheck train-study` and `flashcheck drift`."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from contextlib import ExitStack

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    _int_range,
    _not_others,
    _out_folder,
    _starting,
    app,
    default_out,
)

MAX_WORKERS = 256  # runs trained at once; a study has 5
MAX_STEPS = 1_000_000  # 200 times the full preset's 5000 steps: beyond it, a typo rather than a study
MAX_SEEDS = 100  # seed groups (7 runs each)
TRAIN_KEYS = [{"study", "conditions", "ratios"}, {"study", "tied", "control", "thresholds"}]  # its summary.json's
MAX_SKETCH_POINTS = 10_000_000  # per tensor; beyond this an exact W1 (--exact-limit) is the better tool


class _Progress:
    """An on_progress(done, total, note) callback for the training functions, shown with
    flashcheck.core.progress (a bar on a terminal, periodic lines on stderr otherwise); opened on the first call,
    when the total is known."""

    def __init__(self, label: str, quiet: bool) -> None:
        self.label, self.quiet, self.done = label, quiet, 0
        self.stack = ExitStack()
        self.advance = None

    def __call__(self, done: int, total: int, note: str = "") -> None:
        if self.advance is None:
            from flashcheck.core.progress import progress

            self.advance = self.stack.enter_context(
                progress(total, self.label, done=done, quiet=self.quiet or total <= 1)
            )
            self.done = done
        if done > self.done:
            self.advance(done - self.done, note)
            self.done = done

    def close(self) -> None:
        """End this progress (its last line or bar) before another one starts; idempotent."""
        self.stack.close()

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.stack.__exit__(*exc)


def _fail_check(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command("train-study")
def train_study(
    preset: str = typer.Option("quick", help="quick | paper | full | tiny (smoke test, no verdicts) | tied-max."),
    out: str = typer.Option(
        None,
        help="Folder for runs, figures and the report (default: flashcheck-train-study for quick, "
        "flashcheck-train-study-PRESET for another preset).",
    ),
    workers: int = typer.Option(None, help="Runs trained in parallel (default: the core count)."),
    steps: int = typer.Option(None, help="Training steps instead of the preset's (saves about 8 times)."),
    save_every: int = typer.Option(None, help="Save the weights every N steps instead of the preset's."),
    seeds: int = typer.Option(None, help="Seed groups instead of the preset's 5 (verdicts need 3 or more)."),
    lr: float = typer.Option(
        None, help="Peak learning rate instead of the preset's (1e-2; paper 5e-3): warm-up, then cosine decay."
    ),
    policy: str = typer.Option(
        None, help="Attention numerics policy of every run but sage8's 8-bit one (default bf16-mixed)."
    ),
    data: str = typer.Option(
        None, help="lookback (default: the next token needs looking back), synthetic, or a UTF-8 text file."
    ),
    device: str = typer.Option(
        None, help="cpu (default) or cuda: where the runs train (cuda is written for GPUs, untested in this project)."
    ),
    quiet: bool = typer.Option(False, help="No progress and no findings on the terminal."),
) -> None:
    """Train runs that differ in one factor (attention, format, seed), one group per seed, and compare their
    weights; and 8-bit attention runs (sage8, sage8ft) whose loss is judged against the base run's. A run
    killed at any point resumes where it stopped when the command is run again."""
    out = default_out("flashcheck-train-study", preset) if out is None else out
    try:
        for flag, value in (("--preset", preset), ("--out", out), ("--policy", policy)):
            if value is not None and not value.strip():
                raise ValueError(f"{flag} {value!r} is empty; give a value or leave the option out for its default")
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"--workers {workers} is not allowed; give an integer from 1 to {MAX_WORKERS}")
        _not_others(_out_folder(out), "train-study", TRAIN_KEYS)  # not a study's or another command's output
        _check_counts(steps, save_every, seeds)
    except ValueError as exc:
        _fail_usage(str(exc))
    _starting(f"train-study: training the {preset} preset's runs into {out} (stopped early, the same command "
              "resumes them)", quiet)  # fmt: skip
    from flashcheck.training.experiments import NonFiniteWeights, StudyInterrupted

    try:
        overrides = {"steps": steps, "save_every": save_every, "seeds": seeds, "lr": lr, "policy": policy}
        overrides |= {"device": device, "data": data}
        if preset == "tied-max":
            summary = _tied_max(out, quiet, seeds, steps, overrides)
        else:
            summary = _train_preset(preset, out, workers, quiet, overrides)
    except ValueError as exc:
        _fail_usage(_as_flags(str(exc)))
    except (StudyInterrupted, NonFiniteWeights) as exc:
        _fail_check(str(exc))
    if not quiet:
        _print_train_study(summary, out)


def _as_flags(text: str) -> str:
    """A preset's ValueError in the command line's words (save_every= -> --save-every ...)."""
    for field in ("save_every", "lr", "device", "data"):
        text = text.replace(f"{field}=", f"--{field.replace('_', '-')} ")
    return text


def _train_preset(preset: str, out: str, workers: int | None, quiet: bool, overrides: dict) -> dict:
    """Train the preset's runs, then analyse them, each with its own progress (training's ends first)."""
    from flashcheck.training.experiments import run_train_study, train_preset

    study = train_preset(preset, **{k: v for k, v in overrides.items() if v is not None})
    with _Progress("train-study", quiet) as on_progress, _Progress("analysis", quiet) as analysis:

        def on_analysis(done: int, total: int, note: str = "") -> None:
            on_progress.close()  # training is over: its bar ends before the analysis's starts
            analysis(done, total, note)

        return run_train_study(study, out, workers=workers, on_progress=on_progress, on_analysis=on_analysis)


def _check_counts(steps: int | None, save_every: int | None, seeds: int | None) -> None:
    """ValueError naming the flag unless each count given lies in [1, its maximum] (a huge --steps would
    otherwise train for ever)."""
    for flag, value, hi in (("--steps", steps, MAX_STEPS), ("--save-every", save_every, MAX_STEPS),
                            ("--seeds", seeds, MAX_SEEDS)):  # fmt: skip
        if value is not None and not 1 <= value <= hi:
            raise ValueError(f"{flag} {value} is not allowed; give an integer from 1 to {hi}")


def _tied_max(out: str, quiet: bool, seeds: int | None, steps: int | None, overrides: dict) -> dict:
    from flashcheck.training.tied_max import tied_max_report

    unused = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None and k not in ("seeds", "steps")]
    if unused:
        raise ValueError(f"{', '.join(unused)} not allowed with --preset tied-max (it takes --seeds and --steps)")
    kw = {k: v for k, v in (("seeds", seeds), ("steps", steps)) if v is not None}
    with _Progress("train-study", quiet) as on_progress:
        return tied_max_report(out, on_progress=on_progress, **kw)


def _print_train_study(summary: dict, out: str) -> None:
    from flashcheck.cli.show import verdict_text

    c = _console()
    for line in summary.get("conclusion", []):
        c.print(line, markup=False)
    if summary.get("note"):
        c.print(f"no verdicts: {summary['note']}", markup=False)
    for f in summary["findings"]:
        c.print(f"{f['id']}: {f['status']} — {verdict_text(f)}", markup=False)
        if f["status"] == "inconclusive" and "power" in f:
            c.print(f"  power: {f['power']['text']}", markup=False)
    if "ratios" in summary:
        _print_ratios(c, summary["ratios"])
    if "pairs" in summary:
        _print_pairs(c, summary["pairs"])
    cpu = summary.get("cpu")
    if cpu and cpu["runs_timed"]:
        cores = os.cpu_count() or 1
        c.print(
            f"training CPU time: {seconds_text(cpu['seconds'])} over {cpu['runs_timed']} timed runs of {cpu['runs']}; "
            f"on {cores} idle cores about {seconds_text(cpu['seconds'] / cores)}",
            markup=False,
        )
    c.print(f"report: {out}/report.html, report.md, summary.json", markup=False)


def _print_ratios(c, ratios: dict) -> None:
    from rich.table import Table

    table = Table(title="ratios over seeds (geometric mean, 95% interval)")
    for col in ("ratio", "value", "95% interval", "n"):
        table.add_column(col)
    for name, r in ratios.items():
        iv = f"[{r['low']:.3g}, {r['high']:.3g}]" if r["n"] >= 2 and math.isfinite(r["low"]) else "no interval"
        table.add_row(name, f"{r['value']:.3g}", iv, str(r["n"]))
    c.print(table)


def _print_pairs(c, pairs: dict) -> None:
    from rich.table import Table

    table = Table(title="weight deviation at the last step (per seed)")
    for col in ("pair", "seed", "Wasserstein-1", "max |A-B|", "W1 slope / step", "fit window"):
        table.add_column(col)
    for name, p in pairs.items():
        for seed, s in p["seeds"].items():
            fit = s["fit"]
            grows = fit["growing"] and fit["slope"] > 0
            window = f"steps {fit['window'][0]}-{fit['window'][1]}" + ("" if grows else " (no growth)")
            table.add_row(
                name, seed, f"{s['wasserstein'][-1]:.3e}", f"{s['max_abs'][-1]:.3e}", f"{fit['slope']:+.3e}", window
            )
    c.print(table)


@app.command()
def drift(
    a: str = typer.Argument(
        ..., metavar="A", help="Checkpoint (file, sharded, folder), folder of checkpoints by step or train-study run."
    ),
    b: str = typer.Argument(..., metavar="B", help="The same for run B."),
    sketch_points: int = typer.Option(
        4096,
        callback=_int_range("--sketch-points", 1, MAX_SKETCH_POINTS),
        help="Quantiles per tensor for the whole-model W1 of big models.",
    ),
    exact_limit: int = typer.Option(
        20_000_000,
        callback=_int_range("--exact-limit", 0, 2**63 - 1),
        help="Values up to which whole-model W1 is exact.",
    ),
    per_tensor: bool = typer.Option(True, help="Include per-tensor figures in --json."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Weight deviation between two checkpoint series: max |A - B| and Wasserstein-1, per tensor and model.
    Exit 1 when a tensor holds NaN or Inf (named on stderr)."""
    from flashcheck.training.drift import compare_series

    try:
        for flag, value in (("A", a), ("B", b)):
            if not value.strip():
                raise ValueError(f"checkpoint {flag} '' is empty; give a file or folder")
        with _Progress("drift", as_json and not sys.stderr.isatty()) as on_progress, warnings.catch_warnings():
            # torch warns about a raw pickle before refusing it; the refusal is the one line the user needs
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            pairs = compare_series(a, b, sketch_points=sketch_points, exact_limit=exact_limit, on_progress=on_progress)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        _print_drift_json(pairs, per_tensor)
    else:
        _print_drift(pairs)
    bad = [
        f"step {p.step} {name} (A: {n['a']}, B: {n['b']} of {n['numel']})"
        for p in pairs
        for name, n in p.nonfinite.items()
    ]
    if bad:
        _fail_check(
            f"NaN/Inf weights, left out of the figures: {'; '.join(bad[:20])}" + (" ..." if len(bad) > 20 else "")
        )


def _print_drift_json(pairs: list, per_tensor: bool) -> None:
    from flashcheck.training.drift import slope

    rows = []
    for p in pairs:
        d = p.to_dict()
        if not per_tensor:
            d.pop("per_tensor")
        rows.append(d)
    s = slope([p.step for p in pairs], [p.wasserstein for p in pairs])
    typer.echo(json.dumps({"pairs": rows, "slope_wasserstein": None if math.isnan(s) else s}, indent=2))


def _print_drift(pairs: list) -> None:
    from rich.table import Table

    table = Table(title="weight deviation A vs B")
    for col in ("step", "tensors", "max |A-B|", "Wasserstein-1", "method (bound)", "mismatches", "NaN/Inf tensors"):
        table.add_column(col)
    for p in pairs:
        mm = sum(len(v) for v in p.mismatches.values())
        table.add_row(
            str(p.step),
            str(len(p.per_tensor)),
            f"{p.max_abs:.3e}",
            f"{p.wasserstein:.3e}",
            f"{p.method} (±{p.wasserstein_bound:.1e})",
            str(mm) if mm else "",
            str(len(p.nonfinite)) if p.nonfinite else "",
        )
    c = _console()
    c.print(table)
    for key, items in pairs[-1].mismatches.items():
        for item in items[:10]:
            c.print(f"mismatch ({key}): {item}", markup=False)


def seconds_text(s: float) -> str:
    """'263 s', '4.2 s', '0.41 s': whole seconds from 10 s, two significant digits below (a tiny study's 0.4 s of
    training read 'about 0 s')."""
    return f"{s:.0f} s" if s >= 10 else f"{s:.2g} s"
