"""Attribution: which stage of a policy causes the deviation (one stage low alone; one stage raised alone), and
within a stage, which of its sub-stages (measure.substages: Q/K or V quantisation, a narrow MMA accumulator, ...)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashcheck.core.inputs import InputSpec
from flashcheck.core.numerics import STAGES, Format, Policy
from flashcheck.kernels.sim.memory import Footprint, check_fits
from flashcheck.measure.case import METRICS, References
from flashcheck.measure.method import Method
from flashcheck.measure.substages import BY_NAME, STAGE_WORDS, substages

STEPS = 2 * len(STAGES) + 1  # kernel runs of one attribution: the policy, each stage alone, each raised


def steps(policy: Policy) -> int:
    """Steps of attribute(policy): STEPS and each sub-stage alone and raised (a repeated run counts, cached)."""
    return STEPS + 2 * len(substages(policy))


@dataclass(frozen=True, slots=True)
class Attribution:
    """Errors (metric vs FP64) of the full policy, each stage alone in its low format (others FP64), and
    each stage alone raised to FP64 (others as the policy). `output_share` = output-alone / full. `sub_alone`,
    `sub_raised`: the same for the policy's sub-stages (measure.substages; empty for the classic policies)."""

    policy: Policy
    metric: str
    full: float
    alone: dict[str, float]
    raised: dict[str, float]
    sub_alone: dict[str, float] = field(default_factory=dict)
    sub_raised: dict[str, float] = field(default_factory=dict)

    @property
    def output_share(self) -> float:
        return self.alone["output"] / self.full if self.full > 0 else float("nan")

    @property
    def dominant(self) -> str:
        """The stage whose raising to FP64 removes the most error."""
        return min(self.raised, key=self.raised.get)

    @property
    def dominant_substage(self) -> str | None:
        """Within the dominant stage, the sub-stage whose raising removes the most (None: it has none)."""
        inside = [s for s in self.sub_raised if BY_NAME[s].stage == self.dominant]
        return min(inside, key=self.sub_raised.get) if inside else None

    def label(self, name: str) -> str:
        """A stage or sub-stage in words: "Q/K quantisation (INT8 per-block, K smoothed)", "P before P·V (fp16)"."""
        if name in BY_NAME:
            return BY_NAME[name].label(self.policy)
        return f"{STAGE_WORDS[name]} ({self.policy.stage(name).value})"

    def dominant_words(self) -> str:
        """The dominant stage, and within it the dominant sub-stage, in words."""
        sub = self.dominant_substage
        return self.label(self.dominant) if sub is None else self.label(sub)

    def to_dict(self) -> dict:
        out = {
            "policy": self.policy.to_dict(),
            "metric": self.metric,
            "full": self.full,
            "alone": self.alone,
            "raised": self.raised,
            "output_share": self.output_share,
            "dominant_stage": self.dominant,
        }
        if self.sub_raised:  # only policies with sub-stages: the classic policies' dict stays as it was
            subs = {
                s: {"stage": BY_NAME[s].stage, "label": self.label(s), "alone": self.sub_alone[s], "raised": r}
                for s, r in self.sub_raised.items()
            }
            out |= {"substages": subs, "dominant_substage": self.dominant_substage, "dominant": self.dominant_words()}
        return out


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
    """Run the kernel under the policy, its 2 x 6 one-stage variants and 2 per sub-stage on inputs from spec
    (a variant equal to one already run is not run again); refuses with kernels.sim.memory.InsufficientMemory (a
    ValueError) before allocating a case that cannot fit."""
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

    seen: dict[Policy, float] = {}

    def err(pol: Policy, note: str) -> float:
        key = pol.replace(name="")
        if key not in seen:
            m = Method(kernel=kernel, policy=pol, **blocks)
            with torch.no_grad():
                out = m.runner(causal=causal, **extra)(*m.prepare(refs.q, refs.k, refs.v))
            seen[key] = METRICS[metric](out, refs.reference)
        if on_step is not None:
            on_step(note=note)
        return seen[key]

    # the stage knobs travel with every variant: each is inert while its own stage is FP64 (core.numerics.Policy)
    exact = Policy(name="fp64", fp8_scaling=policy.fp8_scaling, hadamard=policy.hadamard, **policy.knobs())
    alone = {s: err(exact.replace(**{s: policy.stage(s)}), f"{s} alone") for s in STAGES}
    raised = {s: err(policy.replace(**{s: Format.FP64}), f"{s} raised") for s in STAGES}
    subs = substages(policy)
    sub_alone = {s.name: err(s.alone(policy, exact), f"{s.name} alone") for s in subs}
    sub_raised = {s.name: err(policy.replace(**s.raised), f"{s.name} raised") for s in subs}
    return Attribution(policy, metric, err(policy, policy.name), alone, raised, sub_alone, sub_raised)
