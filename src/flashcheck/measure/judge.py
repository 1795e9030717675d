"""`flashcheck judge`: outputs computed by any framework (JAX, MLX, Candle, ONNX Runtime, a CUDA kernel),
read from a dump, judged like `compare --backend`: against the FP64 reference of the dumped inputs, divided
by eager PyTorch in the dump's dtype (the one baseline rule), with flashcheck's budget (or the peers').

A dump holds q [B, H, Lq, D], k, v [B, Hkv, Lk, D|Dv] (Hkv divides H), `out` [B, H, Lq, Dv] or several
`out.NAME`, optionally `mask` (bool, True = keep, or additive; broadcasts to [B, H, Lq, Lk]), `grad_out`
with `dq`, `dk`, `dv` (or `dq.NAME` ... per output); settings `scale` (default 1/sqrt(D)), `causal`
(bottom-right aligned, default false) and `dtype` (the format the implementation computed in; default the
narrowest float dtype of q, k, v and the outputs) as safetensors metadata or npz 0-d arrays."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashcheck.core.budget import K_FORWARD, K_GRADIENT, RULES, check_budget
from flashcheck.core.metrics import ratio
from flashcheck.core.numerics import Format, info, parse_format, round_to
from flashcheck.kernels import reference_attention
from flashcheck.kernels.sim.validation import check_attention_inputs
from flashcheck.measure.case import HEADLINE, _errors, dead_row_outcome
from flashcheck.measure.dumpfile import Dump, DumpError, read_dump
from flashcheck.measure.runs import run_float64

INPUTS = ("q", "k", "v")
GRADS = ("dq", "dk", "dv")
SETTINGS = ("scale", "causal", "dtype")
BASELINE_FORMATS = (Format.FP64, Format.FP32, Format.BF16, Format.FP16)  # what eager PyTorch runs in


@dataclass(frozen=True, slots=True)
class Judged:
    """A dump checked: float64 inputs, the outputs by name ("" for `out`), gradients per output name."""

    path: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    outs: dict[str, torch.Tensor]
    grads: dict[str, tuple[torch.Tensor, ...]]
    grad_out: torch.Tensor | None
    mask: torch.Tensor | None
    scale: float | None
    causal: bool
    fmt: Format
    out_dtypes: dict[str, str]


def load(path: str) -> Judged:
    """Read and check a dump; DumpError (a ValueError) names the tensor or setting at fault."""
    dump = read_dump(path, allowed=_known_names, declared=_declared)
    t, where = dump.tensors, repr(dump.path)
    _check_names(dump)
    missing = [n for n in INPUTS if n not in t]
    outs = {n.partition(".")[2]: t[n] for n in t if n == "out" or n.startswith("out.")}
    if missing or not outs:
        need = ", ".join([*missing, *([] if outs else ["out (or out.NAME)"])])
        raise DumpError(
            f"{where} misses tensor(s) {need}; a dump holds q, k, v and out (see `flashcheck judge --help`)"
        )
    for name in [*INPUTS, *(f"out.{n}" if n else "out" for n in outs)]:
        if not t[name].is_floating_point():
            raise DumpError(f"{where}: tensor {name!r} has dtype {t[name].dtype}; expected a floating dtype")
    _check_values(dump)
    q, k, v = (t[n].double() for n in INPUTS)
    mask = t.get("mask")
    scale = _scale(dump)
    try:
        check_attention_inputs(q, k, v, mask=mask, scale=scale)
    except ValueError as exc:
        raise DumpError(f"{where}: {exc}") from None
    want = (*q.shape[:3], v.shape[-1])
    for name, o in outs.items():
        if tuple(o.shape) != want:
            label = f"out.{name}" if name else "out"
            raise DumpError(
                f"{where}: tensor {label!r} has shape {tuple(o.shape)}; expected [B, H, Lq, Dv] = {list(want)}"
            )
    grads, grad_out = _grads(dump, outs, q, k, v)
    fmt = _format(dump, [t[n] for n in INPUTS] + list(outs.values()))
    outs64 = {n: o.double() for n, o in outs.items()}
    dtypes = {n: str(o.dtype).replace("torch.", "") for n, o in outs.items()}
    return Judged(dump.path, q, k, v, outs64, grads, grad_out, mask, scale, _causal(dump), fmt, dtypes)


ALLOWED_NAMES = "q, k, v, out, out.NAME, mask, grad_out, dq, dk, dv (dq.NAME ...), settings scale, causal, dtype"


def _known_names(path: str, names: list[str]) -> None:
    """DumpError naming what a dump may hold, before any of its data is read (read_dump's `allowed`)."""
    tensors = {*INPUTS, "mask", "grad_out"}
    bad = [
        n
        for n in names
        if n not in tensors and n not in SETTINGS
        and (n.partition(".")[0] not in ("out", *GRADS) or n.endswith(".") or n.count(".") > 1)
    ]  # fmt: skip
    if bad:
        raise DumpError(f"{path!r}: unknown name(s) {', '.join(map(repr, bad[:8]))}; allowed {ALLOWED_NAMES}")


def _declared(path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """Before any data is read (read_dump's `declared`): an output whose declared shape is not the inputs'
    [B, H, Lq, Dv], and inputs whose judging (the FP64 reference, the eager baseline) cannot fit in memory here,
    are refused, so that a small file declaring a huge array never has it inflated."""
    q, k, v = (shapes.get(n) for n in INPUTS)
    if q is None or k is None or v is None or not len(q) == len(k) == len(v) == 4:
        return  # load() names what is missing or malformed
    want = (*q[:3], v[-1])
    for name, shape in shapes.items():
        if (name == "out" or name.startswith("out.")) and shape != want:
            raise DumpError(
                f"{path!r}: tensor {name!r} has shape {tuple(shape)}; expected [B, H, Lq, Dv] = {list(want)}"
            )
    _fits_dims(q, k, v, work=4, backward=any(n.partition(".")[0] in GRADS for n in shapes))


def _check_names(dump: Dump) -> None:
    known = {*INPUTS, "mask", "grad_out"}
    bad = [n for n in dump.tensors if n not in known and n.partition(".")[0] not in ("out", *GRADS)]
    bad += [n for n in dump.meta if n not in SETTINGS and n not in dump.tensors]
    bad += [n for n in dump.tensors if n.endswith(".") or n.count(".") > 1]
    if bad:
        raise DumpError(f"{dump.path!r}: unknown name(s) {', '.join(map(repr, bad))}; allowed {ALLOWED_NAMES}")


def _check_values(dump: Dump) -> None:
    """DumpError for an input with no values (L = 0: nothing to judge, and every check would pass vacuously) or
    with NaN or Inf (the FP64 reference of such inputs is not a number, so no output can be judged against it)."""
    t, where = dump.tensors, repr(dump.path)
    for name in (*INPUTS, "grad_out"):
        if name not in t:
            continue
        x = t[name]
        if x.numel() == 0:
            raise DumpError(f"{where}: tensor {name!r} has shape {list(x.shape)}, no values; B, H, L, D must be > 0")
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            nan, first = int(torch.isnan(x).sum()), [int(i) for i in bad.nonzero()[0]]
            raise DumpError(
                f"{where}: input {name!r} holds {nan} NaN and {int(bad.sum()) - nan} infinite values (the first at "
                f"{first}); the FP64 reference of non-finite inputs is not a number: dump finite inputs"
            )


def _scale(dump: Dump) -> float | None:
    text = dump.meta.get("scale")
    if text is None:
        return None
    try:
        s = float(text)
    except ValueError:
        s = math.nan
    if not math.isfinite(s) or s <= 0:
        raise DumpError(f"{dump.path!r}: scale {text!r} is not allowed; give a positive finite number")
    return s


def _causal(dump: Dump) -> bool:
    text = dump.meta.get("causal", "false").strip().lower()
    if text not in ("true", "false", "1", "0"):
        raise DumpError(f"{dump.path!r}: causal {text!r} is not allowed; give true or false (1 or 0)")
    return text in ("true", "1")


def _format(dump: Dump, tensors: list[torch.Tensor]) -> Format:
    """The `dtype` setting, else the narrowest float dtype among the inputs and outputs."""
    text = dump.meta.get("dtype")
    if text is None:
        return min((_of(t.dtype) for t in tensors), key=lambda f: info(f).bits)
    try:
        fmt = parse_format(text)
    except ValueError:
        fmt = None
    if fmt not in BASELINE_FORMATS:
        allowed = ", ".join(f.value for f in BASELINE_FORMATS)
        raise DumpError(f"{dump.path!r}: unknown dtype {text!r}; allowed {allowed} (eager PyTorch runs the baseline)")
    return fmt


def _of(dtype: torch.dtype) -> Format:
    return {torch.float64: Format.FP64, torch.float32: Format.FP32, torch.bfloat16: Format.BF16}.get(dtype, Format.FP16)


def _grads(dump: Dump, outs: dict, q, k, v) -> tuple[dict[str, tuple[torch.Tensor, ...]], torch.Tensor | None]:
    """Per output name the dumped (dq, dk, dv), each checked against its input's shape; grad_out with them."""
    t, where = dump.tensors, repr(dump.path)
    given = [n for n in t if n.partition(".")[0] in GRADS]
    if not given:
        if "grad_out" in t:
            raise DumpError(f"{where}: grad_out is given without dq, dk, dv")
        return {}, None
    if "grad_out" not in t:
        raise DumpError(f"{where}: gradients {', '.join(given)} need grad_out (the dO they were computed with)")
    do = t["grad_out"].double()
    if do.shape != next(iter(outs.values())).shape:
        raise DumpError(f"{where}: grad_out has shape {tuple(do.shape)}; expected the output's {list(do.shape)}")
    grads = {}
    for name in outs:
        keys = [f"{g}.{name}" if name else g for g in GRADS]
        have = [key in t for key in keys]
        if any(have) and not all(have):
            raise DumpError(
                f"{where} misses tensor(s) {', '.join(key for key, h in zip(keys, have, strict=True) if not h)}"
            )
        if all(have):
            for key, x in zip(keys, (q, k, v), strict=True):
                if t[key].shape != x.shape:
                    raise DumpError(
                        f"{where}: tensor {key!r} has shape {tuple(t[key].shape)}; expected {list(x.shape)}"
                    )
            grads[name] = tuple(t[key].double() for key in keys)
    orphans = [n for n in given if n.partition(".")[2] not in grads]
    if orphans:
        raise DumpError(f"{where}: gradient(s) {', '.join(orphans)} belong to no output in the file")
    return grads, do


def judge(path: str, rule: str = "flashcheck") -> list[dict]:
    """Every output of the dump judged, in the form of `compare --backend`'s results (run_backend_case).
    rule: "flashcheck" (calibrated max, rel_l2, bias and row views: a 1% gain error fails) or "peers" (the
    field's k=2 forward, 3 gradient max and mean test, as `compare --backend`); see flashcheck.core.budget."""
    if rule not in RULES:
        raise ValueError(f"--rule {rule!r} is not allowed; expected one of {', '.join(RULES)}")
    j = load(path)
    _fits(j)
    kw = dict(causal=j.causal, mask=j.mask, scale=j.scale)
    ref, lse = reference_attention(j.q, j.k, j.v, return_lse=True, **kw)
    live = torch.isfinite(lse)
    live = None if bool(live.all()) else live
    if live is not None and not bool(live.any()):
        raise DumpError(f"{j.path!r}: the mask leaves no query row a visible key; there is no error to measure")
    rounded = [round_to(x, j.fmt) for x in (j.q, j.k, j.v)]
    ref_rounded = reference_attention(*rounded, **kw)
    dtype = info(j.fmt).dtype
    base_fn = _eager(dtype, kw)
    base, base_g = run_float64(base_fn, [x.to(dtype) for x in (j.q, j.k, j.v)], j.grad_out if j.grads else None)
    ref_g = None
    if j.grads:
        _, ref_g = run_float64(lambda a, b, c: reference_attention(a, b, c, **kw), (j.q, j.k, j.v), j.grad_out)
    seen = (slice(None),) if live is None else (live,)
    base_err = _errors(base, ref, HEADLINE, live)
    results = []
    for name, out in j.outs.items():
        cand = _errors(out, ref, HEADLINE, live)
        res = {
            "config": _config(j, name),
            "status": "ok",
            "baseline_impl": f"eager:{j.fmt.value}",
            "candidate": cand,
            "baseline": base_err,
            "ratio": ratio(cand, base_err),
            "vs_rounded_inputs": {"candidate": _errors(out, ref_rounded, HEADLINE, live)},
            "kernel_ops": [],
            "kernel_verified": None,
            "budget": _budget(out[seen], ref[seen], base[seen], dtype, rule, gradient=False),
            "dead_rows": dead_row_outcome(out, live),
        }
        if name in j.grads:
            res["grad"] = _grad_results(j.grads[name], base_g, ref_g, live, (dtype, rule))
        results.append(res)
    return results


def _fits(j: Judged) -> None:
    """InsufficientMemory (a ValueError) before computing when the FP64 reference and the eager baseline (L x L
    scores) of these shapes cannot fit here: a small file can name a large L."""
    _fits_dims(j.q.shape, j.k.shape, j.v.shape, max(4, info(j.fmt).dtype.itemsize), bool(j.grads))


def _fits_dims(q: tuple, k: tuple, v: tuple, work: int, backward: bool) -> None:
    from flashcheck.kernels.sim.memory import Footprint, check_fits

    b, h, lq, d = q
    dims = dict(batch=b, heads=h, seq_len=lq, head_dim=max(d, v[-1]), seq_len_k=k[-2])
    check_fits(Footprint(**dims, kernels=("standard",), work_itemsize=work, backward=backward))


def _eager(dtype: torch.dtype, kw: dict):
    from flashcheck.backends import get_backend

    eager = get_backend("eager")
    return lambda a, b, c: eager.run(a, b, c, device="cpu", **kw)


def _config(j: Judged, name: str) -> dict:
    b, h, lq, d = j.q.shape
    label = f"out.{name}" if name else "out"
    return {
        "file": j.path,
        "backend": label,
        "label": label,
        "numerics": j.fmt.value,
        "out_dtype": j.out_dtypes[name],
        "device": "file",
        "seq_len": lq,
        "seq_len_k": j.k.shape[-2],
        "batch": b,
        "heads": h,
        "kv_heads": j.k.shape[1],
        "head_dim": d,
        "causal": j.causal,
        "scale": j.scale,
        "mask": None if j.mask is None else str(j.mask.dtype).replace("torch.", ""),
    }


def _budget(out, ref, base, dtype, rule: str, gradient: bool) -> dict:
    """The budget under `rule`: the peers' fixed k (2 forward, 3 gradients) or flashcheck's calibrated one."""
    k = (K_GRADIENT if gradient else K_FORWARD) if rule == "peers" else None
    return check_budget(out, ref, base, k=k, dtype=dtype, rule=rule, gradient=gradient).to_dict()


def _grad_results(cand_g, base_g, ref_g, live, how: tuple) -> dict:
    """Per dQ, dK, dV: errors vs FP64 autograd through the reference, the ratio and the budget under the rule
    (`how` = (dtype, rule)); dQ over the rows with a visible key (as compare --backward)."""
    dtype, rule = how
    out = {}
    for name, cg, bg, rg in zip(GRADS, cand_g, base_g, ref_g, strict=True):
        rows = live if name == "dq" else None
        ce, be = _errors(cg, rg, HEADLINE, rows), _errors(bg, rg, HEADLINE, rows)
        budget = _budget(cg, rg, bg, dtype, rule, gradient=True)
        out[name] = {"candidate": ce, "baseline": be, "ratio": ratio(ce, be), "budget": budget}
    return out
