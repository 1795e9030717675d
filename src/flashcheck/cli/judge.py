"""`flashcheck judge FILE`: outputs computed by any framework, judged against the FP64 reference."""

from __future__ import annotations

import typer

from flashcheck.cli.app import _fail_usage, app

JUDGE_HELP = (
    "Judge attention outputs computed anywhere (JAX, MLX, Candle, ONNX Runtime, your kernel).\n\n"
    "FILE (.safetensors or .npz) holds q [B, H, Lq, D], k, v [B, Hkv, Lk, D] and out [B, H, Lq, Dv] (or several "
    "out.NAME); optionally mask (bool, True = keep, or additive), grad_out with dq, dk, dv; settings scale, causal "
    "and dtype as safetensors metadata or npz 0-d arrays.\n\n"
    "Prints the table, verdict and budget of `compare --backend`; exit 1 when an output is over budget, 2 when the "
    "file is malformed."
)


@app.command(help=JUDGE_HELP)
def judge(
    file: str = typer.Argument(..., metavar="FILE", help="A .safetensors or .npz dump of inputs and outputs."),
    rule: str = typer.Option(
        "flashcheck",
        help="Budget rule: flashcheck (calibrated max, rel_l2, bias and row checks: catches a 1% gain error) or "
        "peers (flash-attention's tests: max and mean within k=2 forward, 3 gradients).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    from flashcheck.cli.compare import _finish_backends
    from flashcheck.measure.judge import judge as run_judge

    try:
        if not file.strip():
            raise ValueError(f"FILE {file!r} is empty; give a .safetensors or .npz file")
        results = run_judge(file, rule=rule)
    except ValueError as exc:
        _fail_usage(str(exc))
    if not as_json:
        typer.echo(_heading(results[0]["config"]))
    _finish_backends(results, as_json)


def _heading(c: dict) -> str:
    """What was read: the file, its shapes, the format judged in and the settings."""
    heads = f"H={c['heads']}" + (f" Hkv={c['kv_heads']}" if c["kv_heads"] != c["heads"] else "")
    lens = f"Lq={c['seq_len']}" + (f" Lk={c['seq_len_k']}" if c["seq_len_k"] != c["seq_len"] else "")
    scale = "1/sqrt(D)" if c["scale"] is None else f"{c['scale']:g}"
    mask = f", mask {c['mask']}" if c["mask"] else ""
    return (
        f"{c['file']}: B={c['batch']} {heads} {lens} D={c['head_dim']}, judged in {c['numerics']} "
        f"(baseline eager PyTorch in {c['numerics']}), scale {scale}{', causal' if c['causal'] else ''}{mask}"
    )
