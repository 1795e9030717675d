"""The semantics table: what a target returns where attention has no key to attend to, beside flashcheck's
convention (kernels/sim/validation.py: such a row's output is 0, as with IREE and MLX; a sink-only row gives 0
too, the sink column having no value). A disagreement is a finding of its own kind, not an error."""

from __future__ import annotations

import contextlib
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
    kw = {"dtype": case.dtype, "causal": case.causal, "scale": case.softmax_scale, "mask": mask, "sink": sink}
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


def semantics_table(target: Target, *, isolate: bool = True) -> list[Probe]:
    """Every probe, in the target's fp32 (else its first dtype). With `isolate`, probes that may kill their
    process run in a child (never plain fork: unsafe once JAX or a BLAS pool runs): every probe of a target the
    hunt isolates (isolate.isolates: backends, callables), all in one child and, when it dies, each in its own
    to tell which; of a simulator preset the Lk = 0 probe (torch 2.13's CPU flash kernel dies of SIGFPE at
    Lk = 0). A probe that kills its child reads "crash: the process died of SIGNAL"."""
    from flashcheck.hunt.isolate import isolates

    dtype = "fp32" if "fp32" in target.dtypes else target.dtypes[0]
    cases = probe_cases(dtype)
    risky = [n for n, c in cases.items() if isolate and (c.lk == 0 or isolates(target))]
    done = {n: probe(target, n, c) for n, c in cases.items() if n not in risky}
    together = _in_child(target, risky) if len(risky) > 1 else None
    if isinstance(together, list):
        done |= {p.name: p for p in together}
    for name in (n for n in risky if n not in done):
        one = _in_child(target, [name])
        crash = Probe(name, cases[name], f"crash: the process died of {one}", False)
        done[name] = one[0] if isinstance(one, list) else crash
    return [done[n] for n in cases]


def _child(conn, text: str, device: str, names: list[str]) -> None:
    from flashcheck.hunt.target import parse_target

    target = parse_target(text, device)
    dtype = "fp32" if "fp32" in target.dtypes else target.dtypes[0]
    cases = probe_cases(dtype)
    conn.send([probe(target, n, cases[n]) for n in names])
    conn.close()


def _in_child(target: Target, names: list[str]) -> list[Probe] | str:
    """The probes `names` run in a child process: their rows, or the signal (or exit code) it died of."""
    from flashcheck.hunt.isolate import signal_name, worker_context

    ctx = worker_context()  # forked from the fork server (torch loaded), else spawned
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, target.name, target.device, names), daemon=True)
    proc.start()
    send.close()
    rows = None
    with contextlib.suppress(EOFError):  # EOF: the child died before it answered
        rows = receive.recv()
    proc.join(60)
    if rows is not None:
        return rows
    return signal_name(proc.exitcode)
