"""Attribution: which stage of a policy causes the deviation (one stage low alone; one stage raised alone)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashcheck.core.inputs import InputSpec
from flashcheck.core.numerics import STAGES, Format, Policy
from flashcheck.kernels.memory import Footprint, check_fits
from flashcheck.measure.case import METRICS, References
from flashcheck.measure.method import Method

STEPS = 2 * len(STAGES) + 1  # kernel runs of one attribution: the policy, each stage alone, each raised


@dataclass(frozen=True, slots=True)
class Attribution:
    """Errors (metric vs FP64) of the full policy, each stage alone in its low format (others FP64), and
    each stage alone raised to FP64 (others as the policy). `output_share` = output-alone / full."""

    policy: Policy
    metric: str
    full: float
    alone: dict[str, float]
    raised: dict[str, float]

    @property
    def output_share(self) -> float:
        return self.alone["output"] / self.full if self.full > 0 else float("nan")

    @property
    def dominant(self) -> str:
        """The stage whose raising to FP64 removes the most error."""
        return min(self.raised, key=self.raised.get)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy.to_dict(),
            "metric": self.metric,
            "full": self.full,
            "alone": self.alone,
            "raised": self.raised,
            "output_share": self.output_share,
            "dominant_stage": self.dominant,
        }


def attribute(
    policy: Policy,
    spec: InputSpec,
    *,
    kernel: str = "flash",
    block_q: int = 128,
    block_k: int = 128,
    algorithm: str = "fa2",
    causal: bool = False,
    exp2: bool = False,
    metric: str = "rel_l2",
    on_step: Callable[..., None] | None = None,  # called as on_step(note=...) after each of the STEPS runs
) -> Attribution:
    """Run the kernel under the policy and its 2 x 6 one-stage variants on inputs from spec; refuses
    with kernels.memory.InsufficientMemory (a ValueError) before allocating a case that cannot fit."""
    fp = Footprint(
        batch=spec.batch,
        heads=spec.heads,
        seq_len=spec.seq_len,
        seq_len_k=spec.seq_len_k,
        head_dim=spec.head_dim,
        kernels=(kernel,),
        block_k=block_k,
        work_itemsize=8,  # the one-stage variants run with every other stage in FP64
    )
    check_fits(fp)
    refs = References(spec, causal=causal)
    blocks = {"block_q": block_q, "block_k": block_k, "algorithm": algorithm} if kernel == "flash" else {}
    extra = {"exp2": exp2} if kernel == "flash" else {}

    def err(pol: Policy, note: str) -> float:
        m = Method(kernel=kernel, policy=pol, **blocks)
        with torch.no_grad():
            out = m.runner(causal=causal, **extra)(*m.prepare(refs.q, refs.k, refs.v))
        if on_step is not None:
            on_step(note=note)
        return METRICS[metric](out, refs.reference)

    # the stage knobs travel with every variant: each is inert while its own stage is FP64 (core.numerics.Policy)
    exact = Policy(name="fp64", fp8_scaling=policy.fp8_scaling, hadamard=policy.hadamard, **policy.knobs())
    alone = {s: err(exact.replace(**{s: policy.stage(s)}), f"{s} alone") for s in STAGES}
    raised = {s: err(policy.replace(**{s: Format.FP64}), f"{s} raised") for s in STAGES}
    return Attribution(policy, metric, err(policy, policy.name), alone, raised)
