"""`validate_model`: run a model under each attention implementation and dtype, compare every run with the
reference (eager, fp32) in the context of its format, and return (and optionally write) the verdict."""

from __future__ import annotations

import dataclasses
import gc
import os
import warnings
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import flashcheck.validate.cache as run_cache
from flashcheck.core.environment import environment_fingerprint
from flashcheck.validate.corpus import MIN_TEXTS, builtin_corpus, read_texts, sample_texts, texts_hash
from flashcheck.validate.forward import encode_texts, length_batches, max_length_rows, pad_batch
from flashcheck.validate.judge import TOLERANCES, Context, judge, make_context
from flashcheck.validate.loading import (
    DTYPES,
    ModelInfo,
    ModelLoadError,
    ModelSource,
    check_impls,
    describe_model_object,
    load_tokenizer,
    resolve_model,
    switch_impl,
)
from flashcheck.validate.result import Comparison, Skipped, ValidationResult
from flashcheck.validate.run import Plan, RunOutput, execute
from flashcheck.validate.sim_run import check_sims, with_layer_errors

DEFAULT_IMPLS = ("eager", "sdpa", "flash_attention_2")
DEFAULT_DTYPES = ("fp32", "bf16")
PROMPT_TOKENS = 24
Progress = Callable[[int, str], AbstractContextManager[Callable[..., None]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What a validation runs; every field is checked by `check`."""

    impls: tuple[str, ...] = DEFAULT_IMPLS
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    samples: int | None = 1000  # texts drawn from the corpus (None: all)
    max_length: int | None = None  # None: the model's maximum
    batch_size: int = 32
    tolerance: str | float = "default"  # strict | default | loose, or k itself
    probe_texts: int = 64  # texts whose every layer is compared (plus the max-length rows)
    max_length_rows: int = 4  # rows of exactly max_length tokens
    invariance_texts: int = 32  # texts in one right- and one left-padded batch (with a fully padded row)
    invariance_singles: int = 8  # of them, run at batch size 1 too
    new_tokens: int = 16  # greedy tokens per prompt (causal LMs)
    prompts: int = 4
    topk: int = 10
    device: str | None = None  # None: cuda when available, else cpu
    seed: int = 0

    def check(self) -> None:
        for name in ("batch_size", "probe_texts", "invariance_texts", "invariance_singles", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is not allowed; it must be a positive integer")
        for name in ("max_length_rows", "new_tokens", "prompts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} is not allowed; it must be >= 0")
        if not self.impls or not self.dtypes:
            raise ValueError("give at least one attention implementation and one dtype")
        bad = [d for d in self.dtypes if d not in DTYPES or d == "fp64"]
        if bad:
            raise ValueError(f"dtype {bad[0]!r} is not allowed; expected some of fp32, bf16, fp16")
        if isinstance(self.tolerance, str) and self.tolerance not in TOLERANCES:
            raise ValueError(f"tolerance {self.tolerance!r} is not allowed; expected {TOLERANCES} or a number >= 1")
        if not isinstance(self.tolerance, str) and not self.tolerance >= 1:
            raise ValueError(f"tolerance {self.tolerance!r} is not allowed; a number k must be >= 1")
        if self.samples is not None and self.samples < MIN_TEXTS:
            raise ValueError(f"samples={self.samples} is not allowed; at least {MIN_TEXTS} are needed")
        check_impls(list(self.impls))
        from flashcheck.validate.sim_impl import is_sim, parse_sim

        for impl in self.impls:
            if is_sim(impl):
                parse_sim(impl)  # an unknown sim: name lists the valid ones, before any model is loaded


def _texts(texts: list[str] | str | Path | None) -> list[str]:
    if texts is None:
        return builtin_corpus()
    if isinstance(texts, str | Path):
        return read_texts(texts)
    out = [t.strip() for t in texts if isinstance(t, str) and t.strip()]
    if len(out) < MIN_TEXTS:
        raise ValueError(f"{len(out)} non-empty texts given; at least {MIN_TEXTS} are needed")
    return out


def _max_length(info: ModelInfo, tok, requested: int | None) -> int:
    if requested is None:
        return info.max_length
    if requested < 2 or requested > info.position_limit:
        raise ValueError(
            f"max_length {requested} is not allowed for this model; it takes 2 to {info.position_limit} tokens "
            f"(max_position_embeddings)"
        )
    return requested


def build_plan(info: ModelInfo, tok, texts: list[str], s: Settings, max_length: int, device: str) -> Plan:
    """Tokenise once; batches for all texts, the probe set, the invariance texts and the prompts."""
    enc = encode_texts(tok, texts, max_length)
    rows = max_length_rows(tok, texts, enc, max_length, s.max_length_rows)
    n = len(texts)
    enc_all = enc + rows
    row_ids = list(range(n, n + len(rows)))
    probe_texts = list(range(min(s.probe_texts, n)))
    tail = [pad_batch(tok, enc_all, row_ids)] if rows else []
    return Plan(
        tok=tok,
        enc=enc_all,
        n_texts=n,
        probe=probe_texts + row_ids,
        batches=length_batches(tok, enc_all, list(range(n)), s.batch_size) + tail,
        probe_batches=length_batches(tok, enc_all, probe_texts, s.batch_size) + tail,
        invariance_ids=list(range(min(s.invariance_texts, n))),
        invariance_singles=s.invariance_singles,
        prompts=[e["input_ids"][:PROMPT_TOKENS] for e in enc[: s.prompts]] if info.causal else [],
        pooling=info.pooling,
        normalize=info.normalize,
        causal=info.causal,
        new_tokens=s.new_tokens,
        device=device,
    )


def _schedule(s: Settings) -> list[tuple[str, list[str]]]:
    """(dtype, impls) in run order: fp64 (the context of fp32), the reference fp32, then the other dtypes;
    eager first in each."""
    others = [i for i in dict.fromkeys(s.impls) if i != "eager"]
    out = [("fp64", ["eager"])] if "fp32" in s.dtypes else []
    out.append(("fp32", ["eager", *(others if "fp32" in s.dtypes else [])]))
    out += [(d, ["eager", *others]) for d in dict.fromkeys(s.dtypes) if d != "fp32"]
    return out


def _host_memory_available() -> int:
    """MemAvailable from /proc/meminfo (free plus reclaimable cache), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _fits_fp64(source: ModelSource) -> str | None:
    """Why an fp64 copy of the model would not fit in memory here (None: it fits)."""
    need = source.fp64_bytes()
    try:
        avail = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else _host_memory_available()
    except (OSError, ValueError, RuntimeError):
        return None
    return None if need < 0.5 * avail else f"an fp64 copy needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} free"


@dataclass(slots=True)
class _Session:
    plan: Plan
    settings: Settings
    source: ModelSource
    out: Path | None
    key: dict
    advance: Callable[..., None]
    ref: RunOutput | None = None
    fp64: RunOutput | None = None
    ref_model: object | None = None  # eager fp32, kept for the simulated kernels' isolated runs
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def steps(self, dtype: str) -> int:
        return len(self.plan.probe_batches) if dtype == "fp64" else len(self.plan.batches) + 2


def _error_row(impl: str, dtype: str, against: str, e: BaseException) -> Comparison:
    text = str(e).strip().splitlines()
    return Comparison(
        a=f"{impl}:{dtype}",
        b=against,
        impl=impl,
        dtype=dtype,
        k=float("nan"),
        error=f"{type(e).__name__}: {text[0] if text else ''}",
    )


def _config_or_none(source: ModelSource) -> dict:
    """source.config(), or {} where it cannot be read (a cached run is then checked without the model's layout)."""
    try:
        return source.config()
    except (OSError, ValueError, AttributeError):
        return {}


def _eager(sess: _Session, dtype: str, get_model: Callable) -> RunOutput:
    """The eager run in dtype: from the cache in --out when there, else computed (and cached)."""
    path = run_cache.cache_file(sess.out, "eager", dtype, sess.key) if sess.out else None
    cached = run_cache.load_run(path) if path else None
    layout = run_cache.model_layout(_config_or_none(sess.source)) if cached is not None else None
    why = run_cache.run_fits(cached, sess.plan, "eager", dtype, dtype == "fp64", layout) if cached is not None else ""
    if why:  # a damaged or hand-made file: computed again (and the file replaced)
        warnings.warn(f"ignoring the cache file {str(path)!r}: {why}", stacklevel=2)
        cached = None
    if cached is not None:
        sess.advance(sess.steps(dtype), f"eager:{dtype} (cached)")
        return cached
    run = execute(sess.plan, get_model(), "eager", dtype, probe_only=dtype == "fp64", advance=sess.advance)
    if path:
        run_cache.save_run(path, run)
    return run


def _context(sess: _Session, dtype: str, eager: RunOutput) -> Context:
    """Set the reference / fp64 run, make dtype's context and add the row of eager in dtype."""
    s = sess.settings
    if dtype == "fp32":
        sess.ref = eager
        sess.plan.ref_tokens = [g["tokens"] for g in eager.generation] if eager.generation else None
    ctx = make_context(dtype, sess.ref, eager, sess.fp64, tolerance=s.tolerance, n_texts=sess.plan.n_texts, topk=s.topk)
    sess.notes += [n for n in ctx.notes if n not in sess.notes]
    if dtype == "fp32":
        if "fp32" in s.dtypes:
            sess.comparisons.append(judge(eager, ctx, against=sess.fp64))
        return ctx
    sess.comparisons.append(judge(eager, ctx))
    return ctx


def _run_dtype(sess: _Session, dtype: str, impls: list[str]) -> None:
    """Load the model once in dtype, run eager (or take it from the cache), then every other impl."""
    model = None

    def get_model():
        nonlocal model
        if model is None:
            model = sess.source.load(dtype, "eager", sess.plan.device)
        return model

    if dtype == "fp64":
        why = _fits_fp64(sess.source)
        try:
            sess.fp64 = None if why else _eager(sess, dtype, get_model)
        except (RuntimeError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
        if why:
            sess.notes.append(f"fp32's own deviation (vs fp64) not measured: {why}; its rounding floor alone is used")
        kept = _watch(model)
        del model
        _release(kept)
        return
    try:
        eager = _eager(sess, dtype, get_model)
    except ModelLoadError:
        raise
    except Exception as e:
        if dtype == "fp32":
            raise ValueError(f"the reference run (eager, fp32) failed: {type(e).__name__}: {e}") from None
        sess.comparisons.append(_error_row("eager", dtype, "eager:fp32", e))
        sess.skipped += [Skipped(i, dtype, "eager failed in this dtype, so there is no context") for i in impls[1:]]
        return
    ctx = _context(sess, dtype, eager)
    for impl in impls[1:]:
        _run_impl(sess, get_model(), impl, dtype, ctx)
    kept = _watch(model)
    del model
    _release(kept)


def _watch(model: object) -> Callable[[], object]:
    """kept() -> `model` while anything still holds it, else None (a weak reference); for an object that takes
    no weak reference, a stand-in that always says kept."""
    if model is None:
        return lambda: None
    try:
        return weakref.ref(model)
    except TypeError:
        return lambda: True


def _release(kept: Callable[[], object]) -> None:
    """Before the next dtype's copy of the model loads: a full collection only where a reference cycle still
    keeps the last one (kept(), after the caller dropped its name) or CUDA memory is to be handed back; a
    collection costs ~0.5 s in a process that imported transformers, and validate ran two."""
    if kept() is not None or torch.cuda.is_available():
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_impl(sess: _Session, model, impl: str, dtype: str, ctx: Context) -> None:
    reason = switch_impl(model, impl)
    if reason:
        sess.skipped.append(Skipped(impl, dtype, reason))
        sess.advance(sess.steps(dtype), f"{impl}:{dtype} skipped")
        return
    try:
        run = execute(sess.plan, model, impl, dtype, probe_only=False, advance=sess.advance)
    except Exception as e:  # an implementation that crashes on this model fails its comparison; it is reported
        sess.comparisons.append(_error_row(impl, dtype, "eager:fp32", e))
        return
    cmp = judge(run, ctx)
    # say where: per layer and head, forward when the comparison failed, backward always (a NaN gradient fails it)
    where = _where(sess, model, impl, dtype, cmp.k, forward=not cmp.passed)
    if where is not None and (not cmp.passed or where["backward"]):
        cmp = dataclasses.replace(cmp, where=where)
    if impl.startswith("sim:"):
        ref_model = model if dtype == "fp32" else _ref_model(sess)
        cmp = with_layer_errors(cmp, sess.plan, ref_model, DTYPES[dtype], sess.ref, sess.advance, sess.notes)
    sess.comparisons.append(cmp)


def _ref_model(sess: _Session):
    """The reference model (eager fp32), loaded once and kept for the simulated kernels' isolated runs."""
    if sess.ref_model is None:
        sess.ref_model = sess.source.load("fp32", "eager", sess.plan.device)
    return sess.ref_model


def _where(sess: _Session, model, impl: str, dtype: str, k: float, *, forward: bool) -> dict | None:
    """locate.locate on the first probe batch (the first batch without probes); None where there is no batch
    or locate failed (a note says why; a layout it does not understand is said in `where` itself)."""
    from flashcheck.validate.locate import LayoutUnknown, locate

    batch = (sess.plan.probe_batches or sess.plan.batches or [None])[0]
    if batch is None:
        return None
    try:
        found = locate(model, impl, batch, sess.plan.device, k if k == k else 3.0, DTYPES[dtype], forward=forward)
    except LayoutUnknown as e:
        return {"layer": None, "head": None, "tokens": None, "what": None, "text": f"not located: {e}",
                "backward": None, "backward_nonfinite": False}  # fmt: skip
    except Exception as e:  # localisation is an aid: it never turns a verdict into a crash
        sess.notes.append(f"{impl}:{dtype}: could not locate the divergence ({type(e).__name__}: {e})")
        return None
    return found.to_dict()


def _source(model, tokenizer) -> tuple[ModelSource, object]:
    if model is None or isinstance(model, str | Path):
        info = resolve_model(model)
        return ModelSource(info), load_tokenizer(info)
    info = describe_model_object(model, tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return ModelSource(info, model), tokenizer


def validate_model(
    model=None,
    texts: list[str] | str | Path | None = None,
    *,
    impls: tuple[str, ...] | list[str] = DEFAULT_IMPLS,
    dtypes: tuple[str, ...] | list[str] = DEFAULT_DTYPES,
    samples: int | None = 1000,
    max_length: int | None = None,
    batch_size: int = 32,
    tolerance: str | float = "default",
    out: str | Path | None = None,
    tokenizer=None,
    progress: Progress | None = None,
    **options,
) -> ValidationResult:
    """Validate `model` (a model folder, None for the bundled all-MiniLM-L6-v2, or a transformers model
    object with its `tokenizer`) on `texts` (a list, a file with one text per line, or None for the built-in
    corpus) under each attention implementation and dtype. With `out`, write summary.json, report.md,
    report.html and figures there and cache the eager runs for the next call. `progress(total, label)`:
    a context manager yielding `advance(n=1, note="")`. ValueError for bad input. Other Settings fields
    (probe_texts, invariance_texts, new_tokens, prompts, topk, device, ...) go in `options`."""
    s = Settings(
        impls=tuple(impls),
        dtypes=tuple(dtypes),
        samples=samples,
        max_length=max_length,
        batch_size=batch_size,
        tolerance=tolerance,
        **options,
    )
    s.check()
    source, tok = _source(model, tokenizer)
    check_sims(source, s.impls, [DTYPES[d] for d in s.dtypes])
    length = _max_length(source.info, tok, s.max_length)
    sample = sample_texts(_texts(texts), s.samples, s.seed)
    device = s.device or ("cuda" if torch.cuda.is_available() else "cpu")
    plan = build_plan(source.info, tok, sample, s, length, device)
    key = {
        "model": source.info.fingerprint,
        "texts": texts_hash(sample),
        "max_length": length,
        "device": device,
        "settings": {k: v for k, v in asdict(s).items() if k not in ("impls", "dtypes", "tolerance")},
        "env": environment_fingerprint(),
    }
    schedule = _schedule(s)
    sess = _Session(plan, s, source, Path(out) if out else None, key, advance=lambda n=1, note="": None)
    total = sum(sess.steps(d) for d, impls_d in schedule for _ in impls_d)
    with (progress or _silent)(total, "validate, batches run") as advance:  # a unit: not texts, not comparisons
        sess.advance = advance
        for dtype, impls_d in schedule:
            _run_dtype(sess, dtype, impls_d)
    result = _result(sess, source.info, length)
    if out:
        from flashcheck.validate.report import write_validation_report

        write_validation_report(out, result)
    return result


def _silent(total: int, label: str) -> AbstractContextManager[Callable[..., None]]:
    del total, label
    return nullcontext(lambda n=1, note="": None)


def _result(sess: _Session, info: ModelInfo, length: int) -> ValidationResult:
    ran = sorted({c.impl for c in sess.comparisons if c.error is None})
    settings = {
        **asdict(sess.settings),
        "max_length": length,
        "texts": sess.plan.n_texts,
        "probe_tokens": int(sess.ref.probe_ids.numel()) if sess.ref else 0,
        "notes": sess.notes,
        "model_kind": info.kind,
        "pooling": info.pooling,
        "normalize": info.normalize,
        "causal": info.causal,
    }
    k = {}
    for c in sess.comparisons:
        k.setdefault(c.dtype, c.k)
    return ValidationResult(
        model=info.name,
        comparisons=tuple(sess.comparisons),
        skipped=tuple(sess.skipped),
        environment=environment_fingerprint(",".join(ran) or None),
        settings=settings,
        k=k,
    )
