"""One hunted case judged: the target against the FP64 reference, by the budget of the same-precision baseline.

The reference is exact attention (kernels.sim.reference, with the sink as its own softmax column) on the inputs
the target received, rounded to the case's dtype; the baseline is plain PyTorch in that dtype (eager, the
peers' out_pt), called the way the target is; of it, the same with Q.K^T summed in the other order (head dim
reversed), and for bf16 / fp16 the same in fp32 rounded to the dtype, the one with the largest max error: one
plain run can be exact by chance (a tiny output whose scores cancel, a one-hot softmax whose bf16 dQ is 0),
while a correct kernel that sums in another order or accumulates in fp32 (as PyTorch's math backend) is not.
FP8 cases, which plain PyTorch cannot run, take compare's FP8 baseline instead: the standard kernel under policy
baseline-fp8 (per-tensor scales, the case's FP8 input format; measure.method's Method.baseline), and its
head-dim-reversed twin; their budget is the one compare applies to an FP8 backend (the peers' rule at the FP8
dtype: k = 2, the fp16 rounding floor).
Each of out (and dq, dk, dv with a backward) is judged by
core.budget.check_budget (the peers' rule by default: max error <= k x the baseline's + floor, mean error,
no NaN / Inf where the reference is finite). Rows with no visible key follow flashcheck's convention (zeros,
kernels/sim/validation.py): a failure confined to them is a semantics finding, not an arithmetic one."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from flashcheck.core.budget import BudgetResult, check_budget, rounding_floor
from flashcheck.hunt.case import FP8, HuntCase, keyless_rows, make_inputs, make_mask
from flashcheck.hunt.target import BadOutput, Target, TargetCrashed, TargetRaised, sink_as_key

TENSORS = ("out", "dq", "dk", "dv")
# overflow: the baseline too; crash: the process died or hung; output: not a tensor of the right shape
KINDS = ("nan", "inf", "overflow", "budget", "semantics", "crash", "output")


# a failed check as a finding's message says it: the error's statistic and its unit (the tensor's own)
CHECK_WORDS = {"max": "max |error|", "mean": "mean |error|", "nonfinite": "non-finite entries"}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One tensor's judgment. rows: the first and last token (query row for out/dq, key for dk/dv) over the
    budget, head: the first such head, count: how many rows; margin: the worst check's value / bound."""

    tensor: str
    passed: bool
    kind: str
    margin: float
    message: str
    rows: tuple[int, int] | None = None
    head: int | None = None
    count: int = 0
    bounds: tuple[float, float] = (math.nan, math.nan)  # the budget's bounds on the max and the mean error

    def where(self) -> str:
        """'head 3, tokens 64-127, dq NaN' (what failed where), or the tensor and kind alone."""
        what = {"nan": "NaN", "inf": "Inf", "overflow": "overflow"}.get(self.kind, self.kind)
        if self.kind == "crash":
            return "the target hung" if self.tensor == "hang" else f"the process died of {self.tensor}"
        if self.kind == "output":
            return "its output is not a tensor of [B, H, Lq, D]"
        if self.rows is None:
            return f"{self.tensor} {what}"
        a, b = self.rows
        span = f"token {a}" if a == b else f"tokens {a}-{b}"
        return f"head {self.head}, {span}, {self.tensor} {what}"

    def to_dict(self) -> dict:
        return {
            "tensor": self.tensor,
            "passed": self.passed,
            "kind": self.kind,
            "margin": self.margin,
            "message": self.message,
            "rows": list(self.rows) if self.rows else None,
            "head": self.head,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """A case's verdicts, or the error the target raised on it (a refusal: not judged)."""

    case: HuntCase
    verdicts: tuple[Verdict, ...] = ()
    error: str | None = None

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.passed]

    @property
    def passed(self) -> bool:
        return self.error is None and not self.failures

    def margin(self) -> float:
        return max((v.margin for v in self.verdicts), default=0.0)


def _rounded(case: HuntCase):
    """The mask and sink as the target receives them (an additive mask and the sink rounded to the dtype, fp32
    for FP8 cases)."""
    mask = make_mask(case)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(case.mask_dtype).to(torch.float64)
    sink = None if case.sink is None else float(torch.tensor(case.sink).to(case.mask_dtype))
    return mask, sink


def _run(fn, inputs, dout, backward: bool) -> dict[str, torch.Tensor]:
    leaves = [t.clone().requires_grad_(backward) for t in inputs]
    with torch.enable_grad() if backward else torch.no_grad():
        out = fn(*leaves)
        res = {"out": out.detach().double().cpu()}
        if backward:
            grads = torch.autograd.grad(out, leaves, dout.to(out.dtype, copy=True), allow_unused=True)
            for name, g, t in zip(TENSORS[1:], grads, leaves, strict=True):
                res[name] = (torch.zeros_like(t) if g is None else g).detach().double().cpu()
    return res


def reference(case: HuntCase, inputs: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
    """FP64 out (and dq, dk, dv) of the case's rounded inputs (`inputs`: make_inputs(case), when already made)."""
    from flashcheck.kernels import reference_attention

    q, k, v, dout = make_inputs(case) if inputs is None else inputs
    mask, sink = _rounded(case)

    def fn(a, b, c):
        causal, m = case.causal, mask
        if sink is not None:  # the sink as its own key: the same softmax column as reference_attention(sink=),
            b, c, m = sink_as_key(a, b, c, mask, causal, sink)  # and gradients that stay 0 on keyless rows
            causal = False
        return reference_attention(a, b, c, causal=causal, mask=m, scale=case.softmax_scale)

    return _run(fn, (q, k, v), dout, case.backward)


def outputs(target: Target, case: HuntCase, inputs: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
    """The target's out (and dq, dk, dv) on the case, float64 on the CPU; exceptions propagate. `inputs`:
    make_inputs(case), when already made (the target gets copies)."""
    q, k, v, dout = make_inputs(case) if inputs is None else inputs
    mask, sink = _rounded(case)
    kw = {"dtype": case.dtype, "causal": case.causal, "scale": case.call_scale, "mask": mask, "sink": sink}
    return _run(lambda a, b, c: target.call(a, b, c, **kw), (q, k, v), dout, case.backward)


def plain_attention(q, k, v, *, causal=False, scale=None, mask=None) -> torch.Tensor:
    """backends.eager's attention with every op in q's dtype, rows with no visible key 0 in the output and in the
    gradients, and a NaN of scores that overflow kept (the judge calls a non-finite baseline an overflow)."""
    from flashcheck.backends.eager import eager_attention

    return eager_attention(q, k, v, causal=causal, scale=scale, mask=mask, nan_to_zero=False)


def _flipped(q, k, v, **kw) -> torch.Tensor:
    return plain_attention(q.flip(-1), k.flip(-1), v, **kw)


def baseline_target(flip: bool = False, dtype: str = "fp32") -> Target:
    """Plain PyTorch attention in the case's dtype, on the CPU (the peers' baseline); `flip`: the same with the
    head dim of Q and K reversed (the same scores in exact arithmetic, summed in the other order). An FP8
    `dtype`: the standard kernel under baseline-fp8 at that input format (simulated, float64 in and out)."""
    if dtype in FP8:
        name = f"standard:baseline-fp8@{dtype}"
        return Target(name, "backend", _fp8_baseline(dtype, flip), (dtype,), float64_io=True)
    return Target("eager", "backend", _flipped if flip else plain_attention, ("fp64", "fp32", "bf16", "fp16"))


def _fp8_baseline(dtype: str, flip: bool):
    from flashcheck.core.numerics import parse_policy
    from flashcheck.kernels import standard_attention

    policy = parse_policy(f"baseline-fp8,input={dtype}")

    def fn(q, k, v, **kw):
        q, k = (q.flip(-1), k.flip(-1)) if flip else (q, k)
        return standard_attention(q, k, v, policy=policy, **kw)

    return fn


def _bad(o, r, res: BudgetResult) -> torch.Tensor:
    """[B, H, L] rows out of budget: an entry over the max bound or not finite where the reference is; when no
    entry is, the rows whose mean error passes the mean check's bound (a failure of the mean test alone)."""
    err = torch.nan_to_num((o - r).abs(), nan=math.inf).masked_fill(~torch.isfinite(r), 0.0)
    rows = (err > res.k * res.baseline_max + res.floor).any(dim=-1)
    mean = next((c for c in res.checks if c.name == "mean" and not c.passed), None)
    if not bool(rows.any()) and mean is not None:
        rows = err.mean(dim=-1) > mean.bound
    return rows


def _locate(o, r, res: BudgetResult, only=None) -> tuple[tuple[int, int] | None, int | None, int, torch.Tensor]:
    """(first, last) row out of budget, the first such head, the number of such rows, and which rows [L];
    `only` ([B, H, L, D] bool): the rows with such an entry instead (the NaN rows of a NaN finding)."""
    per_row = _bad(o, r, res) if only is None else only.any(dim=-1)
    along = per_row.any(dim=(0, 1))
    rows = along.nonzero().flatten()
    if rows.numel() == 0:
        return None, None, 0, along
    heads = per_row.any(dim=(0, 2)).nonzero().flatten()
    return (int(rows[0]), int(rows[-1])), int(heads[0]), int(rows.numel()), along


def arithmetic_floors(case: HuntCase, ref: dict[str, torch.Tensor], inputs: tuple | None = None) -> dict[str, float]:
    """The rounding error any correct kernel that works in fp32 (fp64 for fp64 inputs), unit roundoff u, makes:
    a score s is rounded by u |s|, which exp turns into a relative error of P, so every tensor T is off by up to
    u S max|T| (S the largest |score + shift|: scores of 1e4, or a shift of -200 on a tiny output, whose FP32
    floor is 0); and dS_ij = P_ij (dP_ij - D_i) with dP_ij = dO_i . V_j rounded by u sum_d |dO_id V_jd|, scaled
    by `scale` and the other operand: u |scale| max|K| max_ij sum_d |dO_id V_jd| in dQ (dK: with Q). First-order
    bounds, each doubled; far above the peers' floor where the softmax is one-hot (dQ exactly 0 in FP64). `inputs`:
    make_inputs(case), when already made."""
    from flashcheck.kernels.sim.validation import expand_kv_heads

    q, k, v, dout = make_inputs(case) if inputs is None else inputs
    k, v = expand_kv_heads(q, k, v)
    u = 2.0**-53 if case.dtype == "fp64" else 2.0**-24
    top = {n: float(t[torch.isfinite(t)].abs().max()) if bool(torch.isfinite(t).any()) else 0.0 for n, t in ref.items()}
    scores = float(torch.matmul(q, k.transpose(-1, -2)).abs().max()) * abs(case.softmax_scale) if k.numel() else 0.0
    s_max = max(1.0, scores + abs(case.shift), abs(case.sink or 0.0))
    floors = {n: 2 * u * s_max * m for n, m in top.items()}
    if case.backward and v.numel():
        dp = float(torch.matmul(dout.abs(), v.abs().transpose(-1, -2)).max()) * abs(case.softmax_scale) * u
        floors["dq"] += 2 * dp * float(k.abs().max())
        floors["dk"] += 2 * dp * float(q.abs().max())
    return floors


def judge_tensor(name: str, o, r, b, case: HuntCase, rule: str, floor: float = 0.0) -> Verdict:
    """The verdict on one tensor: passed, or its failure's kind, place and the failed checks. Entries where
    the baseline is not finite are not judged by the budget; the target not finite there too is 'overflow'."""
    base_bad = torch.isfinite(r) & ~torch.isfinite(b)
    r = r.masked_fill(base_bad, float("nan"))
    floor = max(floor, rounding_floor(r[torch.isfinite(r)], case.torch_dtype))  # NaN-free: judged entries only
    res = check_budget(o, r, b, dtype=case.torch_dtype, rule=rule, gradient=name != "out", floor=floor)
    margin = max((c.margin for c in res.checks if c.name != "nonfinite"), default=0.0)
    if res.passed and not bool((base_bad & ~torch.isfinite(o)).any()):
        return Verdict(name, True, "ok", margin, "")
    if res.passed:
        n = int((base_bad & ~torch.isfinite(o)).sum())
        return Verdict(name, False, "overflow", 1.0, f"{n} entries not finite, as in the baseline")
    finite_ref = torch.isfinite(r)
    only = None
    if bool((finite_ref & torch.isnan(o)).any()):
        kind, only = "nan", finite_ref & torch.isnan(o)
    elif bool((finite_ref & torch.isinf(o)).any()):
        kind, only = "inf", finite_ref & torch.isinf(o)
    else:
        kind = "budget"
    rows, head, count, bad_rows = _locate(o, r, res, only)
    if name in ("out", "dq") and bool(bad_rows.any()) and bool((bad_rows <= keyless_rows(case)).all()):
        kind = "semantics"
    failed = "; ".join(f"{CHECK_WORDS.get(c.name, c.name)} {c.value:.3g} > budget {c.bound:.3g}" for c in res.failed())
    limits = {c.name: c.bound for c in res.checks}
    bounds = (limits.get("max", math.nan), limits.get("mean", math.nan))
    return Verdict(
        name, False, kind, max(margin, 1.0 if kind != "budget" else margin), failed, rows, head, count, bounds
    )


def representable(ref: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The reference with entries beyond `dtype`'s largest finite value set to NaN: no result in that dtype
    can hold them, so they are not judged (check_budget leaves out entries where the reference is not finite)."""
    top = torch.finfo(dtype).max
    return {n: t.masked_fill(t.abs() > top, float("nan")) for n, t in ref.items()}


def _worse(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Of two baselines, the one with the larger max error against `ref` (a non-finite one: `a`)."""
    finite = torch.isfinite(ref)
    ea, eb = ((t - ref).abs()[finite] for t in (a, b))  # not finite where ref is: where t is not (one pass each)
    if not bool(torch.isfinite(ea).all()) or not bool(torch.isfinite(eb).all()):
        return a
    return b if ea.numel() and float(eb.max()) > float(ea.max()) else a


def crash_verdict(exc: TargetCrashed) -> Verdict:
    """A dead target process as a failure: kind crash, the signal's name in place of a tensor."""
    return Verdict(exc.signal, False, "crash", 1.0, exc.line or "(nothing on stderr)")


def evaluate(target: Target, case: HuntCase, rule: str = "peers", run=None) -> Outcome:
    """Run the target, the reference and the baseline on `case` and judge every tensor; an exception from the
    target is recorded as its error (a refusal), not raised. `run`: case -> the target's outputs, in place of
    outputs(target, case) (hunt.isolate: in a worker; its TargetCrashed is a crash verdict)."""
    inputs = None  # made once for the target, the reference, the baselines and the floors; a worker makes its own
    try:
        if run is None:
            inputs = make_inputs(case)
        got = outputs(target, case, inputs) if run is None else run(case)
    except TargetCrashed as exc:
        return Outcome(case, (crash_verdict(exc),))
    except BadOutput as exc:  # not a tensor, or the wrong shape: a finding on any case, never a refusal
        return Outcome(case, (Verdict("out", False, "output", 1.0, str(exc)),))
    except TargetRaised as exc:  # raised in the worker: already 'Type: message'
        return Outcome(case, error=(str(exc).splitlines() or [""])[0][:300])
    except Exception as exc:  # the target refused the case (an unsupported shape, dtype or mask)
        return Outcome(case, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    inputs = make_inputs(case) if inputs is None else inputs  # not before a worker's refusal, crash or hang
    fp8 = case.dtype in FP8
    ref = representable(reference(case, inputs), torch.float16 if fp8 else case.torch_dtype)  # FP8: 16-bit out
    base = outputs(baseline_target(dtype=case.dtype), case, inputs)
    flipped = outputs(baseline_target(flip=True, dtype=case.dtype), case, inputs)
    base = {n: _worse(base[n], flipped[n], ref[n]) for n in base}
    if case.torch_dtype.itemsize < 4 and not fp8:  # the larger error of plain attention in the dtype and in fp32
        up = outputs(baseline_target(), dataclasses.replace(case, dtype="fp32"))
        base = {n: _worse(base[n], up[n].to(case.torch_dtype).double(), ref[n]) for n in base}
    floors = arithmetic_floors(case, ref, inputs)
    verdicts = tuple(
        judge_tensor(n, got[n], ref[n], base[n], case, rule, floors.get(n, 0.0)) for n in TENSORS if n in ref
    )
    return Outcome(case, keyless_gradients(verdicts))


def keyless_gradients(verdicts: tuple[Verdict, ...]) -> tuple[Verdict, ...]:
    """dK / dV failures of a case whose keyless query rows already disagree (a semantics verdict on out or dq) are
    semantics too: those rows' convention (e.g. the mean of V where FP64 has no weights at all) gives them softmax
    weights, and so gradient mass on the keys, that the reference has not; judged by the budget they read as an
    arithmetic failure of bound 0."""
    if not any(v.kind == "semantics" and v.tensor in ("out", "dq") for v in verdicts):
        return verdicts
    return tuple(
        dataclasses.replace(
            v, kind="semantics", margin=max(v.margin, 1.0), message=f"{v.message} (from the keyless rows)"
        )
        if not v.passed and v.tensor in ("dk", "dv") and v.kind != "crash"
        else v
        for v in verdicts
    )
