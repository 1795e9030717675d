"""One measured configuration: a candidate kernel and a standard baseline, both against the FP64 reference."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.metrics import error_summary, ratio
from flashcheck.core.numerics import Policy, info, parse_format, parse_policy
from flashcheck.kernels import SIMULATED_KERNELS, reference_attention, simulate, standard_attention
from flashcheck.kernels.fp8 import round_inputs
from flashcheck.kernels.memory import Footprint, check_fits

KERNELS = SIMULATED_KERNELS


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareConfig:
    """One comparison. `baseline_numerics` defaults to `numerics`; `fp8_scaling` and `hadamard`, when
    set, override the candidate policy's (the baseline keeps its own)."""

    kernel: str = "flash"
    numerics: str = "bf16-mixed"
    baseline_numerics: str | None = None
    algorithm: str = "fa2"
    block_q: int = 128
    block_k: int = 128
    batch: int = 1
    heads: int = 8
    seq_len: int = 1024
    head_dim: int = 64
    causal: bool = False
    distribution: str = "normal"
    fp8_scaling: str | None = None
    hadamard: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {', '.join(KERNELS)}")
        for role, pol in (("candidate", self.candidate_policy()), ("baseline", self.baseline_policy())):
            if pol.fp8_scaling == "block" and (role == "baseline" or self.kernel == "standard"):
                raise ValueError(
                    f"the {role} policy {pol.name!r} scales FP8 per block, which needs the flash kernel's tiles; "
                    "the standard kernel scales per tensor: give --baseline-numerics baseline-fp8 (or a policy "
                    "with fp8_scaling=tensor)"
                )
        self.input_spec()

    def candidate_policy(self) -> Policy:
        pol = parse_policy(self.numerics)
        changes: dict[str, object] = {}
        if self.fp8_scaling is not None:
            changes["fp8_scaling"] = self.fp8_scaling
        if self.hadamard:
            changes["hadamard"] = True
        return dataclasses.replace(pol, **changes) if changes else pol

    def baseline_policy(self) -> Policy:
        return parse_policy(self.baseline_numerics or self.numerics)

    def footprint(self) -> Footprint:
        """The sizes that set this comparison's memory (see kernels.memory)."""
        work = max(p.work_dtype.itemsize for p in (self.candidate_policy(), self.baseline_policy()))
        return Footprint(
            batch=self.batch,
            heads=self.heads,
            seq_len=self.seq_len,
            head_dim=self.head_dim,
            kernels=(self.kernel, "standard"),
            block_k=self.block_k,
            work_itemsize=work,
        )

    def input_spec(self) -> InputSpec:
        return InputSpec(
            batch=self.batch,
            heads=self.heads,
            seq_len=self.seq_len,
            head_dim=self.head_dim,
            distribution=self.distribution,
            seed=self.seed,
        )


@dataclass(frozen=True, slots=True)
class CompareResult:
    """Errors (max_abs, mean_abs, rmse, rel_l2) against the FP64 reference of the original inputs, and
    against the FP64 reference of the candidate's rounded inputs (the kernel's own error)."""

    config: CompareConfig
    candidate: dict[str, float]
    baseline: dict[str, float]
    candidate_rounded: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> dict[str, float]:
        return ratio(self.candidate, self.baseline)

    def to_dict(self) -> dict[str, object]:
        cfg = dataclasses.asdict(self.config)
        cfg["candidate_policy"] = self.config.candidate_policy().to_dict()
        cfg["baseline_policy"] = self.config.baseline_policy().to_dict()
        return {
            "config": cfg,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "vs_rounded_inputs": {"candidate": self.candidate_rounded},
        }


def backend_footprint(case) -> Footprint:
    """The memory footprint of a backend_compare.BackendCase: the eager or SDPA-math baseline holds L x L
    scores (fp32 at most, fp64 for fp64 inputs or policies), the FP64 reference runs beside it, and
    --determinism adds a batch of at least 2."""
    fmt = parse_format(case.numerics)
    itemsize = max(4, info(fmt).dtype.itemsize)
    for pol in (case.policy, case.baseline_numerics):
        if pol:
            itemsize = max(itemsize, parse_policy(pol).work_dtype.itemsize)
    return Footprint(
        batch=max(2, case.batch) if case.determinism else case.batch,
        heads=case.heads,
        seq_len=case.seq_len,
        head_dim=case.head_dim,
        kernels=("standard", "flash"),
        block_k=case.block_k,
        work_itemsize=itemsize,
        backward=case.backward,
    )


def run_candidate(q, k, v, cfg: CompareConfig) -> torch.Tensor:
    """The candidate's output [B, H, L, D] for inputs q, k, v under cfg."""
    return simulate(
        cfg.kernel,
        q,
        k,
        v,
        policy=cfg.candidate_policy(),
        causal=cfg.causal,
        block_q=cfg.block_q,
        block_k=cfg.block_k,
        algorithm=cfg.algorithm,
    )


def run_compare(cfg: CompareConfig) -> CompareResult:
    """Draw the inputs, run candidate, baseline and FP64 reference, and measure the errors. Refuses with
    kernels.memory.InsufficientMemory (a ValueError) before allocating when the case cannot fit here."""
    check_fits(cfg.footprint())
    q, k, v = make_qkv(cfg.input_spec())
    ref = reference_attention(q, k, v, causal=cfg.causal)
    cand = run_candidate(q, k, v, cfg)
    base = standard_attention(q, k, v, policy=cfg.baseline_policy(), causal=cfg.causal)
    qr, kr, vr, _ = round_inputs(q, k, v, cfg.candidate_policy(), block_q=cfg.block_q, block_k=cfg.block_k)
    ref_rounded = reference_attention(qr, kr, vr, causal=cfg.causal)
    return CompareResult(cfg, error_summary(cand, ref), error_summary(base, ref), error_summary(cand, ref_rounded))
