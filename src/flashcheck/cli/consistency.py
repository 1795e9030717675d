"""`flashcheck consistency TARGET`: run-to-run, batch, prefill-vs-decode and chunked-prefill certificates."""

from __future__ import annotations

import json

import typer

from flashcheck.cli.app import _fail_usage, _int_range, _names, _not_others, _out_folder, _starting, app

CONSISTENCY_HELP = (
    "Does one request get the same bits however a server runs it? Certificates, each for one phase of serving: "
    "determinism [decode] (the same decode batch run after run); batch [decode] (a decode step alone and in batches "
    "of 2..N, two compositions each, at --kv-len); batch-prefill [prefill] (a causal prefill alone and in batches of "
    "2 and 4, beside prefills of the same and of other lengths right-padded (ragged), at the tile-boundary lengths "
    "31-33, 63-65, 127-129, 191-193 up to --prefill-len, and --prefill-len itself); prefill-decode [prefill vs decode] "
    "(row t of a prefill against the decode step at KV length t + 1); chunked [prefill] (a prefill in chunks against "
    "one prefill). Each names the first run / batch size / length / position where bits differ and by how much.\n\n"
    "TARGET: a backend (sdpa-math, sdpa-flash, jax-xla, onnxruntime, ...: `flashcheck backends`), a simulator "
    "(sim-fa3, sim-fa3-fixed: FA3's "
    "tile and num_splits rules; -fixed fixes the split count only, not the tile width kBlockN, so prefill vs decode "
    "can still differ; sim-flashinfer, sim-flashinfer-fixed: FlashInfer's decode chunking) "
    "over the --kv cache, or your 'module:function' called as `flashcheck hunt` calls it: function(q, k, v, *, causal, "
    "scale, mask) with q [B, H, Lq, D], k, v [B, Hkv, Lk, D], scale 1/sqrt(D), mask None and bottom-right causal "
    "masks.\n\n"
    "Exit 1 when a certificate does not hold, 2 on bad input."
)


@app.command(help=CONSISTENCY_HELP)
def consistency(
    target: str = typer.Argument(..., metavar="TARGET", help="Backend, simulator or module:function."),
    checks: str = typer.Option(
        "determinism,batch,batch-prefill,prefill-decode,chunked", help="Comma-separated checks (see above)."
    ),
    kv: str = typer.Option("fp8", help="Simulators' KV cache: bf16, fp8[/static|calc|amax], fp8-head, fp4, ..."),
    max_batch: int = typer.Option(
        16, callback=_int_range("--max-batch", 1, 64), help="Largest batch size of the batch check."
    ),
    kv_len: int = typer.Option(
        512, callback=_int_range("--kv-len", 1, 1 << 20), help="KV length of the decode batches."
    ),
    prefill_len: int = typer.Option(
        160, callback=_int_range("--prefill-len", 1, 8192), help="Tokens of the prefill checks."
    ),
    heads: int = typer.Option(4, callback=_int_range("--heads", 1, 256), help="Query heads."),
    kv_heads: int = typer.Option(0, callback=_int_range("--kv-heads", 0, 256), help="K/V heads (0: as --heads)."),
    head_dim: int = typer.Option(64, callback=_int_range("--head-dim", 1, 512), help="Head dimension."),
    dtype: str = typer.Option("bf16", help="Input dtype: bf16, fp16 or fp32."),
    chunk: int = typer.Option(
        32, callback=_int_range("--chunk", 1, 8192), help="Queries per chunk of the chunked check."
    ),
    runs: int = typer.Option(5, callback=_int_range("--runs", 2, 1000), help="Runs of the determinism check."),
    fixed_splits: int = typer.Option(
        4, callback=_int_range("--fixed-splits", 1, 128), help="sim-fa3-fixed's split count."
    ),
    out: str = typer.Option(None, help="Also write summary.json into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Certify TARGET: see CONSISTENCY_HELP."""
    try:
        _out_folder(out) if out is not None else None
    except ValueError as exc:
        _fail_usage(str(exc))
    _starting(f"consistency: certifying {target} ({checks})")
    from flashcheck.backends.serving import resolve_target
    from flashcheck.core.fileio import LinkRefused, refuse_link
    from flashcheck.measure.consistency import certify

    try:
        shape = _shape(heads, kv_heads, head_dim, (kv_len, prefill_len), dtype)
        folder = _out_folder(out) if out is not None else None
        if folder is not None:  # linked outputs are refused before anything runs
            refuse_link(folder, "the --out folder")
            refuse_link(folder / "summary.json")
            _not_others(folder, "consistency", {"target", "certificates"})  # not a study's summary.json
        wanted = tuple(_names(checks, "--checks"))
        fn = resolve_target(target, kv=kv, fixed_splits=fixed_splits) if target.startswith("sim-") else \
            resolve_target(target)  # fmt: skip
        certs = certify(fn, target, shape, checks=wanted, max_batch=max_batch, runs=runs, chunk=chunk)
    except ValueError as exc:
        _fail_usage(str(exc))
    try:
        _report(target, kv if target.startswith("sim-") else None, shape, certs, (folder, as_json, dtype))
    except LinkRefused as exc:  # a link made while the checks ran
        _fail_usage(str(exc))
    if not all(c.holds for c in certs):
        raise typer.Exit(1)


def _shape(heads: int, kv_heads: int, head_dim: int, lengths: tuple[int, int], dtype: str):
    """The certificates' Shape from the options; ValueError naming a bad --dtype or --kv-heads."""
    import torch

    from flashcheck.measure.consistency import Shape

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise ValueError(f"--dtype {dtype!r} is not allowed; expected one of {', '.join(dtypes)}")
    kvh = kv_heads or heads
    if kvh < 1 or heads % kvh:
        raise ValueError(f"--kv-heads {kv_heads} must divide --heads {heads}")
    return Shape(heads, kvh, head_dim, lengths[0], lengths[1], dtypes[dtype])


def _report(target: str, kv: str | None, shape, certs: list, how: tuple) -> None:
    """summary.json into the --out folder (never through a link), then the JSON object or the certificate lines."""
    folder, as_json, dtype = how
    dims = dict(heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim, kv_len=shape.kv_len)
    summary = {
        "target": target,
        "kv": kv,
        "shape": dims | {"prefill_len": shape.prefill_len, "dtype": dtype},
        "certificates": [c.to_dict() for c in certs],
    }
    if why := _fixed_note(target, kv, shape, certs):
        summary["note"] = why
    if folder is not None:
        from flashcheck.core.fileio import make_folder, write_atomic

        write_atomic(make_folder(folder) / "summary.json", json.dumps(summary, indent=2))
    if as_json:
        typer.echo(json.dumps(summary))
        return
    what = target + (f" over a {kv} KV cache" if kv is not None else "")
    typer.echo(f"consistency of {what}: H={shape.heads} Hkv={shape.kv_heads} D={shape.head_dim} {dtype}, "
               f"decode KV length {shape.kv_len}, prefill {shape.prefill_len} tokens")  # fmt: skip
    for c in certs:
        mark = "holds" if c.holds else "FAILS"
        typer.echo(f"  {mark:5}  {c.phase + ':':18} {c.sentence()}" + (f" [{c.note}]" if c.note else ""))
    if why:
        typer.echo(f"note: {why}")


def _fixed_note(target: str, kv: str | None, shape, certs: list) -> str:
    """Why a '-fixed' simulator's prefill vs decode can still differ: fixed fixes the split count, not the tile."""
    pd = next((c for c in certs if c.check == "prefill-decode" and not c.holds), None)
    if not target.endswith("-fixed") or pd is None:
        return ""
    if not target.startswith("sim-fa3"):
        return (
            "'fixed' fixes the split size only; the prefill and decode kernels still differ in how they "
            "accumulate, so prefill vs decode can still differ"
        )
    from flashcheck.backends.serving import parse_kv_format
    from flashcheck.kernels.serving.heuristics import fa3_launch_tile

    fp8 = parse_kv_format(kv or "bf16").scheme in ("fp8", "fp8-head")
    h, hk, d = shape.heads, shape.kv_heads, shape.head_dim
    dec = fa3_launch_tile(1, h, hk, d, fp8=fp8, causal=True)[1]
    pre = fa3_launch_tile(shape.prefill_len, h, hk, d, fp8=fp8, causal=True)[1]
    return (f"'fixed' fixes the split count only, not the tile width: decode visits the keys in tiles of kBlockN "
            f"{dec}, the prefill in tiles of {pre}, so the sums are grouped differently and prefill vs decode still "
            "differs" if dec != pre else
            "'fixed' fixes the split count only; prefill and decode still run different kernels")  # fmt: skip
