"""`flashcheck predict`: the error model's answer for one setting, without running the kernel."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import typer

from flashcheck.cli.app import _fail_usage, _seed, _splits_fit, app
from flashcheck.cli.show import quantised_inside

_FORWARD = ("input", "score", "stats", "p", "accum", "output")


def _visible(lq: int, lk: int, causal: bool) -> float:
    """Mean keys a query row sees: all Lk, or with a bottom-right causal mask (Lk - Lq) + (Lq + 1) / 2."""
    return float(lk) if not causal else (lk - lq) + (lq + 1) / 2


@dataclass(frozen=True, slots=True)
class Draw:
    """How predict draws its inputs (--draw): heads, kv_heads (None: heads), seed, and the factor every input is
    multiplied by (--scale)."""

    heads: int = 2
    kv_heads: int | None = None
    seed: int = 0
    scale: float = 1.0

    def text(self) -> str:
        kv = "" if self.kv_heads in (None, self.heads) else f", {self.kv_heads} KV heads"
        x = "" if self.scale == 1.0 else f", inputs x {self.scale:g}"
        return f"inputs drawn now (seed {self.seed}, {self.heads} heads{kv}{x})"


def _draw_options(draw: bool, heads, kv_heads, seed, scale) -> Draw | None:
    """The Draw of --heads/--kv-heads/--seed/--scale (any of them implies --draw), or None without drawing.
    ValueError names a bad value."""
    if not draw and all(x is None for x in (heads, kv_heads, seed, scale)):
        return None
    h = 2 if heads is None else heads
    if h < 1:
        raise ValueError(f"--heads {h} is not allowed; give an integer >= 1")
    if kv_heads is not None and (kv_heads < 1 or h % kv_heads):
        raise ValueError(f"--kv-heads {kv_heads} is not allowed with --heads {h}; give a divisor of {h}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"--scale {scale} is not allowed; give a finite number > 0 (the inputs' factor)")
    return Draw(h, kv_heads, seed or 0, 1.0 if scale is None else scale)


FIRST_ORDER_LIMIT = 1.0  # the model sums first-order terms: those it leaves out are, relative to it, of order the value


def _draw_qkv(distribution: str, draw: Draw, lq: int, lk: int, d: int) -> tuple:
    """(q, k, v) drawn now (times draw.scale), after the memory check compare uses."""
    from flashcheck.core.inputs import InputSpec, make_qkv
    from flashcheck.kernels.sim.memory import Footprint, check_fits

    try:  # --draw materialises inputs and their scores: the same memory check compare uses
        check_fits(Footprint(batch=1, heads=draw.heads, seq_len=lq, seq_len_k=lk, head_dim=d))
    except ValueError as exc:
        raise ValueError(f"--draw cannot draw inputs this large here ({exc}); leave out --draw") from None
    spec = InputSpec(heads=draw.heads, kv_heads=draw.kv_heads, seq_len=lq, seq_len_k=lk, head_dim=d,
                     distribution=distribution, seed=draw.seed)  # fmt: skip
    return tuple(t * draw.scale for t in make_qkv(spec)) if draw.scale != 1.0 else make_qkv(spec)


def _stats(distribution: str, draw: Draw | None, lq: int, lk: int, d: int, causal: bool) -> tuple:
    """(f_score, f_p, where from, the drawn (q, k, v) or (), f_out): the built-in table, or measure.inputstats on
    inputs drawn now (no kernel)."""
    from flashcheck.measure.predict import DEFAULT_STATS

    if not draw:
        if distribution not in DEFAULT_STATS:
            raise ValueError(
                f"--distribution {distribution!r} has no built-in statistics; expected one of "
                f"{', '.join(DEFAULT_STATS)} (or add --draw to measure them on drawn inputs)"
            )
        fs, fp = DEFAULT_STATS[distribution]
        return fs, fp, "built-in table", (), 1.0
    from flashcheck.measure.inputstats import input_stats

    qkv = _draw_qkv(distribution, draw, lq, lk, d)
    st = input_stats(*qkv, causal=causal)
    return st["f_score"], st["f_p"], draw.text(), qkv, st["f_out"]


def _with_accumulator(setting, qkv: tuple, distribution: str, causal: bool):
    """(setting, where f_acc came from or None): a flash policy with a P·V tensor-core model (pv_mma) gets the
    model's derived accumulator term (measure.mma_error) on the drawn inputs, or on inputs drawn now for it alone
    (seed 0, 2 heads) when --draw is not given."""
    import dataclasses

    from flashcheck.measure.mma_error import pv_mma_stats

    pol = setting.policy
    if setting.kernel != "flash" or not pol.pv_mma:
        return setting, None
    lq, lk, d = qkv[0].shape[-2], qkv[1].shape[-2], qkv[0].shape[-1]
    st = pv_mma_stats(*qkv, pol, block_k=setting.block_k, causal=causal)
    return dataclasses.replace(setting, f_acc=st["f_acc"]), (lq, lk, d)


def _check_scale(setting, qkv: tuple, draw: Draw | None) -> None:
    """ValueError when the drawn inputs times --scale overflow the input format (unscaled 16/32-bit inputs) or
    their scores the score stage's format, naming the largest scale that fits."""
    from flashcheck.core.numerics import FP8_FORMATS, Format, info

    if draw is None or not qkv:
        return
    pol = setting.policy
    q, k = qkv[0].double(), qkv[1].double()
    amax = max(float(t.abs().amax()) for t in qkv)
    smax = float(q.norm(dim=-1).amax() * k.norm(dim=-1).amax()) / q.shape[-1] ** 0.5  # a bound on |score|
    fits = []
    if pol.input in (Format.BF16, Format.FP16, Format.FP32) and pol.input not in FP8_FORMATS and amax > 0:
        fits.append((info(pol.input).max / amax, f"inputs in {pol.input.value}"))
    if smax > 0:
        fits.append(((info(pol.score).max / smax) ** 0.5, f"scores in {pol.score.value}"))
    for top, what in fits:
        if top < 1.0:
            largest = draw.scale * top
            raise ValueError(
                f"--scale {draw.scale:g} is not allowed: the {what} overflow the format; the largest scale "
                f"allowed here is {largest:.3g}"
            )


def _with_range(setting, qkv: tuple, causal: bool):
    """(setting, range statistics or None): with drawn inputs and a P cast to a narrow format (fp8, fp4, scaled
    P) in flash or standard, the range terms' statistics (measure.inputstats.range_stats) on those inputs."""
    import dataclasses

    from flashcheck.measure.inputstats import narrow_p, range_stats

    if not qkv or setting.kernel not in ("flash", "standard") or not narrow_p(setting.policy):
        return setting, None
    rs = range_stats(*qkv, setting.policy, block_k=setting.block_k, order=setting.policy.kv_order or "forward",
                     causal=causal, kernel=setting.kernel)  # fmt: skip
    return dataclasses.replace(setting, f_p_range=rs["f_p_range"], f_flush=rs["f_flush"]), rs


DEFAULT_BLOCK_K = 128  # Bc of flash and splitkv when --block-k is not given
MAX_LEN = 2**24  # 16M tokens: beyond any context a kernel runs today
MAX_HEAD_DIM = 1024  # kernels ship head dims up to 256


def _checked(
    seq_len: int, seq_len_k: int, head_dim: int, block_k: int | None, splits: int | None
) -> tuple[int, int, int]:
    """(Lk, S, Bc) of checked sizes: positive, lengths at most MAX_LEN and head dim at most MAX_HEAD_DIM (the
    model's range; predicting needs no memory), S at most the key blocks ceil(Lk / Bc) (default min(4, blocks)),
    Bc DEFAULT_BLOCK_K when not given."""
    block_k = DEFAULT_BLOCK_K if block_k is None else block_k
    sizes = (
        ("--seq-len", seq_len),
        ("--block-k", block_k),
        ("--head-dim", head_dim),
        ("--splits", 1 if splits is None else splits),
    )
    for name, v in sizes:
        if v < 1:
            raise ValueError(f"{name} {v} is not allowed; give a positive integer")
    if seq_len_k < 0:
        raise ValueError(f"--seq-len-k {seq_len_k} is not allowed; give 0 (the query length) or a positive integer")
    lk = seq_len_k or seq_len
    blocks = _splits_fit([] if splits is None else [splits], lk, block_k)
    tops = (("--seq-len", seq_len, MAX_LEN), ("--seq-len-k", lk, MAX_LEN), ("--head-dim", head_dim, MAX_HEAD_DIM))
    for name, v, top in tops:
        if v > top:
            raise ValueError(f"{name} {v} is not allowed; the error model covers 1 to {top}")
    return lk, min(4, blocks) if splits is None else splits, block_k


def _known_preset(value: str | None) -> str | None:
    """The --preset name, or exit 2 naming the known ones."""
    from flashcheck.kernels.sim.presets import kernel_preset

    if value is not None:
        try:
            kernel_preset(value)
        except ValueError as exc:
            _fail_usage(f"--preset: {exc}")
    return value


def _preset_setting(preset, numerics, kernel: str, shape: tuple, block_k: int):
    """(numerics, block_k) for the model: the preset's policy at its format and its key block, or the given ones
    (default numerics bf16-mixed for the simulators, bf16 for a backend)."""
    if numerics is not None and not numerics.strip():
        raise ValueError("--numerics '' is empty; give a policy (bf16-mixed, fa3-fp8, ...) or leave the option out")
    if preset is None:
        return numerics or ("bf16-mixed" if kernel in ("flash", "standard", "splitkv") else "bf16"), block_k
    if kernel != "flash":
        raise ValueError(f"--preset {preset} is a flash kernel preset; it takes --kernel flash (got {kernel!r})")
    from flashcheck.kernels.sim.presets import default_format, resolve

    kw = resolve(preset, numerics or default_format(preset), *shape)
    return kw["policy"], kw["block_k"]


@app.command()
def predict(
    numerics: str = typer.Option(
        None,
        help="Policy: bf16, bf16-mixed, fp16-mixed, fa3-fp8, input=bf16,... (default bf16-mixed, as compare); "
        "a backend takes a dtype (default bf16).",
    ),
    seq_len: int = typer.Option(..., help="Query length Lq."),
    seq_len_k: int = typer.Option(0, help="Key length Lk (0: the query length; decoding: Lq 1 against Lk)."),
    kernel: str = typer.Option(
        "flash",
        help="flash, standard, splitkv, or a CPU backend (sdpa-math, sdpa-math-lowp, sdpa-flash, eager) "
        "predicted through the setting its kernel is equivalent to; a backend takes a dtype as --numerics.",
    ),
    block_k: int = typer.Option(None, help="Key block Bc (flash, splitkv; default 128)."),
    head_dim: int = typer.Option(64, help="Head dim D."),
    splits: int = typer.Option(None, help="Key chunks S of splitkv (default 4, or the key blocks when fewer)."),
    causal: bool = typer.Option(False, help="Bottom-right causal mask."),
    distribution: str = typer.Option("normal", help="Input distribution (its statistics)."),
    preset: str = typer.Option(
        None,
        callback=_known_preset,
        is_eager=True,  # a misspelt preset is named before a missing --seq-len
        help="A flash kernel preset (fa4-fp8, sage2, ...: see compare) at format --numerics (default: its own).",
    ),
    draw: bool = typer.Option(False, help="Measure the input statistics on drawn inputs (no kernel run)."),
    heads: int = typer.Option(None, help="Heads of the drawn inputs (default 2; implies --draw)."),
    kv_heads: int = typer.Option(None, help="K/V heads of the drawn inputs (GQA; default --heads; implies --draw)."),
    seed: int = typer.Option(None, callback=_seed, help="Seed of the drawn inputs (default 0; implies --draw)."),
    scale: float = typer.Option(None, help="Factor on the drawn Q, K, V (input scale; default 1; implies --draw)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Predict the kernel's relative L2 error against FP64 of its rounded inputs from the unit roundoff of
    each stage's format, the rescalings (Lk / Bc), L, D and input statistics (flashcheck.measure.predict).
    Range terms: a narrow P·V accumulator always (a preset's tensor-core model: derived on drawn inputs); with
    --draw and P in fp8/fp4, the
    P values that underflow (their lost mass) and the subnormal and exact ones, measured on the drawn inputs."""
    from flashcheck.measure import predict as model

    try:
        numerics, block_k = _preset_setting(
            preset, numerics, kernel, (seq_len, seq_len_k or seq_len, head_dim, causal), block_k
        )
        if splits is not None and kernel != "splitkv":
            raise ValueError(f"--splits {splits} is only for --kernel splitkv (got --kernel {kernel})")
        lk, splits, bk = _checked(seq_len, seq_len_k, head_dim, block_k, splits)
        drawing = _draw_options(draw, heads, kv_heads, seed, scale)
        fs, fp, source, qkv, f_out = _stats(distribution, drawing, seq_len, lk, head_dim, causal)
        setting = model.setting_for(
            kernel, numerics, visible=_visible(seq_len, lk, causal), head_dim=head_dim, block_k=bk,
            splits=splits, f_score=fs, f_p=fp, f_out=f_out,
        )  # fmt: skip
        setting, ranged = _terms(setting, qkv, drawing, distribution, (seq_len, lk, head_dim, causal))
    except ValueError as exc:
        _fail_usage(str(exc))
    data = _prediction(setting, kernel, block_k, (seq_len, lk), (fs, fp, source, ranged))
    data["accumulator"] = _accumulator_words(setting, bool(qkv))
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    _print_human(kernel, _named(setting, preset, numerics), setting, data, head_dim)


def _named(setting, preset: str | None, numerics: str) -> str:
    """The policy as the setting line names it: a preset's own (sage2-hopper@fp16), with the alias given (sage2)
    said as such, else --numerics."""
    if not preset:
        return numerics
    from flashcheck.kernels.sim.presets import alias_of

    alias = alias_of(preset)
    return setting.policy.name + (f" (--preset {preset}, an alias of {alias})" if alias else "")


def _prediction(setting, kernel: str, block_k: int | None, lengths: tuple[int, int], stats: tuple) -> dict:
    """predict's result: the predicted rel-L2, each stage's share, the setting and the model it came from."""
    from flashcheck.measure import predict as model

    (seq_len, lk), (fs, fp, source, ranged) = lengths, stats
    return {
        "predicted_rel_l2": model.predict(setting), "kernel": kernel, "equivalent_kernel": setting.kernel,
        "numerics": setting.policy.name, "block_k": setting.block_k,
        "block_k_asked": block_k,  # None: --block-k not given
        "seq_len": seq_len, "seq_len_k": lk, "tiles_per_row": model.tiles(setting), "f_score": fs, "f_p": fp,
        "statistics": source, "f_out": setting.f_out, "range": ranged, "contributions": model.contributions(setting),
        "coefficients": model.COEFFS, "training": model.TRAINING,
        "first_order": bool(model.predict(setting) < FIRST_ORDER_LIMIT),  # else not a prediction
    }  # fmt: skip


def _terms(setting, qkv: tuple, drawing: Draw | None, distribution: str, shape: tuple):
    """(setting, range statistics or None) with the --scale check, the range terms and the tensor-core accumulator
    term; shape (Lq, Lk, D, causal)."""
    lq, lk, d, causal = shape
    _check_scale(setting, qkv, drawing)
    setting, ranged = _with_range(setting, qkv, causal)
    acc_qkv = qkv
    if not qkv and setting.kernel == "flash" and setting.policy.pv_mma:
        try:  # inputs drawn for the tensor-core term alone; too large to draw here: the FP22 formula stands in
            acc_qkv = _draw_qkv(distribution, Draw(), lq, lk, d)
        except ValueError:
            acc_qkv = ()
    if acc_qkv:
        setting, _ = _with_accumulator(setting, acc_qkv, distribution, causal)
    return setting, ranged


def _accumulator_words(setting, drawn: bool) -> str | None:
    """Where the P·V accumulator term comes from (None without a narrow accumulator)."""
    pol = setting.policy
    if setting.kernel != "flash" or not (pol.pv_mma or pol.acc_bits):
        return None
    if pol.pv_mma and setting.f_acc is not None:
        where = "the drawn inputs" if drawn else "inputs drawn for it (seed 0, 2 heads)"
        return (f"P·V tensor-core accumulator ({pol.pv_mma} model, measure.mma_error) on {where}: relative "
                f"error {setting.f_acc**0.5:.3g}")  # fmt: skip
    if pol.pv_mma and not pol.acc_bits:
        return f"P·V tensor-core accumulator ({pol.pv_mma} model): inputs too large to draw here, the term is left out"
    if pol.pv_mma:
        return (f"P·V tensor-core accumulator ({pol.pv_mma} model): inputs too large to draw here, so the FP22 / fp16 "
                f"formula of {pol.acc_bits} bits stands in (an upper estimate for long one-level chains)")  # fmt: skip
    return f"P·V accumulator of {pol.acc_bits} bits (FP22 / fp16 formula)"


def _print_human(kernel: str, numerics: str, setting, data: dict, head_dim: int) -> None:
    """The prediction, the stages' shares, the equivalent kernel of a backend, the setting and the model."""
    from flashcheck.measure.predict import TRAINING

    typer.echo(f"predicted rel-L2 (kernel's own error vs FP64 of its rounded inputs): {data['predicted_rel_l2']:.3g}")
    inside = quantised_inside(setting.policy)
    if inside:  # Sage, NVFP4, SageAttention3: the kernel's own input quantisation is not in the model
        typer.echo(
            f"this leaves out the kernel's own input quantisation ({inside}), often its largest error: "
            "flashcheck compare measures the whole error, flashcheck explain shows that input stage apart"
        )
    if not data["first_order"]:
        typer.echo(
            f"not a prediction: the model sums first-order terms, and at {FIRST_ORDER_LIMIT:g} or more the terms it "
            f"leaves out are larger than the value (the error may be far larger or far smaller: a softmax this peaked "
            f"can even be exact); measure the kernel instead: flashcheck compare"
        )
    top = sorted(data["contributions"].items(), key=lambda kv: -kv[1])
    typer.echo("stage shares of the squared error: " + ", ".join(f"{k} {v:.0%}" for k, v in top if v >= 0.005))
    if setting.kernel != kernel:
        stages = ", ".join(f"{k} {v}" for k, v in setting.policy.formats().items() if k in _FORWARD)
        typer.echo(f"{kernel} at {numerics} rounds like the {setting.kernel} kernel with {stages}")
    if setting.kernel == "standard":
        tiling = "no key tiles (one softmax over each whole row)"
    else:
        tiling = f"Bc={setting.block_k}, {data['tiles_per_row']} key tile(s) per row"
        if setting.kernel == "splitkv":
            tiling += f" in each of S={setting.splits} chunk(s)"
        if data["block_k_asked"] not in (None, setting.block_k):
            tiling += f" (the {kernel} kernel's own block; --block-k {data['block_k_asked']} ignored)"
        elif setting.block_k != DEFAULT_BLOCK_K and setting.kernel != kernel:
            tiling += f" (the {kernel} kernel's own block)"
    typer.echo(
        f"{kernel}:{numerics}, Lq={data['seq_len']}, Lk={data['seq_len_k']}, D={head_dim}, {tiling}; input "
        f"statistics from the {data['statistics']}: the error's sensitivity to score rounding f_score "
        f"{data['f_score']:.3g} and to P rounding f_p {data['f_p']:.3g} (measure.inputstats)"
    )
    rs = data["range"]
    if rs is not None:
        typer.echo(
            f"range terms (P cast, on the drawn inputs): {rs['flushed']:.1%} of the P values underflow to 0, "
            f"{rs['flushed_mass']:.2g} of each row's probability mass; squared relative error of the lost mass "
            f"{rs['f_flush']:.3g}"
        )
    elif setting.kernel in ("flash", "standard") and data["statistics"] == "built-in table":
        from flashcheck.measure.inputstats import narrow_p

        if narrow_p(setting.policy):
            typer.echo("P is cast to a narrow format: add --draw to count the P values that underflow (range terms)")
    if data.get("accumulator"):
        typer.echo(data["accumulator"])
    typer.echo(f"model: {TRAINING}")
