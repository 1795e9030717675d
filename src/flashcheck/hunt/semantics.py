"""The semantics table: what a target returns where attention has no key to attend to, beside flashcheck's
convention (kernels/sim/validation.py: such a row's output is 0, as with IREE and MLX; a sink-only row gives 0
too, the sink column having no value). A disagreement is a finding of its own kind, not an error."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashcheck.hunt.case import HuntCase, make_inputs
from flashcheck.hunt.judge import _rounded
from flashcheck.hunt.target import Target

CONVENTION = "zeros"


@dataclass(frozen=True, slots=True)
class Probe:
    """One row of the table: what was asked, what the target returned on its keyless rows, and whether that is
    the convention."""

    name: str
    case: HuntCase
    returned: str  # zeros | NaN | Inf | mean of V | other (max |x| ...) | error: ... | not taken: ...
    agrees: bool | None  # None: not measured (the target refused or cannot take the case)

    def to_dict(self) -> dict:
        return {
            "probe": self.name,
            "case": self.case.to_text(),
            "returned": self.returned,
            "convention": CONVENTION,
            "agrees": self.agrees,
        }


def probe_cases(dtype: str) -> dict[str, HuntCase]:
    """The four probes, small: fully masked rows, no key at all, causal with Lq > Lk, a sink and nothing else."""
    return {
        "fully masked rows": HuntCase(dtype=dtype, lq=8, lk=8, dead=3),
        "Lk = 0": HuntCase(dtype=dtype, lq=8, lk=0),
        "causal, Lq > Lk": HuntCase(dtype=dtype, lq=8, lk=4, causal=True),
        "sink-only rows": HuntCase(dtype=dtype, lq=8, lk=8, dead=3, sink=5.0),
    }


def classify(rows: torch.Tensor, v: torch.Tensor) -> str:
    """What the keyless rows [.., n, D] hold: zeros, NaN, Inf, the mean of V (uniform weights) or other."""
    if rows.numel() == 0:
        return "zeros"
    if bool(torch.isnan(rows).any()):
        return "NaN" if bool(torch.isnan(rows).all()) else "NaN (some)"
    if bool(torch.isinf(rows).any()):
        return "Inf"
    if bool((rows == 0).all()):
        return "zeros"
    if v.shape[-2] and torch.allclose(rows, v.mean(dim=-2, keepdim=True).expand_as(rows), rtol=1e-2, atol=1e-3):
        return "mean of V"
    return f"other (max |x| {float(rows.abs().max()):.3g})"


def probe(target: Target, name: str, case: HuntCase) -> Probe:
    """Run one probe; an exception is what the target returned ("error: ..."), not a failure of the table."""
    if case.has_mask and not target.masks:
        return Probe(name, case, "not taken: the target takes no mask", None)
    if case.sink is not None and not (target.masks or target.native_sink):
        return Probe(name, case, "not taken: the target takes no sink", None)
    q, k, v, _ = make_inputs(case)
    mask, sink = _rounded(case)
    kw = {"dtype": case.dtype, "causal": case.causal, "scale": case.call_scale, "mask": mask, "sink": sink}
    try:
        with torch.no_grad():
            out = target.call(q, k, v, **kw)
    except Exception as exc:  # raising on an empty key set is a semantics too; raising on every case is not
        said = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        return Probe(name, case, said, None if _refuses_plain(target, case.dtype) else False)
    if tuple(out.shape) != (case.batch, case.heads, case.lq, case.head_dim):
        return Probe(name, case, f"other (shape {tuple(out.shape)})", False)
    from flashcheck.hunt.case import keyless_rows

    rows = out[..., keyless_rows(case), :]
    values = (
        k.new_zeros(*v.shape[:-2], 1, v.shape[-1])
        if case.lk == 0
        else v.repeat_interleave(case.heads // case.kv_heads, dim=1)
    )
    returned = classify(rows, values)
    return Probe(name, case, returned, returned == CONVENTION)


def _refuses_plain(target: Target, dtype: str) -> bool:
    """The target raises on a plain case too (every key visible): its error is a refusal, not a semantics."""
    plain = HuntCase(dtype=dtype, lq=4, lk=4)
    try:
        with torch.no_grad():
            target.call(
                *make_inputs(plain)[:3], dtype=dtype, causal=False, scale=plain.softmax_scale, mask=None, sink=None
            )
    except Exception:
        return True
    return False


def semantics_table(
    target: Target,
    *,
    isolate: bool = True,
    worker=None,
    timeout_s: float | None = None,
    on_probe: Callable[[Probe], None] | None = None,
) -> list[Probe]:
    """Every probe, in the target's fp32 (else its first dtype). With `isolate`, probes that may kill their
    process or hang run in the hunt's worker (hunt.isolate.IsolatedTarget: `worker`, else one of this call's own
    with `timeout_s`), each in a call of its own, under its timeout: every probe of a target the hunt isolates
    (backends, callables); of a simulator preset the Lk = 0 probe (torch 2.13's CPU flash kernel dies of SIGFPE at
    Lk = 0). A probe that kills the worker reads "crash: the process died of SIGNAL", one that gives no answer in
    time "hang: no answer in N s". `on_probe`: called with each row as it is measured (progress)."""
    from flashcheck.hunt.isolate import isolates

    dtype = "fp32" if "fp32" in target.dtypes else target.dtypes[0]
    cases = probe_cases(dtype)
    risky = [n for n, c in cases.items() if isolate and (c.lk == 0 or isolates(target))]
    seen = on_probe or (lambda p: None)
    with contextlib.ExitStack() as stack:
        if risky and worker is None:
            worker = stack.enter_context(_own_worker(target, timeout_s))
        done = {}
        for name, case in cases.items():
            done[name] = _in_worker(worker, name, case) if name in risky else probe(target, name, case)
            seen(done[name])
    return [done[n] for n in cases]


@contextlib.contextmanager
def _own_worker(target: Target, timeout_s: float | None):
    import tempfile
    from pathlib import Path

    from flashcheck.hunt.isolate import IsolatedTarget

    with (
        tempfile.TemporaryDirectory(prefix="flashcheck-probe-") as tmp,
        IsolatedTarget(target, Path(tmp) / "output", timeout_s) as worker,
    ):
        yield worker


def _probe_in_worker(target: Target, name: str) -> Probe:
    """In the worker: probe `name` of the target's probe cases."""
    dtype = "fp32" if "fp32" in target.dtypes else target.dtypes[0]
    return probe(target, name, probe_cases(dtype)[name])


def _in_worker(worker, name: str, case: HuntCase) -> Probe:
    """Probe `name` run in the worker: its row, or a crash or hang row when the worker died or gave no answer."""
    from flashcheck.hunt.isolate import HANG
    from flashcheck.hunt.target import BadOutput, TargetCrashed, TargetRaised

    try:
        return worker.call(_probe_in_worker, name)
    except TargetCrashed as exc:
        if exc.signal == HANG:
            return Probe(name, case, f"hang: {exc.line}", False)
        return Probe(name, case, f"crash: the process died of {exc.signal}", False)
    except (TargetRaised, BadOutput) as exc:  # raised outside the target's call (probe itself catches those)
        return Probe(name, case, f"error: {str(exc)[:120]}", None)
