"""Study configurations: sweeps (grids of cases), the presets, and custom sweeps from TOML."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.core.inputs import DISTRIBUTIONS, known_distribution, parse_padding
from flashcheck.core.numerics import parse_format, parse_policy
from flashcheck.kernels import SIMULATED_KERNELS as KERNELS
from flashcheck.kernels.flash import ALGORITHMS
from flashcheck.measure.collapse import P_CAST


def real_backends() -> list[str]:
    """Backends a sweep can name as 'backend:FORMAT' (the simulators are the flash and standard kernels)."""
    from flashcheck.backends import backend_names

    return [n for n in backend_names() if not n.startswith("sim-")]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """One question: a grid over methods x seq_lens x head_dims x blocks x distributions x seeds.

    methods: "kernel:policy" (kernel flash or standard), or "backend:FORMAT" for a real backend run in
    that format (e.g. "sdpa-flash:bf16"). With `baseline`, every flash or backend method gets the standard
    kernel under the same policy beside it (the paper's Baseline). blocks: (Br, Bc) pairs.
    metric: the headline metric of this question's figure (max_abs, mean_abs, std, rmse, rel_l2).
    causal: one bool or a list of them (a dimension). kv_heads: K/V head counts (0: as many as `heads`; a
    divisor: GQA/MQA); seq_lens_k: key lengths (0: the query length; decoding: seq_lens 1 or 16 against a
    long KV cache); paddings: "none", "left:F", "right:F" (core.inputs.make_mask); backward: dQ, dK, dV errors
    too; layers: the layers of captured:MODEL distributions; splits: key chunks of the splitkv kernel."""

    question: str
    methods: tuple[str, ...]
    seq_lens: tuple[int, ...] = (1024,)
    head_dims: tuple[int, ...] = (64,)
    blocks: tuple[tuple[int, int], ...] = ((128, 128),)
    distributions: tuple[str, ...] = ("normal",)
    seeds: tuple[int, ...] = (0,)
    algorithm: str = "fa1"
    batch: int = 1
    heads: int = 4
    causal: bool | tuple[bool, ...] = False
    baseline: bool = True
    metric: str = "max_abs"
    kv_heads: tuple[int, ...] = (0,)
    seq_lens_k: tuple[int, ...] = (0,)
    paddings: tuple[str, ...] = ("none",)
    backward: bool = False
    layers: tuple[int, ...] = (0,)
    splits: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"question={self.question!r} must be a non-empty string")
        where = f"sweep {self.question!r}"
        self._check_types(where)
        self._check_dims(where)
        if not self.methods:
            raise ValueError(f"{where}: methods is empty; give 'kernel:policy' strings")
        for m in self.methods:
            kernel, sep, policy = str(m).partition(":")
            real = real_backends()
            if not sep or (kernel not in KERNELS and kernel not in real):
                raise ValueError(
                    f"{where}: method {m!r} must be 'kernel:policy' with kernel in {', '.join(KERNELS)} "
                    f"(simulators) or 'backend:FORMAT' with backend in {', '.join(real)}"
                )
            if kernel in KERNELS:
                parse_policy(policy)
            else:
                parse_format(policy)
        for name in ("seq_lens", "head_dims", "seeds"):
            vals = getattr(self, name)
            if not vals or not all(isinstance(x, int) and x >= (0 if name == "seeds" else 1) for x in vals):
                raise ValueError(
                    f"{where}: {name}={list(vals)!r} must be a non-empty list of "
                    f"{'non-negative' if name == 'seeds' else 'positive'} integers"
                )
        if not self.blocks or not all(
            len(b) == 2 and all(isinstance(x, int) and x >= 1 for x in b) for b in self.blocks
        ):
            raise ValueError(
                f"{where}: blocks={[list(b) for b in self.blocks]!r} must be [Br, Bc] pairs of positive integers"
            )
        bad = [d for d in self.distributions if not known_distribution(d)]
        if bad or not self.distributions:
            raise ValueError(
                f"{where}: distributions {bad or []!r} not allowed; expected {DISTRIBUTIONS}, captured:MODEL or "
                "sink:DELTA"
            )
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"{where}: algorithm={self.algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
        if self.metric not in ("max_abs", "mean_abs", "std", "rmse", "rel_l2"):
            raise ValueError(f"{where}: metric={self.metric!r}; expected max_abs, mean_abs, std, rmse, rel_l2")
        for name in ("batch", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}: {name}={getattr(self, name)!r} must be a positive integer")

    def _check_dims(self, where: str) -> None:
        """The attention-variant dimensions: causal, kv_heads, seq_lens_k, paddings, layers, splits."""
        causals = (self.causal,) if isinstance(self.causal, bool) else self.causal
        if not isinstance(causals, tuple | list) or not causals or not all(isinstance(c, bool) for c in causals):
            raise ValueError(f"{where}: causal={self.causal!r} must be true, false or a list of them")
        for name in ("kv_heads", "seq_lens_k", "layers", "splits"):
            vals = getattr(self, name)
            if not isinstance(vals, tuple | list) or not vals or not all(_is_int(x) and x >= 0 for x in vals):
                raise ValueError(f"{where}: {name}={vals!r} must be a non-empty list of non-negative integers")
        bad = [h for h in self.kv_heads if h and _is_int(self.heads) and self.heads % h]
        if bad:
            raise ValueError(f"{where}: kv_heads {bad[0]!r} does not divide heads={self.heads!r} (0: as many)")
        if not isinstance(self.paddings, tuple | list) or not self.paddings:
            raise ValueError(f"{where}: paddings={self.paddings!r} must be a non-empty list")
        for p in self.paddings:
            try:
                parse_padding(p)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None

    def _check_types(self, where: str) -> None:
        """Strict types: a TOML `baseline = "no"` or `seq_lens = [true]` is an error, not a truthy value."""
        for name in ("baseline", "backward"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{where}: {name}={getattr(self, name)!r} must be true or false")
        for name in ("algorithm", "metric"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{where}: {name}={getattr(self, name)!r} must be a string")
        for name in ("batch", "heads"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{where}: {name}={getattr(self, name)!r} must be a positive integer")
        for name, ok, what in (
            ("methods", lambda x: isinstance(x, str), "strings"),
            ("distributions", lambda x: isinstance(x, str), "strings"),
            ("seq_lens", _is_int, "integers"),
            ("head_dims", _is_int, "integers"),
            ("seeds", _is_int, "integers"),
            ("blocks", lambda b: isinstance(b, tuple | list) and all(_is_int(x) for x in b), "[Br, Bc] integer pairs"),
        ):
            values = getattr(self, name)
            if not isinstance(values, tuple | list):
                raise ValueError(f"{where}: {name}={values!r} must be a list of {what}")
            bad = [x for x in values if not ok(x)]
            if bad:
                raise ValueError(f"{where}: {name} holds {bad[0]!r}; it must be a list of {what}")

    def all_methods(self) -> tuple[str, ...]:
        """The methods and, with `baseline`, each one's baseline by the one rule (measure.baseline_name):
        standard attention under the same policy for a simulator, eager PyTorch at FMT for a backend."""
        from flashcheck.measure.method import baseline_name

        out = list(self.methods)
        if self.baseline:
            for m in self.methods:
                base = baseline_name(m)
                if base != m and base not in out:
                    out.append(base)
        return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class GuideSettings:
    """What the production guide's own tasks measure (study.guide; its errors are the sweep GUIDE_QUESTION).
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """A named list of sweeps, and the production guide's own tasks when `guide` is set (study.guide)."""

    name: str
    sweeps: tuple[Sweep, ...] = field(default_factory=tuple)
    guide: GuideSettings | None = None

    def to_dict(self) -> dict:
        out = {"name": self.name, "sweeps": [dataclasses.asdict(s) for s in self.sweeps]}
        return out | ({"guide": self.guide.to_dict()} if self.guide is not None else {})

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> StudyConfig:
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a table with 'name' and 'sweeps', got a {type(data).__name__}")
        allowed = {"name", "sweeps", "guide"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(
                f"unknown field {sorted(unknown)[0]!r} in {source}; expected one of {', '.join(sorted(allowed))}"
            )
        sweeps = data.get("sweeps") or []
        if not isinstance(sweeps, list) or not sweeps:
            raise ValueError(f"{source}: 'sweeps' must be a non-empty list of tables ([[sweeps]])")
        name = data.get("name", Path(source).stem)
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{source}: name={name!r} must be a non-empty string")
        guide = data.get("guide")
        return cls(
            name=name,
            sweeps=tuple(_sweep_from_dict(s, i, source) for i, s in enumerate(sweeps, 1)),
            guide=None if guide is None else GuideSettings.from_dict(guide, source),
        )


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _sweep_from_dict(data: dict, index: int, source: str) -> Sweep:
    fields = {f.name for f in dataclasses.fields(Sweep)}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: sweep {index} must be a table")
    unknown = set(data) - fields
    if unknown:
        raise ValueError(
            f"unknown field {sorted(unknown)[0]!r} in sweep {index} of {source}; expected one "
            f"of {', '.join(sorted(fields))}"
        )
    if "question" not in data or "methods" not in data:
        raise ValueError(f"sweep {index} of {source} needs 'question' and 'methods'")
    kwargs = dict(data)
    if isinstance(kwargs.get("causal"), list):
        kwargs["causal"] = tuple(kwargs["causal"])
    for name in (
        "methods",
        "seq_lens",
        "head_dims",
        "distributions",
        "seeds",
        "kv_heads",
        "seq_lens_k",
        "paddings",
        "layers",
        "splits",
    ):
        if name in kwargs:
            value = kwargs[name]
            kwargs[name] = tuple(value) if isinstance(value, list) else (value,)
    if "blocks" in kwargs:
        blocks = kwargs["blocks"]
        if not isinstance(blocks, list) or not all(isinstance(b, list) for b in blocks):
            raise ValueError(f"sweep {index} of {source}: blocks={blocks!r} must be a list of [Br, Bc]")
        kwargs["blocks"] = tuple(tuple(b) for b in blocks)
    try:
        return Sweep(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sweep {index} of {source}: {exc}") from None


def load_config(path: str | Path) -> StudyConfig:
    """A custom sweep from a TOML file: top-level `name` and `[[sweeps]]` tables of Sweep's fields."""
    if not str(path).strip():
        raise ValueError("--config '' is empty; give a TOML file (or leave --config out and use --preset)")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"config file {str(p)!r} is a directory; give a TOML file")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"config file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise ValueError(f"config file {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    from flashcheck.core.jsonguard import MAX_FILE_NESTING, nesting_problem

    if problem := nesting_problem(raw, MAX_FILE_NESTING):  # tomllib recurses too: RecursionError past ~1000
        raise ValueError(f"config file {str(p)!r} {problem.split(' (')[0]}; a study's TOML nests a few levels")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}); TOML must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    return StudyConfig.from_dict(data, str(p))


# --- presets ---------------------------------------------------------------------------------------

FORMATS = ("bf16", "fp16", "fp32", "fp64")
FA3_METHODS = (
    "standard:fp16",
    "flash:fp16-mixed",
    "standard:baseline-fp8",
    "flash:fa3-fp8",
    "flash:fa3-fp8-no-block",
    "flash:fa3-fp8-no-hadamard",
)
# FlashAttention-3 (arXiv 2407.08608) Table 3, RMSE against an FP64 reference with outlier inputs.
FA3_PAPER_RMSE = {
    "standard:fp16": 3.2e-4,
    "flash:fp16-mixed": 1.9e-4,
    "standard:baseline-fp8": 2.4e-2,
    "flash:fa3-fp8": 9.1e-3,
    "flash:fa3-fp8-no-block": 9.3e-3,
    "flash:fa3-fp8-no-hadamard": 2.4e-2,
}


def _paper_sweeps(
    lengths: tuple[int, ...], fixed_len: int, areas: tuple[int, ...], heads: int, seeds: tuple[int, ...]
) -> list[Sweep]:
    """arXiv 2405.02803's microbenchmark, each question under the uniform and the -mixed policy."""
    both = ("flash:bf16", "flash:bf16-mixed")
    common = {"heads": heads, "seeds": seeds, "algorithm": "fa1"}
    return [
        Sweep(
            question="formats",
            methods=tuple(f"flash:{f}{m}" for f in FORMATS for m in ("", "-mixed")),
            seq_lens=(fixed_len,),
            blocks=((16, 16),),
            **common,
        ),
        Sweep(question="seq_len", methods=both, seq_lens=lengths, blocks=((16, 16),), **common),
        Sweep(
            question="block_area",
            methods=both,
            seq_lens=(fixed_len,),
            blocks=tuple((a, a) for a in areas),
            **common,
        ),
        Sweep(question="swapped", methods=both, seq_lens=(fixed_len,), blocks=((16, 64), (64, 16)), **common),
        Sweep(
            question="square",
            methods=both,
            seq_lens=(fixed_len,),
            blocks=((32, 32), (16, 64), (64, 16)),
            **common,
        ),
    ]


def _backend_sweep(lengths: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    """Real CPU backends beside the kernel-realistic simulator, same inputs and FP64 reference."""
    return Sweep(
        question="backends",
        methods=("sdpa-math:bf16", "sdpa-flash:bf16", "flash:bf16-mixed"),
        seq_lens=lengths,
        blocks=((128, 128),),
        seeds=seeds,
        heads=heads,
        algorithm="fa2",
        metric="rel_l2",
    )


def _fa3_sweep(lengths: tuple[int, ...], head_dims: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    return Sweep(
        question="fa3",
        methods=FA3_METHODS,
        seq_lens=lengths,
        head_dims=head_dims,
        blocks=((128, 128),),
        distributions=("outliers",),
        seeds=seeds,
        algorithm="fa2",
        heads=heads,
        baseline=False,
        metric="rmse",
    )


def paper() -> StudyConfig:
    """The seed paper's microbenchmark (arXiv 2405.02803), lengths 512..8192."""
    return StudyConfig(
        name="paper",
        sweeps=tuple(_paper_sweeps((512, 1024, 2048, 4096, 8192), 4096, (8, 16, 32, 64, 128), 8, (0, 1, 2))),
    )


def fa3() -> StudyConfig:
    """FlashAttention-3's Table 3 at head dims 64 and 128 and several lengths."""
    return StudyConfig(name="fa3", sweeps=(_fa3_sweep((1024, 2048, 4096), (64, 128), 8, (0, 1, 2)),))


def dims_sweeps(small: bool) -> list[Sweep]:
    """The attention users run (issue 13): causal, GQA, padding, decoding (split-KV where the kernel exists),
    head dims, the backward pass and captured activations; `small` for quick, else full's sizes."""
    seeds = (0, 1, 2) if small else (0, 1, 2, 3, 4)
    both = ("flash:bf16-mixed", "flash:bf16")
    common = {"seeds": seeds, "algorithm": "fa2", "metric": "rel_l2"}
    kv = (1024, 8192, 32768) if small else (1024, 2048, 4096, 8192, 16384, 32768)
    decode = ("flash:bf16-mixed", "splitkv:bf16-mixed") if "splitkv" in KERNELS else ("flash:bf16-mixed",)
    sweeps = [
        Sweep(question="causal", methods=both, seq_lens=(1024, 2048) if small else (1024, 4096, 16384),
              causal=(False, True), heads=2, **common),
        Sweep(question="gqa", methods=("flash:bf16-mixed",), seq_lens=(1024,) if small else (1024, 4096),
              heads=8, kv_heads=(8, 2, 1), causal=True, **common),
        Sweep(question="padding", methods=("flash:bf16-mixed", "sdpa-math:bf16", "sdpa-flash:bf16"),
              seq_lens=(512,) if small else (512, 2048), batch=2, heads=2, paddings=("left:0.25", "right:0.25"),
              causal=(False, True), **common),
        Sweep(question="decoding", methods=decode, seq_lens=(1, 16), seq_lens_k=kv, heads=8, kv_heads=(1,),
              causal=True, splits=(4,) if small else (2, 4, 16), **common),
        Sweep(question="head_dim", methods=both, seq_lens=(1024,) if small else (1024, 4096),
              head_dims=(64, 128) if small else (64, 128, 256), heads=2, **common),
        Sweep(question="backward", methods=("flash:bf16-mixed", "flash:fp16-mixed"),
              seq_lens=(256, 512) if small else (512, 1024, 2048), heads=2, causal=True, backward=True, **common),
    ]  # fmt: skip
    # without transformers its cases are recorded as skipped, with the install command
    sweeps.append(
        Sweep(question="captured", methods=both, seq_lens=(1024,) if small else (512, 1024, 4096),
              head_dims=(32,), distributions=("normal", "captured:minilm"),
              layers=(0, 5) if small else (0, 1, 2, 3, 4, 5), heads=4, **common)
    )  # fmt: skip
    return sweeps


def production() -> StudyConfig:
    """A typical LLM's attention: causal, GQA 8:1, D=128, bf16-mixed (and SDPA at bf16), prefill to 8k and
    decoding against a KV cache to 32k, the backward pass, and captured activations (the bundled model's own
    head dim). Its verdicts are the first lines of its report."""
    seeds = (0, 1, 2)
    common = {"seeds": seeds, "algorithm": "fa2", "metric": "rel_l2", "heads": 8, "kv_heads": (1,), "causal": True}
    decode = ("flash:bf16-mixed", "splitkv:bf16-mixed") if "splitkv" in KERNELS else ("flash:bf16-mixed",)
    sweeps = [
        Sweep(question="production_prefill", methods=("flash:bf16-mixed", "sdpa-math:bf16", "sdpa-flash:bf16"),
              seq_lens=(1024, 4096, 8192), head_dims=(128,), **common),
        Sweep(question="production_decoding", methods=decode, seq_lens=(1, 16), seq_lens_k=(1024, 8192, 32768),
              head_dims=(128,), splits=(4,), **common),
        Sweep(question="production_backward", methods=("flash:bf16-mixed",), seq_lens=(512, 1024),
              head_dims=(128,), backward=True, **common),
    ]  # fmt: skip
    # without transformers its cases are recorded as skipped, with the install command
    sweeps.append(
        Sweep(question="production_captured", methods=("flash:bf16-mixed",), seq_lens=(1024, 4096),
              head_dims=(32,), distributions=("normal", "captured:minilm"), layers=(0, 5),
              **(common | {"heads": 4, "kv_heads": (0,)}))
    )  # fmt: skip
    return StudyConfig(name="production", sweeps=tuple(sweeps))


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


def _guide_sweep(lengths: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    """The production guide's error range and slope: real CPU backends and the kernel-realistic simulator at
    bf16 and fp16 against FP64 (its cost, latency and overflow tasks are study.guide's)."""
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
    """The production guide's claims measured (study.guide): a few minutes on 2 cores."""
    return StudyConfig(
        name="guide", sweeps=(_guide_sweep((512, 1024, 2048, 4096), 2, (0, 1, 2)),), guide=GUIDE_SETTINGS["guide"]
    )


def guide_full() -> StudyConfig:
    """The guide at lengths up to 16k for the errors (32k for the cost where memory allows), five seeds."""
    return StudyConfig(
        name="guide-full",
        sweeps=(_guide_sweep((512, 1024, 2048, 4096, 8192, 16384), 2, (0, 1, 2, 3, 4)),),
        guide=GUIDE_SETTINGS["guide-full"],
    )


def guide_tiny() -> StudyConfig:
    """Seconds: the guide's pipeline at toy sizes (a smoke test; its verdicts mean nothing)."""
    return StudyConfig(
        name="guide-tiny", sweeps=(_guide_sweep((64, 128, 256), 1, (0,)),), guide=GUIDE_SETTINGS["guide-tiny"]
    )


def quick() -> StudyConfig:
    """A subset of paper, fa3, the attention variants and the production guide: minutes on 2 cores."""
    return StudyConfig(
        name="quick",
        sweeps=(
            # 3 seeds (a verdict needs n >= 3) at 2 heads each: 3/4 of the work of the 2 seeds x 4 heads before
            *_paper_sweeps((512, 1024, 2048, 4096, 8192), 2048, (8, 16, 32, 64, 128), 2, (0, 1, 2)),
            _backend_sweep((1024, 4096), 2, (0, 1, 2)),
            _fa3_sweep((1024, 2048), (64, 128), 2, (0, 1, 2)),
            *dims_sweeps(small=True),
            _guide_sweep((256, 512, 1024, 2048), 2, (0, 1, 2)),
            *_quick_modern(),
        ),
        guide=GUIDE_SETTINGS["quick"],
    )


def _quick_modern() -> list[Sweep]:
    """quick's small part of the modern study (study.modern), at L=1024 and 3 seeds, after the classic questions
    (which keep their numbers): FA4 bf16 against FA2 (and its two knobs alone), and FA4's FP8 and FP4 paths
    against FA3's FP8 path on Gaussian and outlier inputs (some 40 cases, seconds on 2 cores)."""
    out = []
    for sw in modern_sweeps((1024,), (0, 1, 2), 2, captured=False):
        if sw.question == "modern_fa4":
            out.append(sw)
        elif sw.question == "modern_lowp":
            out.append(dataclasses.replace(sw, methods=("flash:fa4-fp8", "flash:fa4-fp4", FA3_FP8)))
    return out


# The modern study's sweeps (FA4, FP8/FP4, SageAttention, P-cast with a sink; findings in study.modern).
FA2, FA4 = "flash:bf16-mixed", "flash:fa4-bf16"
FA4_EMU, FA4_THR = "flash:bf16-mixed,exp2_emu=10", "flash:bf16-mixed,rescale_threshold=8"
FA3_FP8, FP22 = "flash:fa3-fp8", "flash:fa3-fp8-fp22"
LOWP = ("flash:fa4-fp8", "flash:fa4-fp4", "flash:sage3-fp4", FA3_FP8, FP22, FA2)
SAGE = ("flash:sage1", "flash:sage2", "flash:sage2pp", "flash:sage2-4b")
P_FP8 = f"flash:{P_CAST}"
SINK_SCORES = (4.0, 5.0, 6.0, 7.0, 8.0)  # the sink's score: weak to strong around 2606.06521's threshold 6.93
SINK_METHODS = (P_FP8, P_FP8 + ",kv_order=reverse", P_FP8 + ",p_scale=256", P_FP8 + ",kv_order=reverse,p_scale=256")
STAGE_PRESETS = {"modern_stages": ("fa4-fp8", "fa4-fp4", "sage3-fp4", "fa3-fp8-fp22"),
                 "modern_sage_stages": ("sage1", "sage2", "sage2pp")}  # fmt: skip
RAISED = ("input", "score", "stats", "p", "accum", "output")  # each raised to FP64 alone: explain's attribution
QUESTIONS = ("modern_fa4", "modern_lowp", "modern_sage", "modern_sink", *STAGE_PRESETS)


def modern_sweeps(lengths: tuple[int, ...], seeds: tuple[int, ...], heads: int, captured: bool = True) -> list[Sweep]:
    """The four questions' sweeps at these lengths and seeds (captured MiniLM inputs unless `captured` is off;
    the FP8/FP4 and Sage questions at MiniLM's head dim 32; Sage at its 128 x 64 tiles is paired with
    modern_lowp's FA3-FP8 on the same inputs; the sink question at each sink score of SINK_SCORES)."""
    dists = ("normal", "outliers", *(("captured:minilm",) if captured else ()))
    common = dict(seq_lens=lengths, seeds=seeds, heads=heads, algorithm="fa2", baseline=False, metric="rel_l2")
    return [
        Sweep(question="modern_fa4", methods=(FA2, FA4, FA4_EMU, FA4_THR), distributions=("normal", "outliers"),
              blocks=((128, 128),), **common),
        Sweep(question="modern_lowp", methods=LOWP, distributions=dists, blocks=((128, 128),), head_dims=(32,),
              **common),
        Sweep(question="modern_sage", methods=SAGE, distributions=dists, blocks=((128, 64),),
              head_dims=(32,), **common),
        Sweep(question="modern_sink", methods=SINK_METHODS, distributions=tuple(f"sink:{d:g}" for d in SINK_SCORES),
              blocks=((128, 128),), **common),
        *(Sweep(question=q, methods=_stage_methods(names), distributions=("normal",), head_dims=(32,),
                blocks=((128, 64 if "sage" in q else 128),), **common) for q, names in STAGE_PRESETS.items()),
    ]  # fmt: skip


def _stage_methods(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each preset, the preset with one stage raised to FP64 and with one of its sub-stages removed (explain's
    "raised" runs, as study cases; sub_raised)."""
    return tuple(m for n in names for m in (f"flash:{n}", *(f"flash:{n},{s}=fp64" for s in RAISED),
                                            *(f"flash:{n},{t}" for t in sub_raised(n).values())))  # fmt: skip


def sub_raised(name: str) -> dict[str, str]:
    """The sub-stages of preset `name` (measure.substages) -> the policy terms that remove each alone, e.g.
    {"input:qk": "exact_inputs=qk", "input:v": "exact_inputs=v"} for sage1."""
    from flashcheck.measure.substages import raised_terms, substages

    pol = parse_policy(name)
    return {s.name: raised_terms(s, pol) for s in substages(pol)}




def modern() -> StudyConfig:
    """FlashAttention-4, FP8/FP4 attention and SageAttention against FP64 (study.modern): minutes on 2 cores."""
    return StudyConfig(name="modern", sweeps=tuple(modern_sweeps((1024,), (0, 1, 2), 2)))


def full() -> StudyConfig:
    """Everything, lengths up to 16k, five seeds, the guide at guide-full's sizes (hours)."""
    return StudyConfig(
        name="full",
        sweeps=(
            *_paper_sweeps((512, 1024, 2048, 4096, 8192, 16384), 8192, (8, 16, 32, 64, 128, 256), 8, (0, 1, 2, 3, 4)),
            _backend_sweep((1024, 4096, 16384), 8, (0, 1, 2, 3, 4)),
            _fa3_sweep((512, 1024, 2048, 4096, 8192, 16384), (64, 128, 256), 8, (0, 1, 2, 3, 4)),
            *dims_sweeps(small=False),
            _guide_sweep((512, 1024, 2048, 4096, 8192, 16384), 2, (0, 1, 2, 3, 4)),
            *_modern_part(),
        ),
        guide=GUIDE_SETTINGS["guide-full"],
    )


def _modern_part() -> list[Sweep]:
    """full's small part of the modern study (study.modern): FA4 vs FA2 and the sink question at 1k and 4k, five
    seeds (quick has a smaller part: _quick_modern)."""
    return [
        sw for sw in modern_sweeps((1024, 4096), (0, 1, 2, 3, 4), 2) if sw.question in ("modern_fa4", "modern_sink")
    ]


def tiny() -> StudyConfig:
    """Seconds: every question at toy sizes (for tests and smoke checks)."""
    sweeps = _paper_sweeps((64, 128), 128, (8, 32), 2, (0,))
    return StudyConfig(
        name="tiny",
        sweeps=(*sweeps, _backend_sweep((64,), 2, (0,)), _fa3_sweep((128,), (32,), 2, (0,)), *guide_tiny().sweeps),
        guide=GUIDE_SETTINGS["guide-tiny"],
    )


PRESETS = {
    "quick": quick,
    "paper": paper,
    "fa3": fa3,
    "full": full,
    "tiny": tiny,
    "production": production,
    "guide": guide,
    "guide-full": guide_full,
    "guide-tiny": guide_tiny,
    "modern": modern,
}


def preset(name: str) -> StudyConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}") from None
