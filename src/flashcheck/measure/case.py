"""One measurement: a Case (inputs, method, baseline, what to measure) run against the FP64 reference into a
frozen Record. `compare`, `compare --backend`, study cases and `explain` all go through `run_case`.

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; mask [B, 1, Lq, Lk] (InputSpec.padding); float64 on the CPU
unless a method moves them. Rows with no visible key are left out of every error (as the peers do); what the
method returns on them is recorded (`dead_rows`: zeros, nan, other)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashcheck.core.budget import K_FORWARD, K_GRADIENT, check_budget
from flashcheck.core.inputs import InputSpec, make_grad, make_mask, make_qkv
from flashcheck.core.metrics import cos_sim, max_abs, mean_abs, ratio, rel_l1, rel_l2, rmse, std_diff
from flashcheck.kernels import reference_attention, standard_attention
from flashcheck.measure.method import Method, Unavailable
from flashcheck.measure.runs import run_float64 as _run

METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], float]] = {
    "max_abs": max_abs,
    "mean_abs": mean_abs,
    "std": std_diff,
    "rmse": rmse,
    "rel_l2": rel_l2,
    "rel_l1": rel_l1,  # SageAttention's accuracy metrics (arXiv 2410.02367, 2411.10958), beside their figures
    "cos_sim": cos_sim,
}
HEADLINE = ("max_abs", "mean_abs", "rmse", "rel_l2")


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """What to measure: `method` on inputs drawn from `inputs`, divided by `baseline` (default: the one
    baseline rule, `method.baseline()`); the backward pass and repeated-run determinism on request."""

    inputs: InputSpec
    method: Method
    baseline: Method | None = None
    causal: bool = False
    backward: bool = False
    determinism: int = 0
    metrics: tuple[str, ...] = HEADLINE
    with_baseline: bool = True
    verify_kernel: bool = False

    def baseline_method(self) -> Method:
        return self.baseline if self.baseline is not None else self.method.baseline()


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """The outcome of a Case: status "ok" (errors filled), "skipped" (reason) or "failed" (reason: the error).
    `candidate`/`baseline`: errors against the FP64 reference of the original inputs; `candidate_rounded`:
    against the FP64 reference of the method's own rounded inputs (the kernel's error alone)."""

    case: Case
    status: str
    candidate: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    candidate_rounded: dict[str, float] = field(default_factory=dict)
    baseline_name: str = ""
    reason: str | None = None
    seconds: float = 0.0
    kernel_ops: tuple[str, ...] | None = None
    kernel_verified: bool | None = None
    budget: dict | None = None
    grad: dict | None = None
    determinism: dict | None = None
    dead_rows: str | None = None

    @property
    def ratio(self) -> dict[str, float]:
        return ratio(self.candidate, self.baseline) if self.baseline else {}


class References:
    """The inputs of one input set and their FP64 references: one for the original inputs, one per distinct
    input rounding (computed on first use, then reused by every method on this input set)."""

    def __init__(self, spec: InputSpec, *, causal: bool = False, device: str = "cpu") -> None:
        self.spec, self.causal, self.device = spec, causal, torch.device(device)
        self.q, self.k, self.v = make_qkv(spec)
        self.mask = make_mask(spec)
        self.reference, lse = self._reference(self.q, self.k, self.v, return_lse=True)
        live = torch.isfinite(lse)
        self.live: torch.Tensor | None = None if bool(live.all()) else live  # [B, H, Lq] rows with a visible key
        self._rounded: dict[tuple, torch.Tensor] = {}

    @property
    def computed(self) -> int:
        """How many FP64 references were computed so far."""
        return 1 + len(self._rounded)

    def rounded(self, method: Method) -> torch.Tensor:
        """The FP64 reference of the inputs as `method` sees them."""
        key = method.rounding_key()
        if key is None:
            return self.reference
        if key not in self._rounded:
            qr, kr, vr = method.rounded_inputs(self.q, self.k, self.v)
            self._rounded[key] = self._reference(qr, kr, vr)
        return self._rounded[key]

    def _reference(self, q, k, v, return_lse: bool = False):
        """The FP64 reference computed on self.device, returned on the CPU (inputs stay on the CPU)."""
        dev = self.device
        mask = None if self.mask is None else self.mask.to(dev)
        sc = self.q.shape[-1] ** -0.5  # the inputs' own D: rounded Q, K may carry more columns (kernels.formats.sage3)
        out = reference_attention(
            q.to(dev), k.to(dev), v.to(dev), causal=self.causal, mask=mask, scale=sc, return_lse=return_lse
        )
        return tuple(t.cpu() for t in out) if return_lse else out.cpu()


def _errors(
    out: torch.Tensor, ref: torch.Tensor, names: tuple[str, ...], live: torch.Tensor | None = None
) -> dict[str, float]:
    """Each metric of out vs ref over the rows in `live` ([B, H, Lq] bool; None: every row)."""
    if live is not None:
        out, ref = out[live], ref[live]
    return {name: METRICS[name](out, ref) for name in names}


def dead_row_outcome(out: torch.Tensor, live: torch.Tensor | None) -> str | None:
    """What `out` [B, H, Lq, Dv] holds on rows with no visible key: "nan" (any non-finite value), "zeros" or
    "other" (finite, not all zero); None when every row sees a key."""
    if live is None:
        return None
    dead = out[~live]
    if not bool(torch.isfinite(dead).all()):
        return "nan"
    return "zeros" if bool((dead == 0).all()) else "other"


def _runner(m: Method, causal: bool, mask: torch.Tensor | None):
    """m's function with the padding mask passed through (the simulators' and backends' own mask argument)."""
    if mask is None:
        return m.runner(causal=causal)
    if m.kernel == "standard":
        return lambda q, k, v: standard_attention(q, k, v, policy=m.policy, causal=causal, mask=mask)
    if m.is_simulator:
        return m.runner(causal=causal, mask=mask)
    b, dev = m.backend(), m.run_device
    return lambda q, k, v: b.run(q, k, v, device=dev, causal=causal, mask=mask)


def run_case(case: Case, refs: References | None = None) -> Record:
    """Run the case; a method that cannot run here gives status "skipped", any other error "failed"."""
    start = time.perf_counter()
    try:
        case.method.check_available(backward=case.backward)
        reuse = refs is not None and refs.spec == case.inputs and refs.causal == case.causal
        dev = case.method.run_device if case.method.is_simulator else "cpu"  # where the FP64 reference runs
        refs = refs if reuse else References(case.inputs, causal=case.causal, device=dev)
        rec = _measure(case, refs)
    except Unavailable as exc:
        return Record(case=case, status="skipped", reason=str(exc), seconds=time.perf_counter() - start)
    except Exception as exc:  # a failed case is recorded and a sweep goes on
        msg = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return Record(case=case, status="failed", reason=msg, seconds=time.perf_counter() - start)
    return _with(rec, seconds=time.perf_counter() - start)


def _with(rec: Record, **changes) -> Record:
    import dataclasses

    return dataclasses.replace(rec, **changes)


def _measure(case: Case, refs: References) -> Record:
    m, names = case.method, case.metrics
    qkv = (refs.q, refs.k, refs.v)
    do = make_grad(refs.q.shape, case.inputs.seed) if case.backward else None
    cand, cand_g = _run(_runner(m, case.causal, refs.mask), m.prepare(*qkv), do)
    fields: dict = {"candidate": _errors(cand, refs.reference, names, refs.live)}
    fields["candidate_rounded"] = _errors(cand, refs.rounded(m), names, refs.live)
    fields["dead_rows"] = dead_row_outcome(cand, refs.live)
    if case.backward and not case.with_baseline:
        fields["grad"] = _grads_alone(case, m, refs, cand_g)
    if case.with_baseline:
        bm = case.baseline_method()
        base, base_g = _run(_runner(bm, case.causal, refs.mask), bm.prepare(*qkv), do)
        # the baseline over the same rows as the candidate (rows with a visible key), or the ratios compare
        # errors averaged over different element sets
        fields.update(baseline=_errors(base, refs.reference, names, refs.live), baseline_name=bm.label())
        if not m.is_simulator:
            seen = (slice(None),) if refs.live is None else (refs.live,)
            trio = (cand[seen], refs.reference[seen], base[seen])
            budget = check_budget(*trio, k=K_FORWARD, dtype=m.dtype(), rule="peers")
            fields["budget"] = budget.to_dict()
        if case.backward:
            fields["grad"] = _grads(case, qkv, do, cand_g, base_g, refs.mask, refs.live)
    if case.verify_kernel and not m.is_simulator:
        from flashcheck.backends.profiling import attention_ops, proves

        b = m.backend()
        fn = m.runner(causal=case.causal)
        dev = m.run_device
        proof = b.proof_on(dev)
        ops = attention_ops(lambda: fn(*m.prepare(*qkv)), proof, device=dev)
        fields.update(kernel_ops=tuple(ops), kernel_verified=proves(ops, proof))
    if case.determinism:
        from flashcheck.measure.determinism import determinism

        fields["determinism"] = determinism(case, qkv, do)
    return Record(case=case, status="ok", **fields)


def _grads_alone(case: Case, m: Method, refs: References, cand_g) -> dict:
    """dQ, dK, dV errors vs FP64 autograd through the reference, on the original inputs ("candidate") and on the
    method's rounded inputs ("candidate_rounded": the kernel's own error); dQ over rows with a visible key."""
    do = make_grad(refs.q.shape, case.inputs.seed)

    def ref(a, b, c):
        return reference_attention(a, b, c, causal=case.causal, mask=refs.mask)

    _, ref_g = _run(ref, (refs.q, refs.k, refs.v), do)
    _, rnd_g = _run(ref, m.rounded_inputs(refs.q, refs.k, refs.v), do) if m.rounding_key() else (None, ref_g)
    out = {}
    for i, name in enumerate(("dq", "dk", "dv")):
        live = refs.live if name == "dq" else None
        out[name] = {
            "candidate": _errors(cand_g[i], ref_g[i], case.metrics, live),
            "candidate_rounded": _errors(cand_g[i], rnd_g[i], case.metrics, live),
        }
    return out


def _grads(case: Case, qkv, do, cand_g, base_g, mask: torch.Tensor | None = None, live=None) -> dict:
    """Per-gradient errors vs FP64 autograd through the reference, the ratio and the peers' k=3 budget; dQ
    over the rows in `live` ([B, H, Lq] rows with a visible key; None: every row)."""
    _, ref_g = _run(lambda a, b, c: reference_attention(a, b, c, causal=case.causal, mask=mask), qkv, do)
    dtype = case.method.dtype()
    out = {}
    for name, cg, bg, rg in zip(("dq", "dk", "dv"), cand_g, base_g, ref_g, strict=True):
        rows = live if name == "dq" else None
        ce, be = _errors(cg, rg, case.metrics, rows), _errors(bg, rg, case.metrics, rows)
        out[name] = {
            "candidate": ce,
            "baseline": be,
            "ratio": ratio(ce, be),
            "budget": check_budget(cg, rg, bg, k=K_GRADIENT, dtype=dtype, rule="peers").to_dict(),
        }
    return out
