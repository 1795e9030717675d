"""Attribution: which stage of a policy causes the deviation (one stage low alone; one stage raised alone)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.metrics import error_summary
from flashcheck.core.numerics import STAGES, Format, Policy
from flashcheck.kernels import reference_attention, simulate
from flashcheck.kernels.memory import Footprint, check_fits

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
    q, k, v = make_qkv(spec)
    ref = reference_attention(q, k, v, causal=causal)

    def err(pol: Policy, note: str) -> float:
        extra = {"exp2": exp2} if kernel == "flash" else {}
        out = simulate(
            kernel, q, k, v, policy=pol, causal=causal, block_q=block_q, block_k=block_k, algorithm=algorithm, **extra
        )
        if on_step is not None:
            on_step(note=note)
        return error_summary(out, ref)[metric]

    exact = Policy(name="fp64", fp8_scaling=policy.fp8_scaling, hadamard=policy.hadamard)
    alone = {s: err(exact.replace(**{s: policy.stage(s)}), f"{s} alone") for s in STAGES}
    raised = {s: err(policy.replace(**{s: Format.FP64}), f"{s} raised") for s in STAGES}
    return Attribution(policy, metric, err(policy, policy.name), alone, raised)


def draw(attr: Attribution, path) -> None:
    """A bar chart of the two views next to the full policy's error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(STAGES))
    ax.bar(
        [x - 0.2 for x in xs],
        [attr.alone[s] for s in STAGES],
        width=0.4,
        label="stage alone in low precision",
    )
    ax.bar([x + 0.2 for x in xs], [attr.raised[s] for s in STAGES], width=0.4, label="stage alone raised to FP64")
    ax.axhline(attr.full, color="k", ls="--", lw=1, label=f"full policy {attr.policy.name}")
    ax.set_xticks(list(xs), [f"{s}\n({attr.policy.stage(s).value})" for s in STAGES])
    ax.set_yscale("symlog", linthresh=max(attr.full * 1e-3, 1e-300))
    ax.set_ylabel(f"{attr.metric} vs FP64")
    ax.legend(fontsize=8)
    ax.set_title(f"which stage causes the deviation? dominant: {attr.dominant}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
