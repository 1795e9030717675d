"""Cases of a study, their records, and their evaluation (one FP64 reference per input set)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from flashcheck.core.inputs import InputSpec
from flashcheck.kernels import SIMULATED_KERNELS
from flashcheck.measure import METRICS, References, parse_method, run_case
from flashcheck.measure import Case as MeasureCase
from flashcheck.study.config import StudyConfig, Sweep

STATUSES = ("ok", "skipped", "failed")


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

    def input_spec(self) -> InputSpec:
        return InputSpec(
            batch=self.batch,
            heads=self.heads,
            seq_len=self.seq_len,
            head_dim=self.head_dim,
            distribution=self.distribution,
            seed=self.seed,
        )

    def measure_case(self) -> MeasureCase:
        """This case as a measurement: its method alone (the baseline is a case of its own), every metric."""
        m = parse_method(self.method, block_q=self.block_q, block_k=self.block_k, algorithm=self.algorithm)
        spec = self.input_spec()
        return MeasureCase(inputs=spec, method=m, causal=self.causal, metrics=tuple(METRICS), with_baseline=False)

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
    from flashcheck.core import VERSION

    return {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "flashcheck": VERSION,
        "machine": platform.machine(),
        "platform": platform.platform(),
        "node": platform.node(),
    }


def evaluate_group(cases: list[Case], emit: Callable[[CaseRecord], None]) -> int:
    """Evaluate cases sharing one input set through measure.run_case, emitting each record as it finishes.
    Returns how many FP64 references were computed (one for the original inputs, one per distinct input
    rounding: measure.References shares them between the cases)."""
    torch.set_num_threads(1)  # determinism across executors and worker counts; parallelism is by process
    env = environment()
    refs = References(cases[0].input_spec(), causal=cases[0].causal)
    for c in cases:
        rec = run_case(c.measure_case(), refs)
        emit(CaseRecord(c.case_id, c, rec.status, rec.candidate, rec.candidate_rounded, rec.seconds, rec.reason, env))
    return refs.computed


def _trial_error(kernel: str, policy: str, head_dim: int, sw: Sweep) -> str | None:
    """The error a simulator raises on tiny inputs of head dim `head_dim` under the sweep's settings."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    bq, bk = sw.blocks[0]
    try:
        m = parse_method(f"{kernel}:{policy}", block_q=bq, block_k=bk, algorithm=sw.algorithm)
        m.run(q, k, v, causal=sw.causal)
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
