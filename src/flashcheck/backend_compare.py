"""A real backend (or simulator) against the FP64 reference and the same-precision baseline, forward and
backward, with proof of the kernel that ran, the peers' budget, and determinism checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from flashcheck.backends import get_backend
from flashcheck.backends.eager import eager_attention
from flashcheck.backends.profiling import attention_ops, proves
from flashcheck.backends.simulators import SimBackend
from flashcheck.budget import K_FORWARD, K_GRADIENT, check_budget
from flashcheck.inputs import InputSpec, make_grad, make_qkv
from flashcheck.kernels import reference_attention, standard_attention
from flashcheck.metrics import error_summary, ratio
from flashcheck.numerics import FP8_FORMATS, info, parse_format, round_to


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCase:
    """One backend at one dtype and length. `preset` / `policy` / blocks configure sim-flash;
    `baseline_numerics` replaces the eager same-precision baseline by sim-standard under that policy."""

    backend: str
    numerics: str = "bf16"
    seq_len: int = 1024
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = False
    distribution: str = "normal"
    seed: int = 0
    preset: str | None = None
    policy: str | None = None
    block_q: int = 128
    block_k: int = 128
    algorithm: str = "fa2"
    baseline_numerics: str | None = None
    backward: bool = False
    determinism: int = 0  # repeated runs to compare bit for bit (0: skip)


def _backend(case: BackendCase):
    b = get_backend(case.backend)
    if isinstance(b, SimBackend):
        fmt = parse_format(case.numerics).value
        b = b.configured(
            policy=case.policy or (f"{fmt}-mixed" if b.kernel == "flash" else fmt),
            preset=case.preset,
            fmt=fmt,
            block_q=case.block_q,
            block_k=case.block_k,
            algorithm=case.algorithm,
        )
    return b  # preset and policy configure the simulators only


def _inputs_for(backend, fmt, tensors):
    """Real backends take the tensors in the format's dtype on their device; simulators take float64."""
    if isinstance(backend, SimBackend):
        return tuple(t.clone() for t in tensors)
    dtype = info(fmt).dtype
    return tuple(t.to(backend.device(), dtype) for t in tensors)


def _baseline(case: BackendCase, fmt, q, k, v, grad: bool):
    """The same-precision baseline: eager PyTorch in the dtype, or sim-standard under a policy."""
    if case.baseline_numerics or fmt in FP8_FORMATS:
        pol = case.baseline_numerics or "baseline-fp8"
        return f"sim-standard[{pol}]", lambda a, b, c: standard_attention(a, b, c, policy=pol, causal=case.causal)
    dtype = info(fmt).dtype
    return f"eager[{fmt.value}]", lambda a, b, c: eager_attention(
        a.to(dtype), b.to(dtype), c.to(dtype), causal=case.causal
    )


def _run(fn, tensors, do=None):
    """fn(*tensors) as float64 on the CPU, and with do the gradients of (out * do).sum() too."""
    if do is None:
        with torch.no_grad():
            return fn(*tensors).detach().double().cpu(), None
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    out.backward(do.to(out.device, out.dtype))
    return out.detach().double().cpu(), tuple(t.grad.detach().double().cpu() for t in leaves)


def run_backend_case(case: BackendCase) -> dict:
    """The comparison as a JSON-able object (status skipped with a reason where the backend cannot run)."""
    fmt = parse_format(case.numerics)
    backend = _backend(case)
    head = {"config": {**dataclasses.asdict(case), "label": getattr(backend, "label", lambda: backend.name)()}}
    dtype = info(fmt).dtype if not isinstance(backend, SimBackend) else None
    avail = backend.available(dtype)
    if not avail.ok:
        return {**head, "status": "skipped", "reason": avail.reason}
    if case.backward and backend.backward_reason():
        return {**head, "status": "skipped", "reason": backend.backward_reason()}
    spec = InputSpec(
        batch=case.batch,
        heads=case.heads,
        seq_len=case.seq_len,
        head_dim=case.head_dim,
        distribution=case.distribution,
        seed=case.seed,
    )
    q, k, v = make_qkv(spec)
    do = make_grad(q.shape, case.seed) if case.backward else None
    fn = lambda a, b, c: backend.forward(a, b, c, causal=case.causal)  # noqa: E731
    cand, cand_g = _run(fn, _inputs_for(backend, fmt, (q, k, v)), do)
    ref, ref_g = _run(lambda a, b, c: reference_attention(a, b, c, causal=case.causal), (q, k, v), do)
    base_name, base_fn = _baseline(case, fmt, q, k, v, case.backward)
    base, base_g = _run(base_fn, (q, k, v), do)
    rounded = tuple(round_to(t, fmt) for t in (q, k, v)) if fmt not in FP8_FORMATS else (q, k, v)
    ref_r = reference_attention(*rounded, causal=case.causal)
    c_err, b_err = error_summary(cand, ref), error_summary(base, ref)
    ops = attention_ops(lambda: fn(*_inputs_for(backend, fmt, (q, k, v))), backend.ops)
    out = {
        **head,
        "status": "ok",
        "baseline_impl": base_name,
        "candidate": c_err,
        "baseline": b_err,
        "ratio": ratio(c_err, b_err),
        "vs_rounded_inputs": {"candidate": error_summary(cand, ref_r)},
        "kernel_ops": ops,
        "kernel_verified": proves(ops, backend.ops),
        "budget": check_budget(cand, ref, base, k=K_FORWARD, dtype=dtype or info(fmt).dtype).to_dict(),
    }
    if case.backward:
        out["grad"] = {}
        for name, cg, bg, rg in zip(("dq", "dk", "dv"), cand_g, base_g, ref_g, strict=True):
            ce, be = error_summary(cg, rg), error_summary(bg, rg)
            out["grad"][name] = {
                "candidate": ce,
                "baseline": be,
                "ratio": ratio(ce, be),
                "budget": check_budget(cg, rg, bg, k=K_GRADIENT, dtype=dtype or info(fmt).dtype).to_dict(),
            }
    if case.determinism:
        out["determinism"] = determinism(backend, fmt, (q, k, v), case, do)
    return out


def determinism(backend, fmt, tensors, case: BackendCase, do=None) -> dict:
    """Repeated runs bit-identical (forward, and backward with do); one batch row alone == inside a batch."""
    fn = lambda a, b, c: backend.forward(a, b, c, causal=case.causal)  # noqa: E731
    first, first_g = _run(fn, _inputs_for(backend, fmt, tensors), do)
    fwd_same = bwd_same = True
    for _ in range(case.determinism - 1):
        again, again_g = _run(fn, _inputs_for(backend, fmt, tensors), do)
        fwd_same &= torch.equal(first, again)
        if do is not None:
            bwd_same &= all(torch.equal(a, b) for a, b in zip(first_g, again_g, strict=True))
    spec = InputSpec(
        batch=max(2, case.batch),
        heads=case.heads,
        seq_len=case.seq_len,
        head_dim=case.head_dim,
        distribution=case.distribution,
        seed=case.seed + 1,
    )
    batch = make_qkv(spec)
    full, _ = _run(fn, _inputs_for(backend, fmt, batch))
    alone, _ = _run(fn, _inputs_for(backend, fmt, tuple(t[1:2] for t in batch)))
    res = {
        "runs": case.determinism,
        "forward_identical": bool(fwd_same),
        "batch_invariant": bool(torch.equal(full[1:2], alone)),
        "batch_max_diff": float((full[1:2] - alone).abs().max()),
    }
    if do is not None:
        res["backward_identical"] = bool(bwd_same)
    return res
