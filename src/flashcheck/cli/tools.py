"""`flashcheck backends`, `explain` and `doctor`."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import typer

from flashcheck.cli.app import (
    BLOCK_MAX,
    Algorithm,
    Distribution,
    Kernel,
    _console,
    _fail_usage,
    _int_range,
    _no_empty,
    _not_others,
    _out_folder,
    _positive,
    _progress,
    _seed,
    app,
)


@app.command()
def backends(
    device: str = typer.Option(
        None,
        help="Say whether each can run on this device: cpu or cuda (default: each one's own, cuda where available).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the attention backends, whether each can run here, and why not."""
    from flashcheck.backends import all_backends
    from flashcheck.backends.base import DEVICES

    if device is not None and device not in DEVICES:
        _fail_usage(f"--device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    rows = []
    for b in all_backends():
        dev = device or b.default_device()
        a = b.available(device=dev)
        rows.append(
            {
                "name": b.name,
                "available": a.ok,
                "reason": a.reason,
                "description": b.description,
                "dtypes": [str(d).replace("torch.", "") for d in b.dtypes_on(dev)],
                "device": dev,
                "devices": list(b.devices),
                "backward": b.backward_reason(dev) is None,
                "version": b.version(),
                "proof_ops": {d: list(p) for d, p in b.proof.items()},
            }
        )
    if as_json:
        typer.echo(json.dumps({"backends": rows}, indent=2))
        return
    from flashcheck.cli.show import print_whole

    cols = ("name", "device", "here", "why not / what", "dtypes", "version")
    cells = [
        [
            r["name"],
            r["device"],
            "yes" if r["available"] else "no",
            r["reason"] or r["description"],
            ", ".join(r["dtypes"]),
            r["version"] or "-",
        ]
        for r in rows
    ]
    console = _console()
    console.print("attention backends")
    # every name whole (sdpa-math and sdpa-math-lowp stay apart); the reasons wrap at spaces
    print_whole(console, cols, cells, prose=("why not / what", "dtypes"))


@app.command()
def explain(
    numerics: str = typer.Option(
        None,
        help="The policy to explain (default bf16-mixed); with --preset its format (default: the preset's own).",
    ),
    preset: str = typer.Option(
        None, help="Explain a kernel preset (fa2-gpu, fa3-fp8, fa4-fp8, sage2, ...: see compare) at format --numerics."
    ),
    kernel: Kernel = typer.Option(Kernel.flash, help="The kernel whose stages are switched."),
    algorithm: Algorithm = typer.Option(Algorithm.fa2, help="Flash algorithm (without --preset)."),
    block_q: int = typer.Option(
        128, callback=_int_range("--block-q", 1, BLOCK_MAX), help="Query block size Br (without --preset)."
    ),
    block_k: int = typer.Option(
        128, callback=_int_range("--block-k", 1, BLOCK_MAX), help="Key block size Bc (without --preset)."
    ),
    batch: int = typer.Option(1, callback=_positive("--batch"), help="Batch size B."),
    heads: int = typer.Option(8, callback=_positive("--heads"), help="Heads H."),
    seq_len: int = typer.Option(1024, callback=_positive("--seq-len"), help="Sequence length L."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim"), help="Head dim D."),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right aligned)."),
    distribution: Distribution = typer.Option(Distribution.normal, help="Input distribution."),
    metric: str = typer.Option("rel_l2", help="max_abs, mean_abs, rmse or rel_l2."),
    seed: int = typer.Option(0, callback=_seed, help="Seed of the drawn inputs."),
    out: str = typer.Option(
        "flashcheck-explain",
        help="Folder for summary.json and figures/explain.png (with --preset, by default flashcheck-explain-PRESET).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which stage causes the deviation: each stage alone in low precision, each alone raised to FP64; for
    FP8/FP4 and quantized policies also each sub-stage (Q/K or V quantisation, an MMA accumulator, ...)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.attribution import attribute, steps

    try:
        _no_empty({"--numerics": numerics, "--preset": preset, "--metric": metric})
        if preset and out == "flashcheck-explain":  # one folder per preset, so explaining the next keeps this one
            out = f"flashcheck-explain-{preset}"
        folder = _out_folder(out)
        _not_others(folder, "explain", {"policy", "metric", "raised", "dominant_stage"})  # not a study's summary
        if metric not in ("max_abs", "mean_abs", "rmse", "rel_l2"):
            raise ValueError(f"--metric {metric!r}; expected one of max_abs, mean_abs, rmse, rel_l2")
        pol, kern = _explain_kernel(preset, numerics, algorithm, (block_q, block_k), (seq_len, head_dim, causal))
        spec = InputSpec(
            batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, distribution=distribution.value, seed=seed
        )
        with _progress(steps(pol), "explain", as_json) as advance:
            attr = attribute(pol, spec, kernel=kernel.value, causal=causal, metric=metric, on_step=advance, **kern)
        from flashcheck.core.fileio import make_folder

        make_folder(folder / "figures", "the figures folder")
    except ValueError as exc:
        _fail_usage(str(exc))
    except OSError as exc:
        _fail_usage(f"--out {out!r} is not writable: {exc.strerror or exc}")
    data = {**attr.to_dict(), "config": {"kernel": kernel.value, **kern, "preset": preset, **dataclasses.asdict(spec)}}
    _write_explain(folder, attr, data, metric, as_json)


def _write_explain(folder, attr, data: dict, metric: str, as_json: bool) -> None:
    """explain's summary.json and figure (atomic; no figure without matplotlib), then the table or the JSON."""
    from flashcheck.core.fileio import atomic_target, write_atomic
    from flashcheck.reporting.attribution import draw_attribution

    write_atomic(folder / "summary.json", json.dumps(data, indent=2))
    from flashcheck.core.extras import install_hint

    figure = f"; no figure ({install_hint('plots')})"
    with contextlib.suppress(ImportError), atomic_target(folder / "figures" / "explain.png") as png:
        draw_attribution(attr, png)  # matplotlib is optional: the table still prints
        figure = ", figures/explain.png"
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        _print_explain(attr, metric, data["config"].get("preset"))
        _console().print(f"wrote {folder}/summary.json{figure}", markup=False)


def _explain_kernel(
    preset: str | None,
    numerics: str | None,
    algorithm: Algorithm,
    blocks: tuple[int, int],
    shape: tuple[int, int, bool],
) -> tuple:
    """(policy, {block_q, block_k, algorithm, exp2}): the kernel preset at format `numerics` for the shape
    (seq_len, head_dim, causal), or the policy `numerics` with the given blocks and algorithm. Without
    numerics: bf16-mixed, or for a preset (which takes a format) its own (kernels.sim.presets.default_format)."""
    if numerics is None:
        from flashcheck.kernels.sim.presets import default_format

        numerics = default_format(preset, "bf16-mixed")
    if not preset:
        from flashcheck.core.numerics import parse_policy

        kern = {"block_q": blocks[0], "block_k": blocks[1], "algorithm": algorithm.value, "exp2": False}
        return parse_policy(numerics), kern
    from flashcheck.kernels.sim.presets import resolve

    seq_len, head_dim, causal = shape
    kw = resolve(preset, numerics, seq_len, seq_len, head_dim, causal)
    return kw["policy"], {k: kw[k] for k in ("block_q", "block_k", "algorithm", "exp2")}


def _print_explain(attr, metric: str, preset: str | None = None) -> None:
    """The dominant line and the table: each stage, and under it its sub-stages (measure.substages) in words;
    a preset given by another name (sage2) is named with the preset it is (sage2-hopper)."""
    from rich.markup import escape
    from rich.table import Table

    from flashcheck.core.numerics import STAGES
    from flashcheck.measure.substages import BY_NAME

    pol = attr.policy
    console = _console()
    dom = attr.dominant
    share = attr.alone[dom] / attr.full if attr.full > 0 else float("nan")
    from flashcheck.kernels.sim.presets import alias_of

    alias = f" (--preset {preset}, an alias of {alias_of(preset)})" if preset and alias_of(preset) else ""
    line = (  # one measure for both stages (each alone, the others FP64): shares of that kind need not add to 100%
        f"{metric} vs FP64 of {pol.name}{alias}: full {attr.full:.3e}; dominant stage (raising it to FP64 removes the "
        f"most): {dom}, which alone (the other stages FP64) gives {100 * share:.0f}% of the full error"
    )
    sub = attr.dominant_substage
    if sub is not None:
        top, part = attr.raised[dom] / attr.full, attr.sub_raised[sub] / attr.full
        line += f" (raised: {top:.3g}x of the full error); within it: {attr.label(sub)} (removing it alone: "
        line += f"{part:.3g}x)"
    if dom != "output":
        line += f"; output rounding alone gives {100 * attr.output_share:.0f}%"
    console.print(escape(line))
    table = Table()
    for col in ("stage", "format", "alone (others FP64)", "raised to FP64 (others as policy)"):
        table.add_column(col)
    for st in STAGES:
        table.add_row(st, pol.stage(st).value, f"{attr.alone[st]:.3e}", f"{attr.raised[st]:.3e}")
        for name in (s for s in attr.sub_raised if BY_NAME[s].stage == st):
            table.add_row(
                f"  {name}", escape(attr.label(name)), f"{attr.sub_alone[name]:.3e}", f"{attr.sub_raised[name]:.3e}"
            )
    console.print(table)
    if attr.sub_raised:
        console.print(
            "sub-stages: 'raised' removes that part alone (input:qk keeps Q and K exact, input:v V; p:cast keeps P "
            "in fp32 as the exp2 computes it; an MMA accumulator sums in the stage's format)",
            markup=False,
        )


DOCTOR_DTYPES = ("fp32", "bf16", "fp16")  # SDPA's input dtypes


@app.command()
def doctor(
    seq_len: int = typer.Option(1024, callback=_positive("--seq-len"), help="Shape for SDPA's choice."),
    head_dim: int = typer.Option(64, callback=_positive("--head-dim"), help="Head dim for SDPA's choice."),
    dtype: str = typer.Option("bf16", help=f"dtype for SDPA's choice: {', '.join(DOCTOR_DTYPES)}."),
    causal: bool = typer.Option(False, help="A causal mask for SDPA's choice."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why flash attention will or will not run here."""
    from flashcheck.core.numerics import info, parse_format
    from flashcheck.doctor import diagnose
    from flashcheck.kernels.sim.memory import Footprint, check_fits

    try:
        _no_empty({"--dtype": dtype})
        try:
            fmt = parse_format(dtype)
        except ValueError:
            fmt = None  # said below with the formats doctor takes, not every format flashcheck knows
        if fmt is None or fmt.value not in DOCTOR_DTYPES:
            raise ValueError(f"--dtype {dtype!r} is not allowed; expected one of {', '.join(DOCTOR_DTYPES)}")
        # SDPA's math kernel holds L x L fp32 scores; refuse before allocating a shape that cannot fit
        check_fits(
            Footprint(batch=1, heads=8, seq_len=seq_len, head_dim=head_dim, kernels=("standard",), work_itemsize=4)
        )
    except ValueError as exc:
        _fail_usage(str(exc))
    report = diagnose((1, 8, seq_len, head_dim), info(fmt).dtype, causal)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    from rich.markup import escape

    c = _console()
    cuda = f"CUDA {report['cuda']}; cuDNN {report['cudnn']}" if report["cuda"] else "the CPU build (no CUDA)"
    c.print(f"OS {escape(report['os'])}; Python {report['python']}; torch {report['torch']}, {cuda}")
    c.print(f"GPU: {report['gpu'] or 'none visible'}")
    _print_flash_attn(c, report["flash_attn"])
    c.print(_sdpa_flags_line(report["sdpa_backends_enabled"], bool(report["cuda"])))
    ch = report["sdpa_choice"]
    c.print(
        f"SDPA picks for {ch.get('shape')} {ch.get('dtype')} on {ch['device']}: "
        f"{escape(str(ch.get('kernel') or ch.get('error')))}"
    )
    c.print(_determinism_line(report["determinism"], bool(report["cuda"])))
    for b in report["backends"]:
        version = f" ({escape(b['version'])})" if b.get("version") else ""
        c.print(f"  {b['name']:<16} {'yes' if b['available'] else 'no: ' + escape(b['reason'])}{version}")
    _print_simulator(c, report)


def _print_simulator(c, report: dict) -> None:
    """doctor's lines on the simulator's C routines: each one in use, or why not."""
    from rich.markup import escape

    native = report["simulator_rounding"]
    how = f"C routine ({', '.join(native['formats'])})" if native["available"] else escape(native["reason"])
    c.print(f"simulator's P rounding: {how}")
    mma = report["simulator_mma"]
    c.print(f"simulator's tensor-core MMA model: {'C routine' if mma['available'] else escape(mma['reason'])}")
    step = report["simulator_step"]
    how = f"fused C routine (CPU capability {step['capability']})" if step["available"] else escape(step["reason"])
    c.print(f"simulator's FA2 step (softmax, P, accumulator): {how}")
    how = "one C call per tile (torch's MKL sgemm)" if step.get("tile_loop") else escape(step.get("tile_reason", ""))
    c.print(f"simulator's plain FA2 query tiles: {how}")
    bwd = report.get("simulator_backward", {"available": False, "reason": "not reported"})
    how = "C routines (torch's products)" if bwd["available"] else escape(bwd["reason"])
    c.print(f"simulator's FA2 backward passes (P, dS, dQ / dK updates): {how}")
    fp8 = report["simulator_fp8"]
    c.print(f"simulator's FP8 / integer quantisation: {'C routine' if fp8['available'] else escape(fp8['reason'])}")
    pre = report["simulator_preset_steps"]
    how = "C routine" if pre["available"] else escape(pre["reason"])
    c.print(f"simulator's quantised-preset steps (P quantisation, MMA descales): {how}")


def _sdpa_flags_line(flags: dict, cuda: bool) -> str:
    """torch's SDPA backend switches in words: which are on, which off, and which can run on this build."""
    on = [name for name, enabled in flags.items() if enabled]
    off = [name for name, enabled in flags.items() if not enabled]
    line = f"SDPA backend switches on: {', '.join(on) or 'none'}" + (f"; off: {', '.join(off)}" if off else "")
    return line if cuda else line + " (the CPU build runs only math and flash; the others need CUDA)"


def _determinism_line(det: dict, cuda: bool) -> str:
    """torch's determinism settings in words (the cuDNN and cuBLAS ones only where CUDA is)."""
    mode = "on" if det["deterministic_algorithms"] else "off"
    line = f"deterministic algorithms: {mode}" + (
        " (warn only)" if det["deterministic_algorithms"] and det["warn_only"] else ""
    )
    if not cuda:
        return line
    workspace = det["CUBLAS_WORKSPACE_CONFIG"] or "unset"
    cudnn = f"cudnn.deterministic {_on(det['cudnn_deterministic'])}, cudnn.benchmark {_on(det['cudnn_benchmark'])}"
    return f"{line}; {cudnn}, CUBLAS_WORKSPACE_CONFIG {workspace}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _print_flash_attn(c, fa: dict) -> None:
    """Whether flash-attn imports; if not, the wheel this environment needs (on the CPU build: none fits, and
    the one a CUDA build of this torch would need) and every reason it would not run."""
    from rich.markup import escape

    if fa["importable"]:
        c.print("flash-attn: importable")
    elif fa["wheel_tag"]:
        c.print(f"flash-attn: not importable; this environment needs the wheel {escape(fa['wheel_tag'])}")
    else:
        c.print("flash-attn: not importable; no flash-attn wheel fits torch's CPU build")
        tag = escape(fa["wheel_tag_with_cuda"])
        c.print(f"  with a CUDA build of this torch: {tag} (X: its CUDA major version, e.g. 12)")
    for p in fa.get("problems", []):
        c.print(f"  - {escape(p)}")
