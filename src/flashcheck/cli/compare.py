"""`flashcheck compare`: simulators (engine mode) or real backends against the FP64 reference."""

from __future__ import annotations

import json
import sys

import typer

from flashcheck.cli.app import (
    BLOCK_MAX,
    Algorithm,
    Distribution,
    Fp8Scaling,
    Kernel,
    _fail_usage,
    _int_list,
    _int_range,
    _names,
    _no_empty,
    _positive,
    _progress,
    _seed,
    _splits_fit,
    app,
)
from flashcheck.cli.show import print_backends, print_compare, print_decoding, print_grads, sim_name

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
PRESET_HELP = (  # every preset the registry holds, as the error for an unknown one lists them (filled in at use)
    "Kernel preset for sim-flash: {KERNEL_PRESETS} (default --numerics: the preset's own input format)."
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
    ctx: typer.Context,
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
    seed: int = typer.Option(0, callback=_seed, help="Seed of the inputs."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    case: str = typer.Option(None, help=CASE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure a configuration: candidate and baseline, both against the FP64 reference."""
    _rerun_hunted(backend, case, device, as_json)  # with --case: judges a hunted case and exits
    shape = dict(batch=batch, heads=heads, head_dim=head_dim, distribution=distribution.value, seed=seed)
    shape |= dict(kv_heads=kv_heads, seq_len_k=seq_len_k, padding=padding)
    opts = dict(causal=causal, block_q=block_q, block_k=block_k, algorithm=algorithm.value)
    opts |= {"baseline_numerics": baseline_numerics, "backward": backward}
    knobs = {"--splits": splits, "--delta-source": delta_source, "--ds-correction": ds_correction or None}
    try:
        opt = {"--numerics": numerics, "--baseline-numerics": baseline_numerics, "--backend": backend}
        opt |= {"--preset": preset, "--seq-len": seq_len, "--device": device} | knobs
        dev, lengths = _checked(opt, heads, kv_heads, head_dim)
        if simulators := backend is None and preset is None:
            extra = _sim_extra(ctx, kernel.value, fp8_scaling, hadamard, determinism)
            cfgs = _sim_configs(
                kernel.value, numerics, lengths, (extra, knobs), (shape, opts | {"device": device or "cpu"})
            )
            records = _run_sims(cfgs, as_json)
        else:
            _simulators_only(knobs | {"--fp8-scaling": fp8_scaling, "--hadamard": hadamard or None})
            steps = {"preset": preset, "determinism": runs if determinism else 0}
            cases = _backend_cases(backend or "sim-flash", numerics, lengths, (shape, opts | steps))
            results = _run_all(cases, dev, as_json)
    except ValueError as exc:
        _fail_usage(str(exc))
    if simulators:
        _finish_sims(cfgs, records, as_json)
    else:
        _finish_backends(results, as_json)


def _rerun_hunted(backend: str | None, case: str | None, device: str | None, as_json: bool) -> None:
    """`--case`: a `flashcheck hunt` finding judged again (cli.hunt; exits). Without --case, nothing."""
    if case is None:
        return
    from flashcheck.cli.hunt import rerun_case

    rerun_case(backend, case, device, as_json)


def _checked(named: dict, heads: int, kv_heads: int | None, head_dim: int) -> tuple:
    """(device, lengths) after the option checks: no empty option, kv heads dividing heads, a head dim a Hadamard
    policy takes, --seq-len a list."""
    _no_empty(named)
    dev = _device(named["--device"], named["--backend"], named["--preset"])
    _kv_divides(heads, kv_heads)
    _hadamard_head_dim(named["--numerics"], named["--baseline-numerics"], named["--preset"], head_dim)
    return dev, _int_list(named["--seq-len"], "--seq-len")


def _hadamard_head_dim(numerics: str | None, baseline: str | None, preset: str | None, head_dim: int) -> None:
    """Refuse a head dim that is not a power of two for a policy with Hadamard incoherent processing (FA3's
    FP8: --numerics, --baseline-numerics or --preset), before any case runs (it failed inside each case)."""
    from flashcheck.core.numerics import parse_policy
    from flashcheck.kernels.sim.presets import KERNEL_PRESETS, default_format, resolve

    named = [(f"--numerics {n}", n) for n in (numerics or "").split(",") if n.strip()]
    named += [(f"--baseline-numerics {baseline}", baseline)] if baseline else []
    if preset in KERNEL_PRESETS:
        named.append((f"--preset {preset}", resolve(preset, default_format(preset), 64, 64, 64, False)["policy"]))
    for label, spec in named:
        try:
            pol = parse_policy(spec.strip()) if isinstance(spec, str) else spec
        except ValueError:
            continue  # named later with what is allowed
        if pol.hadamard and head_dim & (head_dim - 1):
            raise ValueError(
                f"--head-dim {head_dim} is not allowed with {label}: its Hadamard incoherent processing needs a "
                "power-of-two head dim (e.g. 64, 128)"
            )


def _finish_sims(cfgs: list, records: list, as_json: bool) -> None:
    """Print the simulator comparison: one configuration's table (and its gradients' with --backward), or
    the split-KV decoding table of several."""
    from flashcheck.measure.compare import compare_dict

    if as_json:
        dicts = [compare_dict(c, r) for c, r in zip(cfgs, records, strict=True)]
        typer.echo(json.dumps(dicts[0] if len(dicts) == 1 else {"comparisons": dicts}, indent=2))
    elif len(cfgs) == 1:
        print_compare(cfgs[0], records[0])
        if records[0].grad is not None:
            print_grads(cfgs[0], records[0])
    else:
        print_decoding(cfgs, records)


def _finish_backends(results: list, as_json: bool) -> None:
    """Print the backends' results; exit 1 when a budget failed, 2 when no case could run here (each skipped,
    with its reason: a GPU-only backend on the CPU is a request this machine cannot serve; printed as the one
    `error: ...` line of every exit 2, except with --json)."""
    from flashcheck.cli.show import not_run_line

    if results and all(r.get("status") == "skipped" for r in results) and not as_json:
        _fail_usage("; ".join(" ".join(not_run_line(r).split()) for r in results))
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else {"backends": results}, indent=2))
    else:
        print_backends(results)
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


def _sim_extra(ctx: typer.Context, kernel: str, fp8_scaling, hadamard: bool | None, determinism: bool) -> tuple:
    """(FP8 scaling, Hadamard, --determinism) of a simulator comparison, its tile flags checked (_tile_flags_fit)."""
    _tile_flags_fit(ctx, kernel)
    return (fp8_scaling.value if fp8_scaling else None, hadamard, determinism)


def _tile_flags_fit(ctx: typer.Context, kernel: str) -> None:
    """ValueError for tile settings given to standard attention, which has no tiles (it ran, said nothing and
    printed them in its heading)."""
    if kernel != "standard":
        return
    source = ctx.get_parameter_source
    given = [f"--{n.replace('_', '-')}" for n in ("block_q", "block_k", "algorithm")
             if getattr(source(n), "name", "") == "COMMANDLINE"]  # fmt: skip
    if given:
        raise ValueError(f"{_are(given)} settings of the flash kernel's tiles; standard attention has none: drop "
                         f"{' and '.join(given)} or --kernel standard")  # fmt: skip


def _simulators_only(knobs: dict) -> None:
    given = [f for f, v in knobs.items() if v is not None]
    if given:
        raise ValueError(f"{_are(given)} settings of the simulators; drop --backend and --preset to use them")


def _are(flags: list[str]) -> str:
    return f"{flags[0]} is one of the" if len(flags) == 1 else f"{' and '.join(flags)} are"


def _run_sims(cfgs: list, as_json: bool) -> list:
    """The Records of the simulator comparisons (inputs and FP64 references drawn once), with progress on
    stderr when there are several."""
    from flashcheck.kernels.sim.memory import check_all_fit
    from flashcheck.measure.compare import run_compares

    check_all_fit(c.footprint() for c in cfgs)  # a refusal stays the one line, before the announcement
    _announce([c.footprint() for c in cfgs], "the FP64 reference, then the candidate and the baseline", as_json)
    with _progress(len(cfgs), "compare", as_json) as advance:
        return run_compares(cfgs, done=lambda c: advance(note=sim_name(c)))


# Score elements (batch x heads x Lq x Lk) of the largest comparison from which compare says, before it starts,
# what it computes: the kernels print nothing until they end (L=16384, 8 heads: 2.1e9, 141 s on 2 shared cores).
LONG_SCORES = 2**28


def _announce(footprints: list, what: str, as_json: bool) -> None:
    """One line on stderr before a long comparison (LONG_SCORES or more), as progress lines go: not with --json
    unless stderr is a terminal."""

    def scores(f) -> int:
        return f.batch * f.heads * f.seq_len * (f.seq_len_k or f.seq_len)

    big = max(footprints, key=scores, default=None)
    if big is None or scores(big) < LONG_SCORES or (as_json and not sys.stderr.isatty()):
        return
    typer.echo(f"compare: computing {big.describe()} ({what}); a comparison this large can take minutes", err=True)


def _backend_cases(backend: str, numerics: str | None, lengths: list[int], fields: tuple[dict, dict]) -> list:
    """One BackendCase per backend x format x length; `fields` = (input shape, the other BackendCase fields)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.kernels.sim.memory import check_all_fit
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
    from flashcheck.kernels.sim.presets import default_format

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
    from flashcheck.measure.compare import backend_footprint, run_backend_case

    _announce([backend_footprint(c) for c in cases], "the FP64 reference, then each backend and its baseline", as_json)
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
