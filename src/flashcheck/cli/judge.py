"""`flashcheck judge FILE`: outputs computed by any framework, judged against the FP64 reference."""

from __future__ import annotations

import typer

from flashcheck.cli.app import _fail_usage, app

JUDGE_HELP = """Judge attention outputs computed anywhere (JAX, MLX, Candle, ONNX Runtime, your kernel).

FILE (.safetensors or .npz) holds q [B, H, Lq, D], k, v [B, Hkv, Lk, D] and out [B, H, Lq, Dv] (or several
out.NAME); optionally mask (bool, True = keep, or additive), grad_out with dq, dk, dv; settings scale,
causal and dtype as safetensors metadata or npz 0-d arrays. Prints the table, verdict and budget of
`compare --backend`; exit 1 when an output is over budget, 2 when the file is malformed."""


@app.command(help=JUDGE_HELP)
def judge(
    file: str = typer.Argument(..., help="A .safetensors or .npz dump of inputs and outputs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    from flashcheck.cli.compare import _finish_backends
    from flashcheck.measure.judge import judge as run_judge

    try:
        results = run_judge(file)
    except ValueError as exc:
        _fail_usage(str(exc))
    _finish_backends(results, as_json)
