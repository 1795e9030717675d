"""`flashcheck validate`: a real model under each attention implementation and format, judged against the
deviation the format alone causes; `--pin` / `--check-pin` for the environment it was validated in."""

from __future__ import annotations

import functools
import importlib
import json
import re

import typer

from flashcheck.cli.app import (
    _console,
    _fail_usage,
    _not_others,
    _out_file,
    _out_folder,
    _starting,
    app,
    warnings_as_lines,
)
from flashcheck.core.fileio import folder_problem
from flashcheck.core.progress import progress  # light (no torch): the first line still comes first

# flashcheck's own transformers attention implementations: name -> "module:function" that registers it
OWN_IMPLS = {"fcguard": "flashcheck.guard.integrations:register_transformers"}


VALIDATE_KEYS = [{"model", "rows", "new_tokens"}, {"comparisons", "environment"}]  # --kv-cache's, the main one's


def _names(text: str, flag: str) -> list[str]:
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names:
        raise ValueError(f"{flag} {text!r} is not allowed; give comma-separated names")
    return names


def _tolerance(text: str) -> str | float:
    if text in ("strict", "default", "loose"):
        return text
    try:
        k = float(text)
    except ValueError:
        k = float("nan")
    if not k >= 1 or k == float("inf"):
        raise ValueError(f"--tolerance {text!r} is not allowed; give strict, default, loose or a number k >= 1")
    return k


def _register_own(impls: list[str]) -> None:
    """Register flashcheck's own implementations that were asked for: the guard as "fcguard", and a flashcheck
    backend that transformers does not know by its name (jax-xla, onnxruntime, ...)."""
    from flashcheck.backends import backend_names

    from_transformers = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
    for name in impls:
        if name in OWN_IMPLS:
            module, fn = OWN_IMPLS[name].split(":")
            getattr(importlib.import_module(module), fn)(name=name)
        elif name in backend_names() and name not in from_transformers and not name.startswith("sim-"):
            from flashcheck.validate.backend_impl import register_backend

            register_backend(name)


def _need_transformers() -> None:
    """ValueError (exit 2) naming the extra to install when transformers is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        from flashcheck.core.extras import install_hint

        raise ValueError(
            f"flashcheck validate needs transformers and the bundled model: {install_hint('validate')}"
        ) from None


def _check_pin_only(path: str, as_json: bool) -> None:
    from flashcheck.core.environment import check_pin

    try:
        diffs = check_pin(path)
    except ValueError as exc:
        _fail_usage(str(exc))
    if as_json:
        typer.echo(json.dumps({"match": not diffs, "differences": diffs}, indent=2))
    elif diffs:
        typer.echo(f"environment differs from the pin {path}:")
        for d in diffs:
            typer.echo(f"  {d}")
    else:
        typer.echo(f"environment matches the pin {path}")
    raise typer.Exit(1 if diffs else 0)


def _print(result, out: str) -> None:
    from rich.table import Table

    from flashcheck.validate.report import comparison_table, conclusion
    from flashcheck.validate.sim_report import answer_lines

    c = _console()
    if lines := answer_lines(result):  # simulated kernels: the end-to-end consequence per kernel, first
        c.print("[bold]Answer[/]")
        for line in lines:
            c.print(f"  {line}", soft_wrap=True)
    rows = comparison_table(result)
    table = Table(title=f"validate {result.model}: {_inputs_line(result.settings)}")
    for col in rows.header:
        table.add_column(col)
    for row in rows.rows:
        table.add_row(*row)
    c.print(table)
    for cmp in result.comparisons:
        for line in [*cmp.failures(), *cmp.notes()]:
            c.print(f"{cmp.a}: {line}")
    for s in result.skipped:
        c.print(f"skipped {s.impl}:{s.dtype}: {s.reason}")
    c.print(conclusion(result))
    c.print(f"report: {out}/report.html, report.md, summary.json")


def _inputs_line(settings: dict) -> str:
    """How many texts were compared and at what length; a --samples beyond the corpus is said, not hidden."""
    n, asked = settings.get("texts"), settings.get("samples")
    more = f" (--samples {asked}: the corpus holds {n})" if asked is not None and n is not None and asked > n else ""
    return f"{n} texts{more}, up to {settings.get('max_length')} tokens"


@app.command()
def validate(
    model: str = typer.Argument(
        None,
        metavar="MODEL",
        help="Model folder (Hugging Face or sentence-transformers); default: the bundled all-MiniLM-L6-v2.",
    ),
    impls: str = typer.Option(
        "eager,sdpa,flash_attention_2",
        help="Attention implementations, comma-separated: transformers' (eager, sdpa, ...), flashcheck backends, or "
        "sim:NAME, a simulated GPU kernel as every layer's attention (a kernel preset: sim:fa3-fp8, sim:fa4-fp4, "
        "sim:sage3-fp4, ... as `compare --preset`; or a policy: sim:bf16-mixed). A sim: kernel adds, per layer, "
        "its isolated error (one layer through it), the growth over the layers and the error model's prediction.",
    ),
    dtypes: str = typer.Option("fp32,bf16", help="Formats: fp32, bf16, fp16."),
    texts: str = typer.Option(None, help="UTF-8 file, one text per line (default: the built-in corpus)."),
    samples: int = typer.Option(1000, help="Texts drawn from the corpus."),
    max_length: int = typer.Option(
        None, help="Tokens per text (default: the model's own: sentence-transformers' max_seq_length, else its limit)."
    ),
    batch_size: int = typer.Option(32),
    tolerance: str = typer.Option("default", help="strict | default | loose, or k (a number >= 1)."),
    out: str = typer.Option("flashcheck-validate", help="Folder for the report, figures and the cached reference."),
    pin: str = typer.Option(None, help="After a pass, write the environment fingerprint to this file."),
    check_pin: str = typer.Option(None, help="Only compare the running environment with this pin file."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, help="No progress bar."),
    kv_cache: str = typer.Option(
        None,
        help="Decoder models: generate with these KV caches (fp8, fp8/calc, fp8-head, fp8-token, fp4, nvfp4, "
        "fp8k-nvfp4v; fp8 alone runs scale 1.0 and calibrated) against the bf16 cache; with sim: kernels in "
        "--impls, every cache again with each kernel as the attention.",
    ),
    new_tokens: int = typer.Option(32, help="--kv-cache: greedy tokens generated per prompt."),
    prompts: int = typer.Option(8, help="--kv-cache: prompts (random token ids where MODEL has no tokenizer)."),
    prompt_len: int = typer.Option(32, help="--kv-cache: tokens per prompt."),
) -> None:
    """Validate a model under each attention implementation and format against the eager fp32 reference."""
    if check_pin is not None:
        _check_pin_only(check_pin, as_json)
    if kv_cache is not None:
        _validate_kv(model, kv_cache, (impls, new_tokens, prompts, prompt_len), out, as_json)
    try:
        _checked_paths(model, out, pin)
        _starting(f"validate: {model or 'the bundled all-MiniLM-L6-v2'} under {impls} in {dtypes} against eager "
                  f"fp32, into {out}", quiet)  # fmt: skip
        from flashcheck.validate import validate_model

        _need_transformers()
        names = _names(impls, "--impls")
        _model_exists(model, names)
        _register_own(names)
        with warnings_as_lines():
            result = validate_model(
                model, texts, impls=names, dtypes=_names(dtypes, "--dtypes"), samples=samples, max_length=max_length,
                batch_size=batch_size, tolerance=_tolerance(tolerance), out=out,
                progress=functools.partial(progress, quiet=quiet),
            )  # fmt: skip
    except ValueError as exc:
        _fail_usage(_as_flags(str(exc)))
    _finish(result, out, pin, as_json)


def _model_exists(model: str | None, names: list[str]) -> None:
    """A MODEL folder that does not exist, said before transformers' import (seconds on a loaded machine); an
    unknown sim: kernel first, whatever MODEL is (the name to fix is listed with the valid ones)."""
    if model is None:
        return
    from flashcheck.validate.sim_impl import is_sim, parse_sim

    for name in names:
        if is_sim(name):
            parse_sim(name)
    if why := folder_problem(model):
        raise ValueError(f"MODEL {model!r} {why}; give a Hugging Face or sentence-transformers folder")


def _checked_paths(model: str | None, out: str, pin: str | None) -> None:
    """MODEL, --out and --pin checked before the work: ValueError, one line."""
    _not_others(_out_folder(out), "validate", VALIDATE_KEYS)  # not a study's summary.json
    if model is not None and not model.strip():
        raise ValueError(f"MODEL {model!r} is not allowed; give a model folder or leave it out")
    if pin is not None:
        _out_file(pin, "--pin")  # written after a pass: checked before the work


def _as_flags(message: str) -> str:
    """The library's parameter names in a message as the command's flags ("samples=0" -> "--samples 0")."""
    for name in ("samples", "batch_size", "max_length", "tolerance"):
        message = re.sub(rf"^{name}[= ]", f"--{name.replace('_', '-')} ", message)
    return message


def _finish(result, out: str, pin: str | None, as_json: bool) -> None:
    from flashcheck.core.environment import write_pin

    if pin is not None and result.passed:
        write_pin(pin, result.environment)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print(result, out)
        if pin is not None:
            typer.echo(f"pin written to {pin}" if result.passed else f"pin {pin} not written: the validation failed")
    raise typer.Exit(0 if result.passed else 1)


def _usable(out: str) -> None:
    """--out checked (exit 2, one line) before the first line and the heavy imports."""
    try:
        _out_folder(out)
    except ValueError as exc:
        _fail_usage(str(exc))


def _kv_inputs(model: str | None, kv_cache: str, sizes: tuple, out: str):
    """(folder, formats, sim kernels, the fp32 model, prompt ids) of `validate --kv-cache`, every option checked
    before the model is loaded: ValueError, one line."""
    from flashcheck.validate.kvcache import IMPL, expand_formats, random_prompts, register

    impls, new_tokens, prompts, prompt_len = sizes
    from flashcheck.validate.sim_impl import is_sim, parse_sim

    kernels = tuple(parse_sim(i) for i in _names(impls, "--impls") if is_sim(i))  # others: exact attention
    folder = _out_folder(out)
    _not_others(folder, "validate", VALIDATE_KEYS)  # not a study's summary.json
    for flag, value in (("--new-tokens", new_tokens), ("--prompts", prompts), ("--prompt-len", prompt_len)):
        if value < 1:
            raise ValueError(f"{flag} {value} is not allowed; give a positive integer")
    try:  # every option checked before the model is looked at or loaded
        formats = expand_formats(kv_cache)
    except ValueError as exc:
        raise ValueError(f"--kv-cache {kv_cache!r}: {exc}") from None
    if model is None or not model.strip():
        raise ValueError(f"MODEL {model!r}: --kv-cache needs a decoder model folder (Hugging Face causal LM)")
    _need_transformers()
    from flashcheck.validate.loading import load_model, resolve_model

    info = resolve_model(model)  # the folder's files checked as validate checks them (regular, inside it)
    if not info.causal:
        raise ValueError(f"MODEL {model!r} is not a causal LM; --kv-cache needs a decoder (its architectures)")
    if kernels:
        import torch

        from flashcheck.core.modelconfig import read_model_config
        from flashcheck.validate.sim_impl import check_config

        check_config([k.impl for k in kernels], read_model_config(info.path / "config.json"), [torch.float32])
    register()
    lm = load_model(info, "fp32", impl=IMPL)
    ids = random_prompts(lm.config.vocab_size, prompts, prompt_len)
    return folder, formats, kernels, lm, ids


def _validate_kv(model: str | None, kv_cache: str, sizes: tuple, out: str, as_json: bool) -> None:
    """`validate MODEL --kv-cache ...`: the decoder's generation with each KV cache against the bf16 cache, with
    exact attention and with each sim: kernel of --impls (sizes: impls, new_tokens, prompts, prompt_len)."""
    _usable(out)
    _starting(f"validate: {model}'s generation with KV caches {kv_cache} against the bf16 cache, into {out}")
    from flashcheck.validate.kvcache import fmt_row, kv_cache_check

    _, new_tokens, prompts, prompt_len = sizes
    try:
        folder, formats, kernels, lm, ids = _kv_inputs(model, kv_cache, sizes, out)
    except ValueError as exc:
        _fail_usage(str(exc))
    import time

    t0 = time.perf_counter()
    rows = kv_cache_check(lm, formats, ids, new_tokens, kernels)
    summary = {"model": model, "prompts": prompts, "prompt_len": prompt_len, "new_tokens": new_tokens,
               "seconds": time.perf_counter() - t0, "rows": [r.to_dict() for r in rows]}  # fmt: skip
    from flashcheck.core.fileio import write_atomic

    folder.mkdir(exist_ok=True)
    write_atomic(folder / "summary.json", json.dumps(summary, indent=2))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        raise typer.Exit(0)
    from rich.table import Table

    table = Table(
        title=f"validate {model} --kv-cache: {prompts} prompts x {new_tokens} greedy tokens, vs the bf16 cache"
    )
    for col in ("KV cache", "token agreement", "first divergence", "KL(bf16 || cache)", "prefill vs decode |dlogp|",
                "s"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        table.add_row(*fmt_row(r))
    c = _console()
    c.print(table)
    c.print(f"run time {summary['seconds']:.1f} s; summary: {folder}/summary.json")
    raise typer.Exit(0)
