"""Cases of a study, their records, and their evaluation (one FP64 reference per input set)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import platform
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from flashcheck.core import captured
from flashcheck.core.inputs import InputSpec, is_captured, sink_delta
from flashcheck.core.printable import printable
from flashcheck.kernels import SIMULATED_KERNELS
from flashcheck.measure import METRICS, References, parse_method, run_case
from flashcheck.measure import Case as MeasureCase
from flashcheck.measure.inputstats import input_stats, narrow_p, range_stats
from flashcheck.measure.mma_error import pv_mma_stats
from flashcheck.study.config import StudyConfig, Sweep

STATUSES = ("ok", "skipped", "failed")


# Fields added after the first stores were written: a case at these defaults hashes as it did then.
_LATER_DEFAULTS = {"kv_heads": 0, "seq_len_k": 0, "padding": "none", "backward": False, "layer": 0, "splits": 0}


@functools.lru_cache(maxsize=1 << 16)
def _case_id(case: Case) -> str:
    """Case.case_id: sha256 of the JSON of the fields not at their _LATER_DEFAULTS. Every field is a str, int or
    bool, so the fields are read as they are (dataclasses.asdict deep-copied each: 2.5x the time), and a case asked
    again (a study looks its records up by id many times) is answered from the cache."""
    d = {k: v for k in _FIELDS if _LATER_DEFAULTS.get(k, _UNSET) != (v := getattr(case, k))}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


_UNSET = object()


@dataclass(frozen=True, slots=True)
class Case:
    """One kernel under one policy on one input set. Standard cases carry block 0 x 0.

    kv_heads: K/V heads (0: as many as query heads; fewer: GQA/MQA); seq_len_k: keys (0: seq_len; decoding has
    seq_len 1 or 16 queries against a long KV cache); padding: InputSpec.padding ("none", "left:F", "right:F");
    backward: dQ, dK, dV errors too; layer: the layer of a captured:MODEL distribution; splits: key chunks of
    the splitkv kernel (0: the kernel's default)."""

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
    kv_heads: int = 0
    seq_len_k: int = 0
    padding: str = "none"
    backward: bool = False
    layer: int = 0
    splits: int = 0

    @property
    def case_id(self) -> str:
        return _case_id(self)

    @property
    def lk(self) -> int:
        return self.seq_len_k or self.seq_len

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
            kv_heads=self.kv_heads or None,
            seq_len_k=self.seq_len_k or None,
            padding=self.padding,
            layer=self.layer,
        )

    def measure_case(self, device: str = "cpu") -> MeasureCase:
        """This case as a measurement: its method alone (the baseline is a case of its own), every metric;
        a simulator runs on `device`."""
        extra = {"splits": self.splits} if self.splits else {}
        m = parse_method(
            self.method, block_q=self.block_q, block_k=self.block_k, algorithm=self.algorithm, device=device, **extra
        )
        spec = self.input_spec()
        return MeasureCase(
            inputs=spec,
            method=m,
            causal=self.causal,
            backward=self.backward,
            metrics=tuple(METRICS),
            with_baseline=False,
        )

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
            self.kv_heads,
            self.seq_len_k,
            self.padding,
            self.layer,
        )


_FIELDS = tuple(f.name for f in dataclasses.fields(Case))


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
    dead_rows: str | None = None  # the output on rows with no visible key: zeros / nan / other (padding)
    stats: dict[str, float] = dataclasses.field(default_factory=dict)  # input statistics (study.inputstats)

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
            error=None if d.get("error") is None else printable(d["error"]),  # printed and reported: no escapes
            env={k: printable(v) for k, v in d.get("env", {}).items()},
            dead_rows=d.get("dead_rows"),
            stats=d.get("stats") or {},
        )


def sweep_causals(sw: Sweep) -> tuple[bool, ...]:
    """The sweep's causal settings: `causal` is one bool or a list of them (a dimension)."""
    return (sw.causal,) if isinstance(sw.causal, bool) else tuple(sw.causal)


def _inputs_grid(sw: Sweep) -> itertools.product:
    return itertools.product(
        sw.seq_lens,
        sw.seq_lens_k,
        sw.head_dims,
        sw.kv_heads,
        sweep_causals(sw),
        sw.paddings,
        sw.distributions,
        sw.layers,
        sw.seeds,
    )


def expand_sweep(sw: Sweep) -> list[Case]:
    """Every case of one sweep (standard cases deduplicated across blocks; splits only for splitkv)."""
    cases: dict[str, Case] = {}
    for method in sw.all_methods():
        kernel, _, policy = method.partition(":")
        tiled = kernel in ("flash", "splitkv")
        blocks = sw.blocks if tiled else ((0, 0),)
        splits = sw.splits if kernel == "splitkv" else (0,)
        for length, lk, d, hkv, causal, pad, dist, layer, seed in _inputs_grid(sw):
            for (bq, bk), s in itertools.product(blocks, splits):
                alg = sw.algorithm if tiled else ""
                lk_ = 0 if lk == length else lk
                layer = layer if is_captured(dist) else 0  # the layer is a dimension of captured inputs only
                c = Case(kernel, policy, alg, bq, bk, sw.batch, sw.heads, length, d, causal, dist, seed)
                c = dataclasses.replace(
                    c, kv_heads=hkv, seq_len_k=lk_, padding=pad, backward=sw.backward, layer=layer, splits=s
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
    return sorted(groups.values(), key=lambda g: -g[0].seq_len * g[0].lk * g[0].heads * g[0].batch)


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


def evaluate_group(cases: list[Case], emit: Callable[[CaseRecord], None], device: str = "cpu") -> int:
    """Evaluate cases sharing one input set through measure.run_case, emitting each record as it finishes;
    simulators and the FP64 references run on `device`. Returns how many FP64 references were computed (one
    for the original inputs, one per distinct input rounding: measure.References shares them). Runs on one
    thread (determinism across executors and worker counts; parallelism is by process) and gives the caller
    its thread count back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _evaluate_group(cases, emit, device)
    finally:
        torch.set_num_threads(threads)


def _evaluate_group(cases: list[Case], emit: Callable[[CaseRecord], None], device: str) -> int:
    env = environment()
    why = captured.unavailable(cases[0].distribution)
    if why:  # e.g. captured:minilm without transformers: skipped with the install command, not failed
        for c in cases:
            emit(CaseRecord(c.case_id, c, "skipped", {}, {}, 0.0, why, env))
        return 0
    refs = References(cases[0].input_spec(), causal=cases[0].causal, device=device)
    stats = input_stats(refs.q, refs.k, refs.v, causal=refs.causal, mask=refs.mask)
    if sink_delta(cases[0].distribution) is not None:  # sink inputs: the P-collapse fraction and its closed form too
        from flashcheck.measure.collapse import collapse_fraction, refined_form

        form = refined_form(refs.q, refs.k, cases[0].distribution)
        stats = stats | {"p_collapse": collapse_fraction(refs.q, refs.k, refs.v), "p_collapse_form": form}
    for c in cases:
        rec = run_case(c.measure_case(device), refs)
        errs, errs_r = dict(rec.candidate), dict(rec.candidate_rounded)
        for name, g in (rec.grad or {}).items():  # backward cases: dq_rel_l2, dk_max_abs, ...
            errs |= {f"{name}_{k}": v for k, v in g["candidate"].items()}
            errs_r |= {f"{name}_{k}": v for k, v in g.get("candidate_rounded", {}).items()}
        st = stats | case_range_stats(c, refs)
        fields = (rec.status, errs, errs_r, rec.seconds, rec.reason, env, rec.dead_rows, st)
        emit(CaseRecord(c.case_id, c, *fields))
    return refs.computed


def case_range_stats(c: Case, refs: References) -> dict[str, float]:
    """measure.inputstats.range_stats for a flash or standard case whose P is cast to a narrow format (fp8, fp4,
    scaled P): the error model's range terms at the case's key block and KV order; {} for every other case."""
    if c.kernel not in ("flash", "standard") or c.backward:
        return {}
    try:
        m = parse_method(c.method, block_q=c.block_q, block_k=c.block_k, algorithm=c.algorithm)
    except ValueError:
        return {}
    pol = m.policy
    if pol is None or not narrow_p(pol):
        return {}
    order = pol.kv_order or "forward"
    out = range_stats(refs.q, refs.k, refs.v, pol, block_k=m.block_k or 128, order=order, causal=refs.causal,
                      mask=refs.mask, kernel=c.kernel)  # fmt: skip
    if pol.pv_mma and c.kernel == "flash":  # the tensor-core P·V chain's derived term (measure.mma_error)
        out |= pv_mma_stats(refs.q, refs.k, refs.v, pol, block_k=m.block_k or 128, causal=refs.causal, mask=refs.mask)
    return out


def _trial_error(kernel: str, policy: str, head_dim: int, sw: Sweep) -> str | None:
    """The error a simulator raises on tiny inputs of head dim `head_dim` under the sweep's settings."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    bq, bk = sw.blocks[0]
    try:
        m = parse_method(f"{kernel}:{policy}", block_q=bq, block_k=bk, algorithm=sw.algorithm)
        m.run(q, k, v, causal=sweep_causals(sw)[0])
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
