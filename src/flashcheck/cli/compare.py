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
    _splits_fit,
    app,
)

NUMERICS_HELP = (
    "Candidate policy (default bf16-mixed): FMT, FMT-mixed, a named policy, or KEY=VALUE terms "
    "(e.g. 'bf16-mixed,p=fp32'). With --backend: input format(s), comma-separated (default bf16)."
)
BACKEND_HELP = (
    "Real backends or simulators, comma-separated (see `flashcheck backends`); NAME:FMT runs NAME at FMT alone "
    "(e.g. onnxruntime:fp16 beside --numerics bf16)."
)
BASELINE_HELP = "Policy of the standard baseline (default: same; with --backend: plain PyTorch in the same dtype)."
DEVICE_HELP = (
    "cpu or cuda: where real backends run (default: cuda where available), or the simulators and the FP64 "
    "reference (default: cpu)."
)
DETERMINISM_HELP = "Repeated runs bit-identical, batch invariance (with --backend)."
KV_HELP = "K/V heads for grouped-query attention (divides --heads; 1 = multi-query; default: --heads)."
SEQ_LEN_K_HELP = "Key length (KV cache) when it differs from the query length, e.g. decoding: --seq-len 1."
PADDING_HELP = (
    "Key padding: none, left:F or right:F (batch element b of B pads a fraction F*(b+1)/B of its keys, at least "
    "one and at most all but one; errors count only the query rows with a visible key)."
)
HADAMARD_HELP = "Hadamard incoherent processing of Q and K in the candidate, on or off (default: as its policy has it)."
SPLITS_HELP = (
    "Split-KV decoding: the splitkv kernel with S key chunks merged through their log-sum-exps, for each S of a "
    "comma-separated list (each at most the key blocks ceil(Lk / block_k)), beside the flash kernel (use with "
    "--seq-len-k; simulators only, forward only)."
)
BACKWARD_HELP = "dQ, dK, dV errors vs FP64 too: candidate and standard baseline under their policies."
DELTA_SOURCE_HELP = (
    "Which O the flash backward's delta = rowsum(dO*O) reads: forward (its rounded output, the default), "
    "unrounded, or fresh (a new stochastic rounding); needs --backward (arXiv 2609.39813)."
)
PRESET_HELP = (
    "Kernel preset for sim-flash: torch-cpu-flash, jax-xla, jax-xla-fused, fa2-gpu, fa3-fp8, fa3-fp8-fp22, fa4-bf16, "
    "fa4-fp8, fa4-fp4, sage1, sage2, sage2-4b, sage2pp, sage3-fp4 (default --numerics: the preset's own input format)."
)
CASE_HELP = (
    "A `flashcheck hunt` finding's case (KEY=VALUE,...): rerun it on --backend (then any hunt TARGET) and judge it "
    "as the hunt did; the other shape options are ignored."
)
DS_CORRECTION_HELP = "Remove the row sums of the rounded dS in the flash backward (arXiv 2609.34272); needs --backward."


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
    backend: str = typer.Option(None, help=BACKEND_HELP),
    preset: str = typer.Option(None, help=PRESET_HELP),
    algorithm: Algorithm = typer.Option(Algorithm.fa2, help="Flash algorithm."),
    block_q: int = typer.Option(128, callback=_int_range("--block-q", 1, BLOCK_MAX), help="Query block size Br."),
    block_k: int = typer.Option(128, callback=_int_range("--block-k", 1, BLOCK_MAX), help="Key block size Bc."),
    batch: int = typer.Option(1, callback=_positive("--batch"), help="Batch size B."),
    heads: int = typer.Option(8, callback=_positive("--heads"), help="Query heads H."),
    seq_len: str = typer.Option("1024", help="Sequence length (with --backend: a comma-separated list)."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim"), help="Head dim D."),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right aligned)."),
    kv_heads: int = typer.Option(None, callback=_positive_or_none("--kv-heads"), help=KV_HELP),
    seq_len_k: int = typer.Option(None, callback=_positive_or_none("--seq-len-k"), help=SEQ_LEN_K_HELP),
    padding: str = typer.Option("none", help=PADDING_HELP),
    distribution: Distribution = typer.Option(Distribution.normal, help="Input distribution."),
    fp8_scaling: Fp8Scaling = typer.Option(None, help="FP8 input scaling of the candidate."),
    hadamard: bool = typer.Option(None, "--hadamard/--no-hadamard", help=HADAMARD_HELP),
    splits: str = typer.Option(None, help=SPLITS_HELP),
    backward: bool = typer.Option(False, "--backward", help=BACKWARD_HELP),
    delta_source: str = typer.Option(None, help=DELTA_SOURCE_HELP),
    ds_correction: bool = typer.Option(False, "--ds-correction", help=DS_CORRECTION_HELP),
    determinism: bool = typer.Option(False, "--determinism", help=DETERMINISM_HELP),
    runs: int = typer.Option(5, callback=_int_range("--runs", 2, 1000), help="Repeated runs for --determinism."),
    seed: int = typer.Option(0, callback=_int_range("--seed", *INT64), help="Seed of the inputs."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    case: str = typer.Option(None, help=CASE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure a configuration: candidate and baseline, both against the FP64 reference."""
    if case is not None:
        from flashcheck.cli.hunt import rerun_case

        rerun_case(backend, case, device, as_json)
    shape = dict(batch=batch, heads=heads, head_dim=head_dim, distribution=distribution.value, seed=seed)
    shape |= dict(kv_heads=kv_heads, seq_len_k=seq_len_k, padding=padding)
    opts = dict(causal=causal, block_q=block_q, block_k=block_k, algorithm=algorithm.value)
    opts |= {"baseline_numerics": baseline_numerics, "backward": backward}
    knobs = {"--splits": splits, "--delta-source": delta_source, "--ds-correction": ds_correction or None}
    simulators = backend is None and preset is None
    try:
        _no_empty({"--numerics": numerics, "--baseline-numerics": baseline_numerics, "--backend": backend})
        _no_empty({"--preset": preset, "--seq-len": seq_len, "--device": device} | knobs)
        dev = _device(device, backend, preset)
        _kv_divides(heads, kv_heads)
        lengths = _int_list(seq_len, "--seq-len")
        if simulators:
            extra = (fp8_scaling.value if fp8_scaling else None, hadamard, determinism)
            cfgs = _sim_configs(
                kernel.value, numerics, lengths, (extra, knobs), (shape, opts | {"device": device or "cpu"})
            )
            records = _run_sims(cfgs, as_json)
        else:
            _simulators_only(knobs)
            steps = {"preset": preset, "determinism": runs if determinism else 0}
            cases = _backend_cases(backend or "sim-flash", numerics, lengths, (shape, opts | steps))
            results = _run_all(cases, dev, as_json)
    except ValueError as exc:
        _fail_usage(str(exc))
    if simulators:
        _finish_sims(cfgs, records, as_json)
    else:
        _finish_backends(results, as_json)


def _finish_sims(cfgs: list, records: list, as_json: bool) -> None:
    """Print the simulator comparison: one configuration's table (and its gradients' with --backward), or
    the split-KV decoding table of several."""
    from flashcheck.measure.compare import compare_dict

    if as_json:
        dicts = [compare_dict(c, r) for c, r in zip(cfgs, records, strict=True)]
        typer.echo(json.dumps(dicts[0] if len(dicts) == 1 else {"comparisons": dicts}, indent=2))
    elif len(cfgs) == 1:
        _print_compare(cfgs[0], records[0])
        if records[0].grad is not None:
            _print_grads(cfgs[0], records[0])
    else:
        _print_decoding(cfgs, records)


def _finish_backends(results: list, as_json: bool) -> None:
    """Print the backends' results; exit 1 when a budget failed, 2 when no case could run here (each skipped,
    with its reason: a GPU-only backend on the CPU is a request this machine cannot serve)."""
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else {"backends": results}, indent=2))
    else:
        _print_backends(results)
    if any(not _passed(r) for r in results):
        raise typer.Exit(1)
    if results and all(r.get("status") == "skipped" for r in results):
        raise typer.Exit(2)


def _no_padded_gradients(padding: str, backward: bool) -> None:
    if backward and padding != "none":
        raise ValueError(
            f"--padding {padding!r} with --backward: gradients on rows with no visible key are not "
            "compared here yet (eager's are NaN); use the study's padding question, or drop --backward"
        )


def _kv_divides(heads: int, kv_heads: int | None) -> None:
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"--kv-heads {kv_heads} must be a positive divisor of --heads {heads}")


def _sim_configs(kernel: str, numerics: str | None, lengths: list[int], extra: tuple, fields: tuple[dict, dict]):
    """The simulator comparison's CompareConfigs at one length: one, or with --splits flash then splitkv at
    each S. `extra` = ((fp8 scaling, hadamard, --determinism), the decoding/backward knobs by flag);
    `fields` = (input shape, options)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.compare import CompareConfig, decoding_configs

    (fp8_scaling, hadamard, determinism), knobs = extra
    if determinism:
        raise ValueError("--determinism needs --backend (e.g. --backend sim-flash)")
    if len(lengths) > 1:
        raise ValueError(f"--seq-len {','.join(map(str, lengths))!r}: a list needs --backend; give one length")
    shape, opts = fields
    splits = _sim_knobs(kernel, knobs, opts["backward"])
    cfg = CompareConfig(
        kernel=kernel,
        numerics=numerics or "bf16-mixed",
        inputs=InputSpec(seq_len=lengths[0], **shape),
        fp8_scaling=fp8_scaling,
        hadamard=hadamard,
        delta_source=knobs["--delta-source"],
        ds_correction=bool(knobs["--ds-correction"]),
        **opts,
    )
    if splits:
        _splits_fit(splits, cfg.inputs.lk, cfg.block_k)
    return decoding_configs(cfg, splits) if splits else [cfg]


def _sim_knobs(kernel: str, knobs: dict, backward: bool) -> list[int] | None:
    """The checked --splits list (None without it); ValueError for a knob that does not fit the others."""
    from flashcheck.core.numerics import DELTA_SOURCES

    source = knobs["--delta-source"]
    if source is not None and source not in DELTA_SOURCES:
        raise ValueError(f"--delta-source {source!r} is not allowed; expected one of {', '.join(DELTA_SOURCES)}")
    backward_knobs = [f for f in ("--delta-source", "--ds-correction") if knobs[f] is not None]
    if backward_knobs and not backward:
        raise ValueError(f"{_are(backward_knobs)} settings of the backward pass; add --backward")
    if backward_knobs and kernel != "flash":
        raise ValueError(f"{_are(backward_knobs)} settings of the flash kernel's backward; drop --kernel {kernel}")
    if kernel == "splitkv" and backward:
        raise ValueError("--kernel splitkv (split-KV decoding) runs forward only; drop --backward")
    if knobs["--splits"] is None:
        return None
    splits = _int_list(knobs["--splits"], "--splits")
    if backward:
        raise ValueError("--splits runs the splitkv kernel (split-KV decoding), which is forward only; drop --backward")
    if kernel == "standard":
        raise ValueError("--splits compares the splitkv kernel with flash; drop --kernel standard")
    return list(dict.fromkeys(splits))


def _simulators_only(knobs: dict) -> None:
    given = [f for f, v in knobs.items() if v is not None]
    if given:
        raise ValueError(f"{_are(given)} settings of the simulators; drop --backend and --preset to use them")


def _are(flags: list[str]) -> str:
    return f"{flags[0]} is one of the" if len(flags) == 1 else f"{' and '.join(flags)} are"


def _run_sims(cfgs: list, as_json: bool) -> list:
    """The Records of the simulator comparisons (inputs and FP64 references drawn once), with progress on
    stderr when there are several."""
    from flashcheck.measure.compare import run_compares

    with _progress(len(cfgs), "compare", as_json) as advance:
        return run_compares(cfgs, done=lambda c: advance(note=_sim_name(c)))


def _sim_name(cfg) -> str:
    return f"splitkv S={cfg.splits}" if cfg.kernel == "splitkv" and cfg.splits else cfg.kernel


def _backend_cases(backend: str, numerics: str | None, lengths: list[int], fields: tuple[dict, dict]) -> list:
    """One BackendCase per backend x format x length; `fields` = (input shape, the other BackendCase fields)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.kernels.memory import check_all_fit
    from flashcheck.measure.compare import BackendCase, backend_footprint

    shape, opts = fields
    _no_padded_gradients(shape["padding"], opts["backward"])
    formats = _names(numerics or _preset_format(opts.get("preset")), "--numerics")
    pairs = [
        (name, [fmt] if fmt else formats) for name, _, fmt in (b.partition(":") for b in _names(backend, "--backend"))
    ]
    _packages_present([name for name, _ in pairs])
    cases = [
        BackendCase(backend=name, numerics=fmt, inputs=InputSpec(seq_len=n, **shape), **opts)
        for name, fmts in pairs
        for fmt in fmts
        for n in lengths
    ]
    check_all_fit(backend_footprint(c) for c in cases)
    return cases


def _packages_present(names: list[str]) -> None:
    """ValueError (one line naming the extra to install) for a backend asked for by name whose optional package
    is missing: an explicit request is bad usage here, not a skipped row."""
    from flashcheck.backends import get_backend

    for name in dict.fromkeys(names):
        if why := get_backend(name).missing_package():
            raise ValueError(f"--backend {name}: {why}")


def _preset_format(preset: str | None) -> str:
    """The format a backend case runs without --numerics: the preset's own (fa3-fp8: fp8-e4m3), else bf16."""
    from flashcheck.kernels.presets import default_format

    return default_format(preset)


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
    """Every backend case's result on `device`, with progress on stderr when there are several: the case
    running now (a bar's note; a plain line when the last line is older than the interval) and each done."""
    from flashcheck.measure.compare import run_backend_case

    results = []
    with _progress(len(cases), "compare", as_json) as advance:
        for c in cases:
            name = f"{c.backend} {c.numerics} L={c.seq_len}"
            advance(0, note=f"running {name}")
            results.append(run_backend_case(c, device=device))
            advance(note=name)
    return results


def _passed(result: dict) -> bool:
    if result.get("status") != "ok":
        return result.get("status") == "skipped"
    checks = [result["budget"]["passed"]] + [g["budget"]["passed"] for g in result.get("grad", {}).values()]
    return all(checks)


def _rule_line(results: list[dict]) -> str:
    """The budget rule of the results, short enough for an 80-column line: the peers' (k=2 forward, 3 gradients)
    or flashcheck's (calibrated k; rel_l2, bias and row checks)."""
    rules = {r["budget"].get("rule", "peers") for r in results if r.get("status") == "ok"}
    return "flashcheck's rule" if rules == {"flashcheck"} else "the peers' rule"


def _print_backends(results: list[dict]) -> None:
    """The results' table (none when every case was skipped or failed), then one line per case not run."""
    from rich.markup import escape

    console = _console()
    cols = ("backend", "device", "fmt", "L", "rel_l2", "max_abs", "baseline", "ratio", "budget", "kernel ran", "checks")
    rows, skipped = [], []
    for r in results:
        c = r["config"]
        if r["status"] != "ok":
            why = r["reason"] if r["status"] == "skipped" else r["reason"].splitlines()[0]
            skipped.append(f"{c['label']} {c['numerics']} L={c['seq_len']} on {c['device']}: {r['status']}, {why}")
            continue
        # public op names only (aten::...), not an autograd Function's class name (_FlashFunction, _JaxAttention)
        ops = [o for o in r["kernel_ops"] if "::" in o and o != "aten::scaled_dot_product_attention"]
        ops = ops[0].replace("aten::", "") if ops else ""
        grads = " ".join(f"{k}:{'ok' if g['budget']['passed'] else 'FAIL'}" for k, g in r.get("grad", {}).items())
        det = r.get("determinism")
        if det:
            grads += f" det:{'ok' if det['forward_identical'] and det.get('backward_identical', True) else 'NO'}"
            grads += f" batch:{'ok' if det['batch_invariant'] else 'NO'}"
        rows.append(
            [
                c["label"],
                c.get("device", "cpu"),
                c["numerics"],
                str(c["seq_len"]),
                f"{r['candidate']['rel_l2']:.3e}",
                f"{r['candidate']['max_abs']:.3e}",
                r["baseline_impl"],
                f"{r['ratio']['max_abs']:.2f}",
                "pass" if r["budget"]["passed"] else "FAIL",
                ops,
                grads.strip(),
            ]
        )
    if rows:
        console.print(f"errors vs FP64; ratio = max_abs / baseline's; budget = {_rule_line(results)}")
        print_whole(console, cols, rows)
    ok = [r for r in results if r["status"] == "ok"]
    if len(ok) == 1:  # one case: every metric, as plain compare prints them
        _print_metrics(console, ok[0])
    for r in ok:
        if not r["budget"]["passed"]:
            console.print(escape(_why_failed(r)), soft_wrap=True)
    for line in skipped:
        console.print(escape(line))


def _print_metrics(console, r: dict) -> None:
    """One result's metrics: candidate, baseline, ratio and the candidate vs FP64 of its rounded inputs."""
    cols = ("metric (vs FP64)", "candidate", "baseline", "ratio", "vs rounded inputs")
    rounded = r["vs_rounded_inputs"]["candidate"]
    rows = [
        [m, f"{v:.3e}", f"{r['baseline'][m]:.3e}", f"{r['ratio'][m]:.3f}", f"{rounded[m]:.3e}"]
        for m, v in r["candidate"].items()
    ]
    print_whole(console, cols, rows)
    if all(rounded.get(m) == v for m, v in r["candidate"].items()):
        console.print(f"vs rounded inputs equals the candidate: {_why_not_rounded(r)}", markup=False, soft_wrap=True)


def _why_not_rounded(r: dict) -> str:
    """Why the reference of the rounded inputs is the original inputs' (issue 34: an equal column, unexplained)."""
    fmt = r["config"]["numerics"]
    if fmt.startswith("fp64"):
        return f"{fmt} inputs are not rounded, so both references are the same"
    if fmt.startswith("fp8"):
        return (
            f"this method scales and quantises its {fmt} inputs inside the kernel, a step flashcheck does not "
            "repeat outside it, so that reference is the FP64 output of the original inputs"
        )
    return "the method sees its inputs unrounded, so both references are the same"


def _why_failed(r: dict) -> str:
    """One line: which budget check failed, its value and bound, and what the bound was built from."""
    b, c = r["budget"], r["config"]
    failed = "; ".join(f"{x['name']} {x['value']:.3e} > {x['bound']:.3e}" for x in b["checks"] if not x["passed"])
    line = (
        f"{c['label']} {c['numerics']} L={c['seq_len']} FAIL ({b['rule']} rule): {failed}; bound = k {b['k']:g} x "
        f"{r['baseline_impl']}'s error (max {r['baseline']['max_abs']:.3e}) + floor {b['floor']:.2e}"
    )
    if c.get("preset") and r["baseline_impl"].startswith("eager:"):
        line += (
            f"; preset {c['preset']} quantises inside the kernel below its input format {c['numerics']} (its Q, K "
            "or P), which eager does not: to judge it beside FP8 attention give --baseline-numerics baseline-fp8 "
            "(standard attention with per-tensor FP8 inputs), or another standard policy as the yardstick"
        )
    return line


def print_whole(console, cols: tuple[str, ...], rows: list[list[str]], prose: tuple[str, ...] = ()) -> None:
    """Rows of plain strings as a table whose every cell is whole: columns empty in every row dropped, no cell
    cut, none wrapped but the `prose` columns (at spaces, given at most 30 columns); where that table is wider
    than the console, one block per row (column: value) instead."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    keep = [i for i in range(len(cols)) if any(row[i] for row in rows)]
    cols, rows = [cols[i] for i in keep], [[row[i] or "-" for i in keep] for row in rows]
    widths = [max(len(col), *(len(row[i]) for row in rows)) for i, col in enumerate(cols)]
    need = [min(w, 30) if col in prose else w for col, w in zip(cols, widths, strict=True)]
    # boxed (a cell's padding 1 + 1 and a rule between cells), else unboxed (two spaces between cells)
    for style, extra in ((box.HEAVY_HEAD, 3 * len(cols) + 1), (None, 2 * len(cols) - 2)):
        if sum(need) + extra <= console.width:
            table = Table(box=style, pad_edge=style is not None)
            for col, w in zip(cols, need, strict=True):
                table.add_column(escape(col), no_wrap=col not in prose, min_width=w)
            for row in rows:
                table.add_row(*map(escape, row))
            console.print(table)
            return
    w = max(map(len, cols[1:]))
    for row in rows:
        console.print(escape(row[0]), soft_wrap=True)
        for col, cell in zip(cols[1:], row[1:], strict=True):
            console.print(escape(f"  {col:<{w}}  {cell}"), soft_wrap=True)


def _shape(cfg) -> str:
    """The inputs and kernel settings of a heading: B, H (Hkv), L (Lk), D, blocks, algorithm, mask, inputs."""
    s = cfg.inputs
    heads = f"H={s.heads}" + (f" Hkv={s.kv_heads}" if s.kv_heads else "")
    lens = f"L={s.seq_len}" + (f" Lk={s.seq_len_k}" if s.seq_len_k else "")
    pad = f" padding={s.padding}" if s.padding != "none" else ""
    return (
        f"B={s.batch} {heads} {lens} D={s.head_dim} blocks={cfg.block_q}x{cfg.block_k} {cfg.algorithm}"
        f"{' causal' if cfg.causal else ''}{pad} {s.distribution} seed={s.seed}"
    )


def _policy_label(pol, named: str | None = None) -> str:
    """A policy's name, with every knob a flag set apart from the named policy's own (hadamard, FP8 scaling,
    delta_source, ds_correction): they do not show in the name."""
    from flashcheck.core.numerics import parse_policy

    base = parse_policy(named) if named else None
    knobs = []
    if base is not None and pol.hadamard != base.hadamard:
        knobs.append("hadamard" if pol.hadamard else "no hadamard")
    if base is not None and pol.fp8_scaling != base.fp8_scaling:
        knobs.append(f"fp8_scaling={pol.fp8_scaling}")
    knobs += [f"delta_source={pol.delta_source}"] if pol.delta_source != "forward" else []
    knobs += ["ds_correction"] if pol.ds_correction else []
    return ", ".join([pol.name, *knobs])


def _print_compare(cfg, result) -> None:
    from rich.markup import escape
    from rich.table import Table

    splits = f"S={cfg.case().method.splits} ({cfg.chunks()} chunks) " if cfg.kernel == "splitkv" else ""
    title = (
        f"{cfg.kernel} [{_policy_label(cfg.candidate_policy(), cfg.numerics)}] vs standard "
        f"[{_policy_label(cfg.baseline_policy())}]  "
        f"{splits}{_shape(cfg)}"
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
    if cfg.inputs.padding != "none":
        console.print(escape(padding_counts(cfg.inputs, cfg.causal)))


def padding_counts(spec, causal: bool) -> str:
    """What a padded comparison counted: the keys each batch row keeps and the query rows with a visible key
    (the only rows in the errors), from the same mask the measurement uses."""
    import torch

    from flashcheck.core.inputs import make_mask

    mask = make_mask(spec)[:, 0]  # bool [B, Lq, Lk], as the measurement builds it (no L x L float bias here)
    keys = mask.any(dim=-2).sum(dim=-1).tolist()  # [B]: keys some query row sees
    rows = mask.any(dim=-1)
    if causal:  # bottom-right aligned: row i sees key j <= i + Lk - Lq, so its first kept key must be one of them
        first = mask.to(torch.uint8).argmax(dim=-1)
        rows &= first <= torch.arange(spec.seq_len) + (spec.lk - spec.seq_len)
    live, total = int(rows.sum()), spec.batch * spec.seq_len
    return (
        f"padding {spec.padding}: keys kept per batch row {', '.join(map(str, keys))} of {spec.lk}; errors over "
        f"{live} of {total} query rows (those that see a key: padded query positions see none), in each of the "
        f"{spec.heads} heads"
    )


def _print_grads(cfg, result) -> None:
    """The gradients' table: per dQ, dK, dV the candidate's and the baseline's errors vs FP64 autograd."""
    from rich.markup import escape
    from rich.table import Table

    pol = cfg.candidate_policy()
    knobs = f"delta_source={pol.delta_source}, ds_correction={'on' if pol.ds_correction else 'off'}"
    console = _console()
    console.print(
        escape(f"gradients vs FP64 autograd through the reference (dO drawn from seed={cfg.inputs.seed}); {knobs}")
    )
    table = Table()
    cols = ("gradient", "candidate rel_l2", "baseline rel_l2", "ratio rel_l2", "candidate max_abs")
    for col in (*cols, "baseline max_abs", "ratio max_abs"):
        table.add_column(col, justify="right")
    for name, g in result.grad.items():
        cells = [f"{g[who][m]:.3e}" for m in ("rel_l2", "max_abs") for who in ("candidate", "baseline")]
        table.add_row(name, *cells[:2], f"{g['ratio']['rel_l2']:.3f}", *cells[2:], f"{g['ratio']['max_abs']:.3f}")
    console.print(table)


def _print_decoding(cfgs: list, records: list) -> None:
    """The split-KV decoding table: standard (the baseline), flash, then splitkv at each S, errors vs FP64."""
    from rich.markup import escape
    from rich.table import Table

    flash, base = records[0], records[0].baseline
    s_list = ",".join(str(c.splits) for c in cfgs[1:])
    console = _console()
    console.print(
        escape(
            f"split-KV decoding S={s_list} and flash [{cfgs[0].candidate_policy().name}] vs standard "
            f"[{cfgs[0].baseline_policy().name}]  {_shape(cfgs[0])}"
        )
    )
    table = Table()
    cols = ("kernel (vs FP64)", "chunks", "max_abs", "rel_l2", "rel_l2 / standard's", "rel_l2 / flash's")
    for col in (*cols, "rel_l2 vs FP64 of rounded inputs"):
        table.add_column(col, justify="right")
    table.add_row("standard", "-", f"{base['max_abs']:.3e}", f"{base['rel_l2']:.3e}", "1.000", "-", "-")
    for cfg, rec in zip(cfgs, records, strict=True):
        c = rec.candidate
        table.add_row(
            escape(_sim_name(cfg)),
            str(cfg.chunks() or "-"),
            f"{c['max_abs']:.3e}",
            f"{c['rel_l2']:.3e}",
            f"{rec.ratio['rel_l2']:.3f}",
            f"{c['rel_l2'] / flash.candidate['rel_l2']:.3f}" if flash.candidate["rel_l2"] else "-",
            f"{rec.candidate_rounded['rel_l2']:.3e}",
        )
    console.print(table)
