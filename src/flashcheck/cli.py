"""The `flashcheck` command line. Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input."""

from __future__ import annotations

import contextlib
import dataclasses
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
    kernel: Kernel = typer.Option(Kernel.flash, help="Candidate kernel (simulator mode, without --backend)."),
    numerics: str = typer.Option(
        None,
        help="Candidate policy (default bf16-mixed): FMT, FMT-mixed, a named policy, or KEY=VALUE terms "
        "(e.g. 'bf16-mixed,p=fp32'). With --backend: input format(s), comma-separated (default bf16).",
    ),
    baseline_numerics: str = typer.Option(
        None,
        help="Policy of the standard baseline (default: same; with --backend: plain PyTorch in the same dtype).",
    ),
    backend: str = typer.Option(None, help="Real backends or simulators, comma-separated (see `flashcheck backends`)."),
    preset: str = typer.Option(None, help="Kernel preset for sim-flash: torch-cpu-flash, fa2-gpu, fa3-fp8."),
    algorithm: Algorithm = typer.Option(Algorithm.fa2, help="Flash algorithm."),
    block_q: int = typer.Option(128, callback=_positive("--block-q"), help="Query block size Br."),
    block_k: int = typer.Option(128, callback=_positive("--block-k"), help="Key block size Bc."),
    batch: int = typer.Option(1, callback=_positive("--batch")),
    heads: int = typer.Option(8, callback=_positive("--heads")),
    seq_len: str = typer.Option("1024", help="Sequence length (with --backend: a comma-separated list)."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim")),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right aligned)."),
    distribution: Distribution = typer.Option(Distribution.normal, help="Input distribution."),
    fp8_scaling: Fp8Scaling = typer.Option(None, help="FP8 input scaling of the candidate."),
    hadamard: bool = typer.Option(False, help="Hadamard incoherent processing of Q and K (candidate)."),
    backward: bool = typer.Option(False, "--backward", help="Gradients too (with --backend)."),
    determinism: bool = typer.Option(
        False, "--determinism", help="Repeated runs bit-identical, batch invariance (with --backend)."
    ),
    runs: int = typer.Option(5, callback=_positive("--runs"), help="Repeated runs for --determinism."),
    seed: int = typer.Option(0, help="Seed of the inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure a configuration: candidate and baseline, both against the FP64 reference."""
    try:
        lengths = _int_list(seq_len, "--seq-len")
        if backend is None and preset is not None:
            backend = "sim-flash"
        if backend is None:
            if backward or determinism:
                raise ValueError("--backward and --determinism need --backend (e.g. --backend sim-flash)")
            if len(lengths) > 1:
                raise ValueError(f"--seq-len {seq_len!r}: a list needs --backend; give one length")
            from flashcheck.compare import CompareConfig, run_compare

            cfg = CompareConfig(
                kernel=kernel.value,
                numerics=numerics or "bf16-mixed",
                baseline_numerics=baseline_numerics,
                algorithm=algorithm.value,
                block_q=block_q,
                block_k=block_k,
                batch=batch,
                heads=heads,
                seq_len=lengths[0],
                head_dim=head_dim,
                causal=causal,
                distribution=distribution.value,
                fp8_scaling=fp8_scaling.value if fp8_scaling else None,
                hadamard=hadamard,
                seed=seed,
            )
            result = run_compare(cfg)
        else:
            from flashcheck.backend_compare import BackendCase, run_backend_case

            cases = [
                BackendCase(
                    backend=name.strip(),
                    numerics=fmt.strip(),
                    seq_len=n,
                    batch=batch,
                    heads=heads,
                    head_dim=head_dim,
                    causal=causal,
                    distribution=distribution.value,
                    seed=seed,
                    preset=preset,
                    block_q=block_q,
                    block_k=block_k,
                    algorithm=algorithm.value,
                    baseline_numerics=baseline_numerics,
                    backward=backward,
                    determinism=runs if determinism else 0,
                )
                for name in backend.split(",")
                for fmt in (numerics or "bf16").split(",")
                for n in lengths
            ]
            results = [run_backend_case(c) for c in cases]
    except ValueError as exc:
        _fail_usage(str(exc))
    if backend is None:
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
        else:
            _print_compare(result)
        return
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else {"backends": results}, indent=2))
    else:
        _print_backends(results)
    if any(not _passed(r) for r in results):
        raise typer.Exit(1)


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} {text!r} is not allowed; give positive integers, comma-separated")
    return vals


def _passed(result: dict) -> bool:
    if result.get("status") != "ok":
        return True
    checks = [result["budget"]["passed"]] + [g["budget"]["passed"] for g in result.get("grad", {}).values()]
    return all(checks)


def _print_backends(results: list[dict]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 170)
    table = Table(title="errors vs FP64; ratio = max_abs / baseline's; budget = the peers' rule (k=2 fwd, 3 grads)")
    for col in (
        "backend",
        "fmt",
        "L",
        "rel_l2",
        "max_abs",
        "baseline",
        "ratio",
        "budget",
        "kernel ran",
        "checks",
    ):
        table.add_column(col)
    skipped = []
    for r in results:
        c = r["config"]
        if r["status"] != "ok":
            skipped.append(f"{c['label']} {c['numerics']} L={c['seq_len']}: skipped, {r['reason']}")
            continue
        ops = [o for o in r["kernel_ops"] if o != "aten::scaled_dot_product_attention"]
        ops = (ops[0].replace("aten::", "") if ops else "-")[:40]
        grads = " ".join(f"{k}:{'ok' if g['budget']['passed'] else 'FAIL'}" for k, g in r.get("grad", {}).items())
        det = r.get("determinism")
        if det:
            grads += f" det:{'ok' if det['forward_identical'] and det.get('backward_identical', True) else 'NO'}"
            grads += f" batch:{'ok' if det['batch_invariant'] else 'NO'}"
        table.add_row(
            escape(c["label"]),
            c["numerics"],
            str(c["seq_len"]),
            f"{r['candidate']['rel_l2']:.3e}",
            f"{r['candidate']['max_abs']:.3e}",
            escape(r["baseline_impl"]),
            f"{r['ratio']['max_abs']:.2f}",
            "pass" if r["budget"]["passed"] else "FAIL",
            escape(ops),
            grads,
        )
    console.print(table)
    for line in skipped:
        console.print(escape(line))


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


@app.command()
def backends(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the attention backends, whether each can run here, and why not."""
    from flashcheck.backends import all_backends

    rows = []
    for b in all_backends():
        a = b.available()
        rows.append(
            {
                "name": b.name,
                "available": a.ok,
                "reason": a.reason,
                "description": b.description,
                "dtypes": [str(d).replace("torch.", "") for d in b.dtypes],
                "device": str(b.device()),
                "backward": b.backward_reason() is None,
                "proof_ops": list(b.ops),
            }
        )
    if as_json:
        typer.echo(json.dumps({"backends": rows}, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="attention backends")
    for col in ("name", "here", "why not / what", "dtypes"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"],
            "[green]yes[/]" if r["available"] else "[red]no[/]",
            escape(r["reason"] or r["description"]),
            ", ".join(r["dtypes"]),
        )
    Console(width=None if sys.stdout.isatty() else 140).print(table)


@app.command()
def explain(
    numerics: str = typer.Option("bf16-mixed", help="The policy to explain (or the format with --preset)."),
    preset: str = typer.Option(
        None, help="Explain a kernel preset (torch-cpu-flash, fa2-gpu, fa3-fp8) at format --numerics."
    ),
    kernel: Kernel = typer.Option(Kernel.flash),
    algorithm: Algorithm = typer.Option(Algorithm.fa2),
    block_q: int = typer.Option(128, callback=_positive("--block-q")),
    block_k: int = typer.Option(128, callback=_positive("--block-k")),
    batch: int = typer.Option(1, callback=_positive("--batch")),
    heads: int = typer.Option(8, callback=_positive("--heads")),
    seq_len: int = typer.Option(1024, callback=_positive("--seq-len")),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim")),
    causal: bool = typer.Option(False),
    distribution: Distribution = typer.Option(Distribution.normal),
    metric: str = typer.Option("rel_l2", help="max_abs, mean_abs, rmse or rel_l2."),
    seed: int = typer.Option(0),
    out: str = typer.Option("flashcheck-explain", help="Folder for summary.json and figures/explain.png."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Which stage causes the deviation: each stage alone in low precision, each alone raised to FP64."""
    from pathlib import Path

    from flashcheck.explain import attribute, draw
    from flashcheck.fileio import write_atomic
    from flashcheck.inputs import InputSpec
    from flashcheck.numerics import parse_policy

    try:
        if metric not in ("max_abs", "mean_abs", "rmse", "rel_l2"):
            raise ValueError(f"--metric {metric!r}; expected one of max_abs, mean_abs, rmse, rel_l2")
        exp2 = False
        if preset:
            from flashcheck.kernels.presets import resolve

            kw = resolve(preset, numerics, seq_len, seq_len, head_dim, causal)
            pol, block_q, block_k, alg, exp2 = (
                kw["policy"],
                kw["block_q"],
                kw["block_k"],
                kw["algorithm"],
                kw["exp2"],
            )
        else:
            pol, alg = parse_policy(numerics), algorithm.value
        spec = InputSpec(
            batch=batch,
            heads=heads,
            seq_len=seq_len,
            head_dim=head_dim,
            distribution=distribution.value,
            seed=seed,
        )
        attr = attribute(
            pol,
            spec,
            kernel=kernel.value,
            block_q=block_q,
            block_k=block_k,
            algorithm=alg,
            causal=causal,
            exp2=exp2,
            metric=metric,
        )
        folder = Path(out)
        (folder / "figures").mkdir(parents=True, exist_ok=True)
    except ValueError as exc:
        _fail_usage(str(exc))
    except OSError as exc:
        _fail_usage(f"--out {out!r} is not writable: {exc.strerror or exc}")
    data = {
        **attr.to_dict(),
        "config": {
            "kernel": kernel.value,
            "block_q": block_q,
            "block_k": block_k,
            "algorithm": alg,
            "exp2": exp2,
            "preset": preset,
            **dataclasses.asdict(spec),
        },
    }
    write_atomic(folder / "summary.json", json.dumps(data, indent=2))
    with contextlib.suppress(ImportError):  # matplotlib is optional: the table still prints
        draw(attr, folder / "figures" / "explain.png")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{metric} vs FP64 of {pol.name}: full {attr.full:.3e}; output rounding alone explains "
        f"{100 * attr.output_share:.0f}%; dominant stage: {attr.dominant}"
    )
    for col in ("stage", "format", "alone (others FP64)", "raised to FP64 (others as policy)"):
        table.add_column(col)
    from flashcheck.numerics import STAGES

    for st in STAGES:
        table.add_row(st, pol.stage(st).value, f"{attr.alone[st]:.3e}", f"{attr.raised[st]:.3e}")
    Console(width=None if sys.stdout.isatty() else 140).print(table)


@app.command()
def doctor(
    seq_len: int = typer.Option(1024, callback=_positive("--seq-len"), help="Shape for SDPA's choice."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim")),
    dtype: str = typer.Option("bf16", help="dtype for SDPA's choice: fp32, bf16, fp16."),
    causal: bool = typer.Option(False),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Why flash attention will or will not run here."""
    from flashcheck.doctor import diagnose
    from flashcheck.numerics import info, parse_format

    try:
        fmt = parse_format(dtype)
        if fmt.value not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"--dtype {dtype!r}; expected fp32, bf16 or fp16")
    except ValueError as exc:
        _fail_usage(str(exc))
    report = diagnose((1, 8, seq_len, head_dim), info(fmt).dtype, causal)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    c = Console(width=None if sys.stdout.isatty() else 140)
    c.print(
        f"OS {escape(report['os'])}; Python {report['python']}; torch {report['torch']}; CUDA {report['cuda']}; "
        f"cuDNN {report['cudnn']}"
    )
    c.print(f"GPU: {report['gpu'] or 'none visible'}")
    fa = report["flash_attn"]
    if fa["importable"]:
        c.print("flash-attn: importable")
    else:
        c.print(f"flash-attn: not importable; this environment needs the wheel {escape(fa['wheel_tag'])}")
        for p in fa["problems"]:
            c.print(f"  - {escape(p)}")
    c.print(f"SDPA backends enabled: {report['sdpa_backends_enabled']}")
    ch = report["sdpa_choice"]
    c.print(
        f"SDPA picks for {ch.get('shape')} {ch.get('dtype')} on {ch['device']}: "
        f"{escape(str(ch.get('kernel') or ch.get('error')))}"
    )
    c.print(f"determinism: {report['determinism']}")
    for b in report["backends"]:
        c.print(f"  {b['name']:<16} {'yes' if b['available'] else 'no: ' + escape(b['reason'])}")


@app.command("train-study")
def train_study(
    preset: str = typer.Option("quick", help="quick | paper | full | tiny | tied-max."),
    out: str = typer.Option("flashcheck-train-study", help="Folder for runs, figures and the report."),
    workers: int = typer.Option(None, help="Runs trained in parallel (default: the core count)."),
    quiet: bool = typer.Option(False),
) -> None:
    """Train runs that differ in one factor (attention, format, seed) and compare their weights."""
    try:
        if workers is not None and workers < 1:
            raise ValueError(f"--workers {workers} is not allowed; it must be a positive integer")
        if preset == "tied-max":
            from flashcheck.training.tied_max import tied_max_report

            summary = tied_max_report(out)
        else:
            from flashcheck.training.study import run_train_study, train_preset

            summary = run_train_study(train_preset(preset), out, workers=workers, quiet=quiet)
    except ValueError as exc:
        _fail_usage(str(exc))
    if not quiet:
        for f in summary["findings"]:
            typer.echo(f"{f['id']}: {'holds' if f['holds'] else 'does not hold'} — {f['measured']}")
        typer.echo(f"report: {out}/report.html, report.md, summary.json")


@app.command()
def drift(
    a: str = typer.Argument(..., help="Checkpoint file or folder of checkpoints named by step (run A)."),
    b: str = typer.Argument(..., help="The same for run B."),
    sketch_points: int = typer.Option(
        4096, callback=_positive("--sketch-points"), help="Quantiles per tensor for the whole-model W1 of big models."
    ),
    exact_limit: int = typer.Option(20_000_000, help="Values up to which whole-model W1 is exact."),
    per_tensor: bool = typer.Option(True, help="Include per-tensor figures in --json."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Weight deviation between two checkpoint series: max |A - B| and Wasserstein-1, per tensor and model."""
    from flashcheck.training.drift import compare_series, slope

    try:
        pairs = compare_series(a, b, sketch_points=sketch_points, exact_limit=exact_limit)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        rows = []
        for p in pairs:
            d = p.to_dict()
            if not per_tensor:
                d.pop("per_tensor")
            rows.append(d)
        typer.echo(
            json.dumps(
                {"pairs": rows, "slope_wasserstein": slope([p.step for p in pairs], [p.wasserstein for p in pairs])},
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="weight deviation A vs B")
    for col in ("step", "max |A-B|", "Wasserstein-1", "method (bound)", "mismatches"):
        table.add_column(col)
    for p in pairs:
        mm = sum(len(v) for v in p.mismatches.values())
        table.add_row(
            str(p.step),
            f"{p.max_abs:.3e}",
            f"{p.wasserstein:.3e}",
            f"{p.method} (±{p.wasserstein_bound:.1e})",
            str(mm) if mm else "",
        )
    c = Console(width=None if sys.stdout.isatty() else 140)
    c.print(table)
    for key, items in pairs[-1].mismatches.items():
        for item in items[:10]:
            c.print(f"mismatch ({key}): {item}")


class Executor(StrEnum):
    local = "local"
    ray = "ray"


@app.command()
def study(
    preset: str = typer.Option("quick", help="quick | paper | fa3 | full | tiny."),
    config: str = typer.Option(None, "--config", help="A TOML file defining a custom sweep (overrides --preset)."),
    out: str = typer.Option("flashcheck-study", help="Folder for records, figures and the report."),
    workers: int = typer.Option(None, help="Processes (default: the core count)."),
    executor: Executor = typer.Option(Executor.local, help="local process pool or ray."),
    ray_address: str = typer.Option(None, help="Address of a running Ray cluster (default: start a local one)."),
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
        stats = run_study(cfg, out, workers=workers, executor=executor.value, ray_address=ray_address, quiet=quiet)
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
        mark = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "[dim]not measured[/]"}[f["holds"]]
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
