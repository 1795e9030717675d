"""The `flashcheck` command line. Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input."""

from __future__ import annotations

import json
import sys
from enum import StrEnum

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Is Flash Attention stable? Measure attention numerics against an exact FP64 reference.",
)


class Kernel(StrEnum):
    flash = "flash"
    standard = "standard"


class Algorithm(StrEnum):
    fa1 = "fa1"
    fa2 = "fa2"


class Distribution(StrEnum):
    normal = "normal"
    uniform = "uniform"
    outliers = "outliers"
    sharp = "sharp"
    tied = "tied"


class Fp8Scaling(StrEnum):
    tensor = "tensor"
    block = "block"


def _fail_usage(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _positive(name: str):
    def check(value: int) -> int:
        if value < 1:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be a positive integer")
        return value

    return check


@app.command()
def compare(
    kernel: Kernel = typer.Option(Kernel.flash, help="Candidate kernel."),
    numerics: str = typer.Option(
        "bf16-mixed",
        help="Candidate policy: FMT, FMT-mixed, a named policy, "
        "or KEY=VALUE terms (e.g. 'bf16-mixed,p=fp32').",
    ),
    baseline_numerics: str = typer.Option(None, help="Policy of the standard baseline (default: same)."),
    algorithm: Algorithm = typer.Option(Algorithm.fa2, help="Flash algorithm."),
    block_q: int = typer.Option(128, callback=_positive("--block-q"), help="Query block size Br."),
    block_k: int = typer.Option(128, callback=_positive("--block-k"), help="Key block size Bc."),
    batch: int = typer.Option(1, callback=_positive("--batch")),
    heads: int = typer.Option(8, callback=_positive("--heads")),
    seq_len: int = typer.Option(1024, callback=_positive("--seq-len")),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim")),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right aligned)."),
    distribution: Distribution = typer.Option(Distribution.normal, help="Input distribution."),
    fp8_scaling: Fp8Scaling = typer.Option(None, help="FP8 input scaling of the candidate."),
    hadamard: bool = typer.Option(False, help="Hadamard incoherent processing of Q and K (candidate)."),
    seed: int = typer.Option(0, help="Seed of the inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure one configuration: candidate and standard baseline, both against the FP64 reference."""
    from flashcheck.compare import CompareConfig, run_compare

    try:
        cfg = CompareConfig(
            kernel=kernel.value,
            numerics=numerics,
            baseline_numerics=baseline_numerics,
            algorithm=algorithm.value,
            block_q=block_q,
            block_k=block_k,
            batch=batch,
            heads=heads,
            seq_len=seq_len,
            head_dim=head_dim,
            causal=causal,
            distribution=distribution.value,
            fp8_scaling=fp8_scaling.value if fp8_scaling else None,
            hadamard=hadamard,
            seed=seed,
        )
        result = run_compare(cfg)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    _print_compare(result)


def _print_compare(result) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    cfg = result.config
    title = (
        f"{cfg.kernel} [{cfg.candidate_policy().name}] vs standard [{cfg.baseline_policy().name}]  "
        f"B={cfg.batch} H={cfg.heads} L={cfg.seq_len} D={cfg.head_dim} "
        f"blocks={cfg.block_q}x{cfg.block_k} {cfg.algorithm}{' causal' if cfg.causal else ''} "
        f"{cfg.distribution} seed={cfg.seed}"
    )
    table = Table(title=escape(title), title_justify="left")
    for col in ("metric (vs FP64)", "candidate", "baseline", "ratio", "candidate vs FP64 of rounded inputs"):
        table.add_column(col, justify="right")
    for key, value in result.candidate.items():
        table.add_row(
            key,
            f"{value:.3e}",
            f"{result.baseline[key]:.3e}",
            f"{result.ratio[key]:.3f}",
            f"{result.candidate_rounded[key]:.3e}",
        )
    Console().print(table)


class Executor(StrEnum):
    local = "local"
    ray = "ray"


@app.command()
def study(
    preset: str = typer.Option("quick", help="quick | paper | fa3 | full | tiny."),
    config: str = typer.Option(
        None, "--config", help="A TOML file defining a custom sweep (overrides --preset)."
    ),
    out: str = typer.Option("flashcheck-study", help="Folder for records, figures and the report."),
    workers: int = typer.Option(None, help="Processes (default: the core count)."),
    executor: Executor = typer.Option(Executor.local, help="local process pool or ray."),
    ray_address: str = typer.Option(
        None, help="Address of a running Ray cluster (default: start a local one)."
    ),
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Reproduce the published studies; resumable (run the same command again to continue)."""
    from flashcheck.study.config import load_config
    from flashcheck.study.config import preset as get_preset
    from flashcheck.study.report import build_report
    from flashcheck.study.runner import run_study

    try:
        if workers is not None and workers < 1:
            raise ValueError(f"--workers {workers} is not allowed; it must be a positive integer")
        cfg = load_config(config) if config else get_preset(preset)
        stats = run_study(
            cfg, out, workers=workers, executor=executor.value, ray_address=ray_address, quiet=quiet
        )
        summary = build_report(out)
    except ValueError as exc:
        _fail_usage(str(exc))
    if not quiet:
        _print_findings(summary, stats, out)


@app.command()
def report(folder: str = typer.Argument(..., help="A study folder (--out of `flashcheck study`).")) -> None:
    """Rebuild a study's figures and report from its stored records, computing nothing."""
    from flashcheck.study.report import build_report

    try:
        summary = build_report(folder)
    except ValueError as exc:
        _fail_usage(str(exc))
    _print_findings(summary, None, folder)


def _print_findings(summary: dict, stats: dict | None, out: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if stats:
        console.print(
            f"{stats['cases_computed']} cases computed, {stats['cases_reused']} reused from the store, "
            f"{stats['reference_computations']} FP64 references, {stats['seconds']:.1f} s"
        )
    for f in summary["findings"]:
        mark = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "[dim]not measured[/]"}[
            f["holds"]
        ]
        console.print(f"{escape(f['id'])}: {mark} — {escape(f['measured'])}")
    console.print(f"report: {escape(str(out))}/report.html, report.md, summary.json")


def main() -> None:
    """Entry point: run the app; typer reports bad flags with exit code 2."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


@app.callback()
def _root() -> None:
    """Is Flash Attention stable? Measure attention numerics against an exact FP64 reference."""


if __name__ == "__main__":
    main()
