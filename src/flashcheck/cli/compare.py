"""`flashcheck compare`: simulators (engine mode) or real backends against the FP64 reference."""

from __future__ import annotations

import json

import typer

from flashcheck.cli.app import (
    BLOCK_MAX,
    INT64,
    Algorithm,
    Distribution,
    Fp8Scaling,
    Kernel,
    _console,
    _fail_usage,
    _int_list,
    _int_range,
    _names,
    _no_empty,
    _positive,
    _progress,
    app,
)

NUMERICS_HELP = (
    "Candidate policy (default bf16-mixed): FMT, FMT-mixed, a named policy, or KEY=VALUE terms "
    "(e.g. 'bf16-mixed,p=fp32'). With --backend: input format(s), comma-separated (default bf16)."
)
BASELINE_HELP = "Policy of the standard baseline (default: same; with --backend: plain PyTorch in the same dtype)."
DEVICE_HELP = (
    "cpu or cuda: where real backends run (default: cuda where available), or the simulators and the FP64 "
    "reference (default: cpu)."
)
DETERMINISM_HELP = "Repeated runs bit-identical, batch invariance (with --backend)."
KV_HELP = "K/V heads for grouped-query attention (divides --heads; 1 = multi-query; default: --heads)."
SEQ_LEN_K_HELP = "Key length (KV cache) when it differs from the query length, e.g. decoding: --seq-len 1."
PADDING_HELP = "Key padding: none, left:F or right:F (fraction F of the keys padded in all but the first row)."


def _positive_or_none(name: str):
    def check(value: int | None) -> int | None:
        if value is not None and value < 1:
            raise typer.BadParameter(f"{value} is not allowed; {name} must be a positive integer")
        return value

    return check


@app.command()
def compare(
    kernel: Kernel = typer.Option(Kernel.flash, help="Candidate kernel (simulator mode, without --backend)."),
    numerics: str = typer.Option(None, help=NUMERICS_HELP),
    baseline_numerics: str = typer.Option(None, help=BASELINE_HELP),
    backend: str = typer.Option(None, help="Real backends or simulators, comma-separated (see `flashcheck backends`)."),
    preset: str = typer.Option(None, help="Kernel preset for sim-flash: torch-cpu-flash, fa2-gpu, fa3-fp8."),
    algorithm: Algorithm = typer.Option(Algorithm.fa2, help="Flash algorithm."),
    block_q: int = typer.Option(128, callback=_int_range("--block-q", 1, BLOCK_MAX), help="Query block size Br."),
    block_k: int = typer.Option(128, callback=_int_range("--block-k", 1, BLOCK_MAX), help="Key block size Bc."),
    batch: int = typer.Option(1, callback=_positive("--batch")),
    heads: int = typer.Option(8, callback=_positive("--heads")),
    seq_len: str = typer.Option("1024", help="Sequence length (with --backend: a comma-separated list)."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim")),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right aligned)."),
    kv_heads: int = typer.Option(None, callback=_positive_or_none("--kv-heads"), help=KV_HELP),
    seq_len_k: int = typer.Option(None, callback=_positive_or_none("--seq-len-k"), help=SEQ_LEN_K_HELP),
    padding: str = typer.Option("none", help=PADDING_HELP),
    distribution: Distribution = typer.Option(Distribution.normal, help="Input distribution."),
    fp8_scaling: Fp8Scaling = typer.Option(None, help="FP8 input scaling of the candidate."),
    hadamard: bool = typer.Option(False, help="Hadamard incoherent processing of Q and K (candidate)."),
    backward: bool = typer.Option(False, "--backward", help="Gradients too (with --backend)."),
    determinism: bool = typer.Option(False, "--determinism", help=DETERMINISM_HELP),
    runs: int = typer.Option(5, callback=_int_range("--runs", 2, 1000), help="Repeated runs for --determinism."),
    seed: int = typer.Option(0, callback=_int_range("--seed", *INT64), help="Seed of the inputs."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure a configuration: candidate and baseline, both against the FP64 reference."""
    shape = dict(batch=batch, heads=heads, head_dim=head_dim, distribution=distribution.value, seed=seed)
    shape |= dict(kv_heads=kv_heads, seq_len_k=seq_len_k, padding=padding)
    opts = dict(causal=causal, block_q=block_q, block_k=block_k, algorithm=algorithm.value)
    opts["baseline_numerics"] = baseline_numerics
    simulators = backend is None and preset is None
    try:
        _no_empty({"--numerics": numerics, "--baseline-numerics": baseline_numerics, "--backend": backend})
        _no_empty({"--preset": preset, "--seq-len": seq_len, "--device": device})
        dev = _device(device, backend, preset)
        lengths = _int_list(seq_len, "--seq-len")
        if simulators:
            extra = (fp8_scaling.value if fp8_scaling else None, hadamard, backward or determinism)
            cfg, result = _simulate(kernel.value, numerics, lengths, extra, (shape, opts | {"device": device or "cpu"}))
        else:
            steps = {"preset": preset, "backward": backward, "determinism": runs if determinism else 0}
            cases = _backend_cases(backend or "sim-flash", numerics, lengths, (shape, opts | steps))
            results = _run_all(cases, dev, as_json)
    except ValueError as exc:
        _fail_usage(str(exc))
    if simulators:
        from flashcheck.measure.compare import compare_dict

        if as_json:
            typer.echo(json.dumps(compare_dict(cfg, result), indent=2))
        else:
            _print_compare(cfg, result)
        return
    _finish_backends(results, as_json)


def _finish_backends(results: list, as_json: bool) -> None:
    """Print the backends' results; exit 1 when a budget failed."""
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else {"backends": results}, indent=2))
    else:
        _print_backends(results)
    if any(not _passed(r) for r in results):
        raise typer.Exit(1)


def _no_padded_gradients(padding: str, backward: bool) -> None:
    if backward and padding != "none":
        raise ValueError(
            f"--padding {padding!r} with --backward: gradients on rows with no visible key are not "
            "compared here yet (eager's are NaN); use the study's padding question, or drop --backward"
        )


def _simulate(kernel: str, numerics: str | None, lengths: list[int], extra: tuple, fields: tuple[dict, dict]):
    """(CompareConfig, Record) of the simulator comparison at one length; `extra` = (fp8 scaling, hadamard,
    whether --backward or --determinism was given, which need --backend); `fields` = (input shape, options)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.compare import CompareConfig, run_compare

    fp8_scaling, hadamard, backend_only = extra
    if backend_only:
        raise ValueError("--backward and --determinism need --backend (e.g. --backend sim-flash)")
    if len(lengths) > 1:
        raise ValueError(f"--seq-len {','.join(map(str, lengths))!r}: a list needs --backend; give one length")
    shape, opts = fields
    cfg = CompareConfig(
        kernel=kernel,
        numerics=numerics or "bf16-mixed",
        inputs=InputSpec(seq_len=lengths[0], **shape),
        fp8_scaling=fp8_scaling,
        hadamard=hadamard,
        **opts,
    )
    return cfg, run_compare(cfg)


def _backend_cases(backend: str, numerics: str | None, lengths: list[int], fields: tuple[dict, dict]) -> list:
    """One BackendCase per backend x format x length; `fields` = (input shape, the other BackendCase fields)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.kernels.memory import check_all_fit
    from flashcheck.measure.compare import BackendCase, backend_footprint

    shape, opts = fields
    _no_padded_gradients(shape["padding"], opts["backward"])
    cases = [
        BackendCase(backend=name, numerics=fmt, inputs=InputSpec(seq_len=n, **shape), **opts)
        for name in _names(backend, "--backend")
        for fmt in _names(numerics or "bf16", "--numerics")
        for n in lengths
    ]
    check_all_fit(backend_footprint(c) for c in cases)
    return cases


def _device(device: str | None, backend: str | None, preset: str | None) -> str:
    """The checked --device; cuda asked for without one, or for the simulators alone, is bad usage."""
    from flashcheck.backends.base import DEVICES, cuda_unavailable_reason, default_device

    if device is None:
        return default_device()
    if device not in DEVICES:
        raise ValueError(f"--device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    if device == "cuda" and (why := cuda_unavailable_reason()):
        raise ValueError(f"--device cuda: there is no CUDA device here ({why}); use --device cpu")
    return device


def _run_all(cases: list, device: str, as_json: bool) -> list[dict]:
    """Every backend case's result on `device`, with progress on stderr when there are several."""
    from flashcheck.measure.compare import run_backend_case

    results = []
    with _progress(len(cases), "compare", as_json) as advance:
        for c in cases:
            results.append(run_backend_case(c, device=device))
            advance(note=f"{c.backend} {c.numerics} L={c.seq_len}")
    return results


def _passed(result: dict) -> bool:
    if result.get("status") != "ok":
        return result.get("status") == "skipped"
    checks = [result["budget"]["passed"]] + [g["budget"]["passed"] for g in result.get("grad", {}).values()]
    return all(checks)


def _print_backends(results: list[dict]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    console.print("errors vs FP64; ratio = max_abs / baseline's; budget = the peers' rule (k=2 fwd, 3 grads)")
    table = Table()
    for col in (
        "backend",
        "device",
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
            why = r["reason"] if r["status"] == "skipped" else r["reason"].splitlines()[0]
            skipped.append(f"{c['label']} {c['numerics']} L={c['seq_len']} on {c['device']}: {r['status']}, {why}")
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
            c.get("device", "cpu"),
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


def _print_compare(cfg, result) -> None:
    from rich.markup import escape
    from rich.table import Table

    s = cfg.inputs
    title = (
        f"{cfg.kernel} [{cfg.candidate_policy().name}] vs standard [{cfg.baseline_policy().name}]  "
        f"B={s.batch} H={s.heads} L={s.seq_len} D={s.head_dim} "
        f"blocks={cfg.block_q}x{cfg.block_k} {cfg.algorithm}{' causal' if cfg.causal else ''} "
        f"{s.distribution} seed={s.seed}"
    )
    console = _console()
    console.print(escape(title))
    table = Table()
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
    console.print(table)
