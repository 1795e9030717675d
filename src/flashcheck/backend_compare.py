"""A real backend (or simulator) against the FP64 reference and the same-precision baseline, forward and
backward, with proof of the kernel that ran, the peers' budget, and determinism checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from flashcheck.backends import get_backend
from flashcheck.backends.base import DEVICES
from flashcheck.backends.profiling import attention_ops, proves
from flashcheck.backends.simulators import SimBackend
from flashcheck.core.budget import K_FORWARD, K_GRADIENT, check_budget
from flashcheck.core.inputs import InputSpec, make_grad, make_qkv
from flashcheck.core.metrics import error_summary, ratio
from flashcheck.core.numerics import FP8_FORMATS, info, parse_format, round_to
from flashcheck.kernels import reference_attention, standard_attention


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
    """Real backends take the tensors in the format's dtype (their adapter moves them to the device);
    simulators take float64."""
    if isinstance(backend, SimBackend):
        return tuple(t.clone() for t in tensors)
    dtype = info(fmt).dtype
    return tuple(t.to(dtype) for t in tensors)


def _baseline(case: BackendCase, fmt, device: str):
    """The same-precision baseline: eager PyTorch in the dtype on the candidate's device (as the peers
    compute it), or sim-standard under a policy (on the CPU)."""
    if case.baseline_numerics or fmt in FP8_FORMATS:
        pol = case.baseline_numerics or "baseline-fp8"
        return f"sim-standard[{pol}]", lambda a, b, c: standard_attention(a, b, c, policy=pol, causal=case.causal)
    dtype, eager = info(fmt).dtype, get_backend("eager")
    return f"eager[{fmt.value}]", lambda a, b, c: eager.run(
        a.to(dtype), b.to(dtype), c.to(dtype), device=device, causal=case.causal
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


def _skip_reason(backend, case: BackendCase, dtype, device: str) -> str | None:
    avail = backend.available(dtype, device)
    if not avail.ok:
        return avail.reason
    return backend.backward_reason(device) if case.backward else None


def run_backend_case(case: BackendCase, *, device: str) -> dict:
    """The comparison as a JSON-able object (status skipped with a reason where the backend cannot run).

    `device` ("cpu" or "cuda") is where a real backend runs: its adapter moves the inputs there and the
    outputs and gradients come back to the CPU for the metrics; the baseline runs there too. Simulators
    run on the CPU. The config records the device used."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    fmt = parse_format(case.numerics)
    backend = _backend(case)
    dev = "cpu" if isinstance(backend, SimBackend) else device
    label = getattr(backend, "label", lambda: backend.name)()
    head = {"config": {**dataclasses.asdict(case), "label": label, "device": dev}}
    dtype = info(fmt).dtype if not isinstance(backend, SimBackend) else None
    if reason := _skip_reason(backend, case, dtype, dev):
        return {**head, "status": "skipped", "reason": reason}
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
    fn = lambda a, b, c: backend.run(a, b, c, device=dev, causal=case.causal)  # noqa: E731
    cand, cand_g = _run(fn, _inputs_for(backend, fmt, (q, k, v)), do)
    ref, ref_g = _run(lambda a, b, c: reference_attention(a, b, c, causal=case.causal), (q, k, v), do)
    base_name, base_fn = _baseline(case, fmt, dev)
    base, base_g = _run(base_fn, (q, k, v), do)
    rounded = tuple(round_to(t, fmt) for t in (q, k, v)) if fmt not in FP8_FORMATS else (q, k, v)
    ref_r = reference_attention(*rounded, causal=case.causal)
    c_err, b_err = error_summary(cand, ref), error_summary(base, ref)
    proof = backend.proof_on(dev)
    ops = attention_ops(lambda: fn(*_inputs_for(backend, fmt, (q, k, v))), proof, device=dev)
    budget_dtype = dtype or info(fmt).dtype
    out = {
        **head,
        "status": "ok",
        "baseline_impl": base_name,
        "candidate": c_err,
        "baseline": b_err,
        "ratio": ratio(c_err, b_err),
        "vs_rounded_inputs": {"candidate": error_summary(cand, ref_r)},
        "kernel_ops": ops,
        "kernel_verified": proves(ops, proof),
        "budget": check_budget(cand, ref, base, k=K_FORWARD, dtype=budget_dtype, rule="peers").to_dict(),
    }
    if case.backward:
        out["grad"] = _grad_summary(cand_g, base_g, ref_g, budget_dtype)
    if case.determinism:
        out["determinism"] = determinism(backend, fmt, (q, k, v), case, do, device=dev)
    return out


def _grad_summary(cand_g, base_g, ref_g, dtype) -> dict:
    """dq, dk, dv of candidate and baseline against the FP64 reference, each with the peers' budget."""
    grads = {}
    for name, cg, bg, rg in zip(("dq", "dk", "dv"), cand_g, base_g, ref_g, strict=True):
        ce, be = error_summary(cg, rg), error_summary(bg, rg)
        grads[name] = {
            "candidate": ce,
            "baseline": be,
            "ratio": ratio(ce, be),
            "budget": check_budget(cg, rg, bg, k=K_GRADIENT, dtype=dtype, rule="peers").to_dict(),
        }
    return grads


def determinism(backend, fmt, tensors, case: BackendCase, do=None, *, device: str) -> dict:
    """Repeated runs on `device` bit-identical (forward, and backward with do); one batch row alone ==
    inside a batch."""
    fn = lambda a, b, c: backend.run(a, b, c, device=device, causal=case.causal)  # noqa: E731
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
