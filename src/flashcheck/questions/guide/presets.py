"""The production guide's settings (what its own tasks measure), its error sweep and its presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from flashcheck.study.config import StudyConfig, Sweep


@dataclass(frozen=True, slots=True, kw_only=True)
class GuideSettings:
    """What the production guide's own tasks measure (questions.guide; its errors are the sweep GUIDE_QUESTION).
    Methods are 'kernel:policy' simulators or 'backend:FORMAT'; a trailing '@fa1' runs the simulator's
    FlashAttention-1 algorithm. sum_search: bisect the fp16 softmax-sum boundary to one key (else try the
    sum_keys ends and the two key counts around FP16_SUM_OVERFLOW only)."""

    cost_methods: tuple[str, ...] = ("sdpa-math:bf16", "sdpa-flash:bf16", "flash:bf16-mixed")
    cost_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    cost_heads: int = 1
    repeats: int = 7  # 7 repeats: the median's order-statistic interval [min, max] covers 98%
    latency_methods: tuple[str, ...] = ("sdpa-math:bf16", "sdpa-flash:bf16")
    latency_lengths: tuple[int, ...] = (128, 512)
    latency_heads: int = 2
    latency_calls: int = 200
    latency_blocks: int = 5
    boundary_methods: tuple[str, ...] = ("flash:fp16", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16")
    boundary_lengths: tuple[int, ...] = (256, 1024, 4096)
    sum_methods: tuple[str, ...] = ("flash:fp16", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16")
    sum_keys: tuple[int, int] = (2**15, 2**17)
    search_twins: bool = False  # the bf16 twins searched too (else tried at both ends and either side of 65520 keys)
    sum_search: bool = True
    explain_lengths: tuple[int, ...] = (512, 2048)
    head_dim: int = 64
    threads: int = 1  # torch threads while timing (the machine is shared; one thread varies least)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> GuideSettings:
        """From a [guide] table (lists for tuples); ValueError naming an unknown or mistyped field."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: 'guide' must be a table of GuideSettings fields")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for k, v in data.items():
            if k not in fields:
                raise ValueError(
                    f"unknown field {k!r} in the guide table of {source}; expected one of {', '.join(fields)}"
                )
            default = fields[k].default
            v = tuple(v) if isinstance(v, list) else v
            if type(v) is not type(default) or (isinstance(v, int) and not isinstance(v, bool) and v < 1):
                raise ValueError(f"{source}: guide {k}={v!r} must be like {default!r}")
            kwargs[k] = v
        return cls(**kwargs)


GUIDE_QUESTION = "guide_errors"
GUIDE_METHODS = (
    "sdpa-math:bf16",
    "sdpa-flash:bf16",
    "flash:bf16-mixed",
    "sdpa-math:fp16",
    "sdpa-flash:fp16",
    "flash:fp16-mixed",
)
# guide: 6.5 min on this shared 2-core machine under a load average of 14 (72 error cases 102 s, 66 tasks 250 s);
# guide-full adds 8k..32k to the cost (sdpa-math past memory is skipped with the reason): about an hour.
GUIDE_SETTINGS = {
    "guide": GuideSettings(),
    "guide-full": GuideSettings(
        cost_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
        latency_lengths=(128, 512, 2048),
        boundary_lengths=(256, 1024, 4096, 16384),
        explain_lengths=(512, 4096, 16384),
        sum_methods=("flash:fp16", "flash:fp16@fa1", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16"),
        search_twins=True,
        repeats=9,
    ),
    # quick's guide part: every claim at n >= 3 (lengths 256..2048, 5 repeats, 200 calls at one length; the
    # softmax-sum boundary tried one key each side of 65520 instead of bisected). Its 51 tasks took 66 s and its
    # 60 more error cases made quick 6% longer (18m07s vs 17m05s, run side by side under a load average of 12)
    "quick": GuideSettings(
        cost_lengths=(256, 512, 1024, 2048),
        repeats=5,
        latency_lengths=(256,),
        boundary_lengths=(256, 1024),
        sum_keys=(65519, 65520),
        sum_search=False,
        explain_lengths=(512, 2048),
    ),
    # seconds: every task kind at toy sizes (a smoke test, like the study's tiny; its verdicts mean nothing)
    "guide-tiny": GuideSettings(
        cost_lengths=(64, 128, 256),
        repeats=3,
        latency_lengths=(64, 128),
        latency_calls=12,
        latency_blocks=3,
        boundary_methods=("flash:fp16",),
        boundary_lengths=(64, 128),
        sum_methods=("sdpa-math:fp16",),
        sum_keys=(64, 256),
        explain_lengths=(64, 128),
    ),
}


def errors_sweep(lengths: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    """The production guide's error range and slope: real CPU backends and the kernel-realistic simulator at
    bf16 and fp16 against FP64 (its cost, latency and overflow tasks are questions.guide's)."""
    return Sweep(
        question=GUIDE_QUESTION,
        methods=GUIDE_METHODS,
        seq_lens=lengths,
        seeds=seeds,
        heads=heads,
        algorithm="fa2",
        baseline=False,
        metric="rel_l2",
    )


def guide_sweep(config: StudyConfig) -> Sweep | None:
    """The sweep holding the guide's errors against FP64, None when the study has none."""
    return next((sw for sw in config.sweeps if sw.question == GUIDE_QUESTION), None)


def guide() -> StudyConfig:
    """The production guide's claims measured (questions.guide): a few minutes on 2 cores."""
    return StudyConfig(
        name="guide",
        sweeps=(errors_sweep((512, 1024, 2048, 4096), 2, (0, 1, 2)),),
        settings={"guide": GUIDE_SETTINGS["guide"]},
    )


def guide_full() -> StudyConfig:
    """The guide at lengths up to 16k for the errors (32k for the cost where memory allows), five seeds."""
    return StudyConfig(
        name="guide-full",
        sweeps=(errors_sweep((512, 1024, 2048, 4096, 8192, 16384), 2, (0, 1, 2, 3, 4)),),
        settings={"guide": GUIDE_SETTINGS["guide-full"]},
    )


def guide_tiny() -> StudyConfig:
    """Seconds: the guide's pipeline at toy sizes (a smoke test; its verdicts mean nothing)."""
    return StudyConfig(
        name="guide-tiny",
        sweeps=(errors_sweep((64, 128, 256), 1, (0,)),),
        settings={"guide": GUIDE_SETTINGS["guide-tiny"]},
    )
