"""Cases of a study, their records, and their evaluation (one FP64 reference per input set)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.metrics import max_abs, mean_abs, rel_l2, rmse, std_diff
from flashcheck.core.numerics import FP8_FORMATS, Format, info, parse_policy
from flashcheck.kernels import SIMULATED_KERNELS, reference_attention, simulate
from flashcheck.kernels.fp8 import round_inputs
from flashcheck.study.config import StudyConfig, Sweep

STATUSES = ("ok", "skipped", "failed")
METRICS = {"max_abs": max_abs, "mean_abs": mean_abs, "std": std_diff, "rmse": rmse, "rel_l2": rel_l2}


@dataclass(frozen=True, slots=True)
class Case:
    """One kernel under one policy on one input set. Standard cases carry block 0 x 0."""

    kernel: str
    policy: str
    algorithm: str
    block_q: int
    block_k: int
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    distribution: str
    seed: int

    @property
    def case_id(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def method(self) -> str:
        return f"{self.kernel}:{self.policy}"

    @property
    def input_key(self) -> tuple:
        return (
            self.batch,
            self.heads,
            self.seq_len,
            self.head_dim,
            self.causal,
            self.distribution,
            self.seed,
        )


@dataclass(frozen=True, slots=True)
class CaseRecord:
    """The outcome of one case: status ok (errors filled) or failed (error set)."""

    case_id: str
    case: Case
    status: str
    errors: dict[str, float]
    errors_rounded: dict[str, float]
    seconds: float
    error: str | None
    env: dict[str, str]

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d, sort_keys=True, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict) -> CaseRecord:
        """The record of a stored line; fields this version does not know (a newer one's) are ignored."""
        if d["status"] not in STATUSES:
            raise ValueError(f"status {d['status']!r}; expected one of {', '.join(STATUSES)}")
        known = {f.name for f in dataclasses.fields(Case)}
        return cls(
            case_id=str(d["case_id"]),
            case=Case(**{k: v for k, v in d["case"].items() if k in known}),
            status=d["status"],
            errors=d["errors"],
            errors_rounded=d["errors_rounded"],
            seconds=d["seconds"],
            error=d.get("error"),
            env=d.get("env", {}),
        )


def expand_sweep(sw: Sweep) -> list[Case]:
    """Every case of one sweep (standard cases deduplicated across blocks)."""
    cases: dict[str, Case] = {}
    for method in sw.all_methods():
        kernel, _, policy = method.partition(":")
        blocks = sw.blocks if kernel == "flash" else ((0, 0),)
        for length in sw.seq_lens:
            for d in sw.head_dims:
                for dist in sw.distributions:
                    for seed in sw.seeds:
                        for bq, bk in blocks:
                            c = Case(
                                kernel,
                                policy,
                                sw.algorithm if kernel == "flash" else "",
                                bq,
                                bk,
                                sw.batch,
                                sw.heads,
                                length,
                                d,
                                sw.causal,
                                dist,
                                seed,
                            )
                            cases[c.case_id] = c
    return list(cases.values())


def expand(config: StudyConfig) -> list[Case]:
    """Every distinct case of a study, in a stable order."""
    out: dict[str, Case] = {}
    for sw in config.sweeps:
        for c in expand_sweep(sw):
            out.setdefault(c.case_id, c)
    return list(out.values())


def group_by_inputs(cases: Iterable[Case]) -> list[list[Case]]:
    """Cases that share an input set (and so one FP64 reference), largest inputs first."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.input_key, []).append(c)
    return sorted(groups.values(), key=lambda g: -g[0].seq_len * g[0].heads * g[0].batch)


def environment() -> dict[str, str]:
    from flashcheck import __version__

    return {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "flashcheck": __version__,
        "machine": platform.machine(),
        "platform": platform.platform(),
        "node": platform.node(),
    }


class Unavailable(Exception):
    """The case's backend cannot run here (recorded as skipped, with the reason)."""


def _run_kernel(c: Case, q, k, v) -> torch.Tensor:
    if c.kernel in SIMULATED_KERNELS:
        return simulate(
            c.kernel,
            q,
            k,
            v,
            policy=c.policy,
            causal=c.causal,
            block_q=c.block_q,
            block_k=c.block_k,
            algorithm=c.algorithm,
        )
    from flashcheck.backends import get_backend

    backend = get_backend(c.kernel)
    dtype = info(c.policy).dtype
    avail = backend.available(dtype)
    if not avail.ok:
        raise Unavailable(avail.reason)
    with torch.no_grad():
        low = [t.to(backend.device(), dtype) for t in (q, k, v)]
        return backend.forward(*low, causal=c.causal).double().cpu()


def evaluate_group(cases: list[Case], emit: Callable[[CaseRecord], None]) -> int:
    """Evaluate cases sharing one input set; emit each record as it finishes. Returns how many FP64
    references were computed (one for the original inputs, one per distinct input rounding)."""
    torch.set_num_threads(1)  # determinism across executors and worker counts; parallelism is by process
    env = environment()
    c0 = cases[0]
    spec = InputSpec(
        batch=c0.batch,
        heads=c0.heads,
        seq_len=c0.seq_len,
        head_dim=c0.head_dim,
        distribution=c0.distribution,
        seed=c0.seed,
    )
    q, k, v = make_qkv(spec)
    ref = reference_attention(q, k, v, causal=c0.causal)
    rounded_refs: dict[tuple, torch.Tensor] = {}
    for c in cases:
        start = time.perf_counter()
        try:
            out = _run_kernel(c, q, k, v)
            pol = parse_policy(c.policy)
            key = _rounding_key(pol, c)
            if key is None:
                rounded_refs[None] = ref
            elif key not in rounded_refs:
                qr, kr, vr, _ = round_inputs(q, k, v, pol, block_q=c.block_q or None, block_k=c.block_k or None)
                rounded_refs[key] = reference_attention(qr, kr, vr, causal=c.causal)
            errors = {name: fn(out, ref) for name, fn in METRICS.items()}
            errors_r = {name: fn(out, rounded_refs[key]) for name, fn in METRICS.items()}
            rec = CaseRecord(c.case_id, c, "ok", errors, errors_r, time.perf_counter() - start, None, env)
        except Unavailable as exc:
            rec = CaseRecord(c.case_id, c, "skipped", {}, {}, time.perf_counter() - start, str(exc), env)
        except Exception as exc:  # a failed case is recorded and the sweep goes on
            msg = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
            rec = CaseRecord(c.case_id, c, "failed", {}, {}, time.perf_counter() - start, msg, env)
        emit(rec)
    return 1 + len([key for key in rounded_refs if key is not None])


def _rounding_key(pol, c: Case) -> tuple | None:
    """What the candidate's rounded inputs depend on (None: they are the original inputs)."""
    if pol.input == Format.FP64 and not pol.hadamard:
        return None
    blocks = (c.block_q, c.block_k) if pol.input in FP8_FORMATS and pol.fp8_scaling == "block" else None
    return (pol.input, pol.fp8_scaling, pol.hadamard, blocks)


def _trial_error(kernel: str, policy: str, head_dim: int, sw: Sweep) -> str | None:
    """The error a simulator raises on tiny inputs of head dim `head_dim` under the sweep's settings."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    bq, bk = sw.blocks[0]
    try:
        simulate(kernel, q, k, v, policy=policy, causal=sw.causal, block_q=bq, block_k=bk, algorithm=sw.algorithm)
    except Exception as exc:  # the kernel's own validation decides what cannot run
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _sweep_errors(sw: Sweep) -> list[str] | None:
    """Why each method of `sw` fails at every head dim; None when some case may succeed."""
    reasons = []
    for method in sw.all_methods():
        kernel, _, policy = method.partition(":")
        if kernel not in SIMULATED_KERNELS:
            return None  # a real backend runs or is skipped with its reason
        for d in sw.head_dims:
            why = _trial_error(kernel, policy, d, sw)
            if why is None:
                return None
            reasons.append(f"{method} at head_dim {d}: {why}")
    return reasons


def check_sweeps_can_run(config: StudyConfig) -> None:
    """ValueError for a sweep every case of which must fail: each simulator method is tried once per
    head dim on tiny inputs (the failures the kernels raise do not depend on the length)."""
    for sw in config.sweeps:
        reasons = _sweep_errors(sw)
        if reasons:
            added = [m for m in sw.all_methods() if m not in sw.methods]
            hint = f" (including the baseline {', '.join(added)} that baseline = true adds)" if added else ""
            raise ValueError(f"sweep {sw.question!r}: every case would fail{hint}: " + "; ".join(reasons))
