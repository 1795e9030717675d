"""Study configurations: sweeps (grids of cases), custom sweeps from TOML, and a preset by name (the presets are
the question sets' own: study.registry)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashcheck.core.inputs import DISTRIBUTIONS, known_distribution, parse_padding
from flashcheck.core.numerics import parse_format, parse_policy
from flashcheck.kernels import SIMULATED_KERNELS as KERNELS
from flashcheck.kernels.sim.flash import ALGORITHMS


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
                shown = list(vals) if isinstance(vals, tuple | list) else vals
                raise ValueError(f"{where}: {name}={shown!r} must be a non-empty list of non-negative integers")
        self._check_splits(where)
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

    def _check_splits(self, where: str) -> None:
        """Every S of a splitkv method at most the key blocks ceil(Lk / Bc) of some length and block size of the
        sweep (the kernel splits whole blocks: an S above every one of them runs as fewer chunks than its rows say
        everywhere, as compare refuses it; one above some of them only is a grid's corner, kept)."""
        pairs = all(isinstance(b, tuple | list) and len(b) == 2 and _is_int(b[1]) and b[1] > 0 for b in self.blocks)
        lengths = all(_is_int(x) and x > 0 for x in self.seq_lens)
        if not (pairs and lengths) or not any(str(m).partition(":")[0] == "splitkv" for m in self.methods or ()):
            return  # no splitkv method, or lengths and blocks the other checks refuse
        grid = itertools.product(self.seq_lens, self.seq_lens_k, self.blocks)
        most, lk, bc = max((-(-(lk or lq) // bc), lk or lq, bc) for lq, lk, (_, bc) in grid)
        over = [s for s in self.splits if s > most]
        if over:
            raise ValueError(
                f"{where}: splits {over[0]} is more than the {most} key block(s) of the sweep's longest keys "
                f"(Lk={lk} at Bc={bc}: ceil(Lk / Bc)); the splitkv kernel splits whole blocks, so give S from 1 to "
                f"{most} (0: its default)"
            )

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

    def most_cases(self) -> int:
        """The most cases this sweep expands to (every dimension's values multiplied; baselines and blocks that
        coincide make fewer), counted without expanding them."""
        dims = (self.seq_lens, self.seq_lens_k, self.head_dims, self.kv_heads, self.paddings, self.distributions,
                self.layers, self.seeds, self.blocks, self.splits)  # fmt: skip
        causals = 1 if isinstance(self.causal, bool) else len(self.causal)
        return 2 * len(self.methods) * causals * math.prod(max(1, len(d)) for d in dims)


MAX_CASES = 200_000  # a study's cases: the full preset has 2,645; more would run (or report) for days


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """A named list of sweeps, and the settings of a question set's own tasks by table name (e.g. the production
    guide's `guide`: study.registry.QuestionSet.settings), each with from_dict(data, source) and to_dict()."""

    name: str
    sweeps: tuple[Sweep, ...] = field(default_factory=tuple)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {"name": self.name, "sweeps": [dataclasses.asdict(s) for s in self.sweeps]}
        return out | {k: v.to_dict() for k, v in self.settings.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> StudyConfig:
        from flashcheck.study.registry import settings_tables

        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a table with 'name' and 'sweeps', got a {type(data).__name__}")
        tables = settings_tables()
        allowed = {"name", "sweeps", *tables}
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
        parsed = tuple(_sweep_from_dict(s, i, source) for i, s in enumerate(sweeps, 1))
        if (most := sum(sw.most_cases() for sw in parsed)) > MAX_CASES:  # before anything expands them
            raise ValueError(
                f"{source}: its sweeps name up to {most} cases, more than the {MAX_CASES} a study runs (the full "
                "preset has 2,645); split it into several studies"
            )
        return cls(
            name=name,
            sweeps=parsed,
            settings={k: kind.from_dict(data[k], source) for k, kind in tables.items() if data.get(k) is not None},
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


def preset(name: str) -> StudyConfig:
    """The registered preset `name` (study.registry); ValueError naming the presets there are."""
    from flashcheck.study.registry import presets

    known = presets()
    try:
        return known[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(known)}") from None
