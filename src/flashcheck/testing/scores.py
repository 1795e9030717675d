"""How good is an acceptance rule? Its catch rate over the mutants and its false-failure rate over correct kernels.

A mutant (a bug at one dtype) is caught when the rule fails at least one grid case where the mutant's
tensors differ from the clean kernel's (what a test suite over that grid would report); the fraction of
such cases caught is kept too. A false failure is one run of a correct kernel (a real backend or a
simulator configured as a real kernel) that the rule fails. Calibration (`correct_ratios`,
`derive_factors`) sets flashcheck's factors from correct kernels on seeds disjoint from the scoring seeds.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from flashcheck.core.budget import (
    K_FORWARD,
    K_GRADIENT,
    MARGIN,
    QUANTILE,
    RULES,
    STATISTICS,
    Factors,
    flashcheck_statistics,
)
from flashcheck.core.inputs import DISTRIBUTIONS as _ALL_DISTRIBUTIONS
from flashcheck.testing.harness import Case, Prepared, dtype_name, judge, prepare, run_kernel
from flashcheck.testing.mutants import MUTANTS, Mutant, correct_kernel

Kernel = Callable[..., torch.Tensor]
Advance = Callable[[], None]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LENGTHS = (97, 128, 257, 1025)  # odd lengths as flash-attention's tests sweep them
HEAD_DIMS = (40, 64, 80, 128)
SCORE_SEED, CALIBRATION_SEED = 0, 10_000  # disjoint seed ranges: factors are never scored on their own data

# The grids' input distributions: those core.budget.FACTORS were calibrated on. The attention-sink inputs of the
# 2026 kernels ("sink") came later: left out, so every case of the grids (drawn by index) stays the one calibrated.
DISTRIBUTIONS = tuple(d for d in _ALL_DISTRIBUTIONS if d != "sink")


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _backend(name: str) -> Kernel:
    def run(q, k, v, *, causal=False, scale=None):
        from flashcheck.backends import get_backend

        h = q.shape[1]
        return get_backend(name).forward(q, _expand(k, h), _expand(v, h), causal=causal, scale=scale)

    return run


def _simulator(preset: str) -> Kernel:
    def run(q, k, v, *, causal=False, scale=None):
        from flashcheck.kernels import flash_attention
        from flashcheck.kernels.sim.presets import resolve

        kw = resolve(preset, dtype_name(q.dtype), q.shape[-2], k.shape[-2], q.shape[-1], causal)
        out = flash_attention(q.double(), k.double(), v.double(), causal=causal, scale=scale, **kw)
        return out.to(q.dtype)

    return run


CORRECT_KERNELS: dict[str, Kernel] = {
    "tiled": correct_kernel,
    "sdpa-math": _backend("sdpa-math"),
    "sdpa-flash": _backend("sdpa-flash"),
    "sim-torch-cpu-flash": _simulator("torch-cpu-flash"),
    "sim-fa2-gpu": _simulator("fa2-gpu"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """The mutant grid: shapes (B, H, Hkv, L, D) x distributions x seeds x causal, at each mutant's dtypes;
    and `correct_cases` random cases for the correct kernels (each run by every correct kernel)."""

    shapes: tuple[tuple[int, int, int, int, int], ...]
    distributions: tuple[str, ...]
    seeds: tuple[int, ...]
    correct_cases: int
    dtypes: tuple[torch.dtype, ...] = DTYPES
    lengths: tuple[int, ...] = LENGTHS  # of the correct-kernel cases


GRIDS = {
    "tiny": Grid(
        shapes=((1, 4, 2, 97, 32),),
        distributions=("normal",),
        seeds=(SCORE_SEED,),
        correct_cases=4,
        dtypes=(torch.bfloat16,),
        lengths=(97, 128),
    ),
    "quick": Grid(
        shapes=((1, 4, 2, 97, 40), (1, 2, 2, 257, 64)),
        distributions=("normal", "tied"),
        seeds=(SCORE_SEED,),
        correct_cases=12,
    ),
    "full": Grid(
        shapes=((2, 4, 4, 128, 64), (1, 4, 2, 97, 40), (1, 2, 1, 1025, 64)),
        distributions=DISTRIBUTIONS,
        seeds=(SCORE_SEED,),
        correct_cases=48,
    ),
}


def get_grid(size: str) -> Grid:
    if size not in GRIDS:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(GRIDS)}")
    return GRIDS[size]


def mutant_cases(mutant: Mutant, dtype: torch.dtype, grid: Grid) -> list[Case]:
    """The grid's cases for one mutant at one dtype (causal only for a causal-mask bug)."""
    causal = (True,) if mutant.causal_only else (False, True)
    return [
        Case(
            batch=b,
            heads=h,
            kv_heads=hkv,
            seq_len=n,
            head_dim=d,
            dtype=dtype,
            causal=c,
            distribution=dist,
            seed=seed,
            backward=True,
        )
        for (b, h, hkv, n, d), dist, seed, c in itertools.product(grid.shapes, grid.distributions, grid.seeds, causal)
    ]


def correct_cases(
    n: int, seed0: int = SCORE_SEED, dtypes: Sequence[torch.dtype] = DTYPES, lengths: Sequence[int] = LENGTHS
) -> list[Case]:
    """n cases (reproducible from seed0): lengths and head dims cycle through lengths x HEAD_DIMS, dtypes
    and input distributions through theirs (periods 16, 3, 5: every combination of two recurs); causal
    and heads drawn at random; backward on."""
    rng = random.Random(seed0)
    out = []
    for i in range(n):
        length, d = lengths[i % len(lengths)], HEAD_DIMS[(i // len(lengths)) % len(HEAD_DIMS)]
        b, h, hkv = (1, 2, 2) if length > 512 else rng.choice([(1, 2, 2), (2, 2, 1), (1, 4, 2), (2, 4, 4)])
        out.append(
            Case(
                batch=b,
                heads=h,
                kv_heads=hkv,
                seq_len=length,
                head_dim=d,
                dtype=dtypes[i % len(dtypes)],
                causal=rng.random() < 0.5,
                distribution=DISTRIBUTIONS[i % len(DISTRIBUTIONS)],
                seed=seed0 + i,
                backward=True,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class MutantRow:
    """One mutant at one dtype: active cases (the bug changes a tensor), cases failed per rule, and per rule
    how many cases each check failed."""

    mutant: str
    dtype: str
    description: str
    source: str
    bug: str
    active: int
    failed: dict[str, int]
    checks: dict[str, dict[str, int]]

    def caught(self, rule: str) -> bool:
        return self.failed.get(rule, 0) > 0

    def to_dict(self) -> dict:
        return {
            "mutant": self.mutant,
            "dtype": self.dtype,
            "description": self.description,
            "source": self.source,
            "bug": self.bug,
            "active_cases": self.active,
            "caught": {r: self.caught(r) for r in self.failed},
            "cases_failed": dict(self.failed),
            "checks_failed": {r: dict(c) for r, c in self.checks.items()},
        }


@dataclass(frozen=True, slots=True)
class FalseFailures:
    """Correct-kernel runs and, per rule, how many failed (with the first few, as 'kernel: case: tensors')."""

    runs: int
    failed: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)

    def rate(self, rule: str) -> float:
        return self.failed[rule] / self.runs if self.runs else 0.0


@dataclass(frozen=True, slots=True)
class Score:
    rules: tuple[str, ...]
    rows: tuple[MutantRow, ...]
    false_failures: FalseFailures

    def caught(self, rule: str) -> int:
        return sum(r.caught(rule) for r in self.rows)

    def catch_rate(self, rule: str) -> float:
        return self.caught(rule) / len(self.rows) if self.rows else 0.0

    def cases_caught(self, rule: str) -> tuple[int, int]:
        """(cases the rule failed, active cases) summed over the mutants: the per-case catch rate."""
        return sum(r.failed[rule] for r in self.rows), sum(r.active for r in self.rows)

    def to_dict(self) -> dict:
        ff = self.false_failures
        return {
            "rules": list(self.rules),
            "mutants": [r.to_dict() for r in self.rows],
            "catch_rate": {r: self.catch_rate(r) for r in self.rules},
            "caught": {r: self.caught(r) for r in self.rules},
            "mutant_count": len(self.rows),
            "cases_caught": {r: dict(zip(("failed", "active"), self.cases_caught(r), strict=True)) for r in self.rules},
            "false_failures": {
                "runs": ff.runs,
                "failed": dict(ff.failed),
                "rate": {r: ff.rate(r) for r in self.rules},
                "examples": {r: list(e) for r, e in ff.examples.items()},
            },
        }


def check_rules(rules: Iterable[str]) -> tuple[str, ...]:
    rules = tuple(rules)
    bad = [r for r in rules if r not in RULES]
    if bad or not rules:
        raise ValueError(f"unknown rule(s) {', '.join(bad) or '(none)'}; expected one or more of {', '.join(RULES)}")
    return rules


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[n], b[n]) for n in a)


def _failed_checks(outputs: dict, prep: Prepared, rule: str) -> set[str]:
    return {c.name for res in judge(outputs, prep, rule=rule).values() for c in res.failed()}


def _score_case(prep: Prepared, mutants, rules, tally) -> None:
    """Run the clean kernel and each mutant on one prepared case; tally[(mutant, rule)] counts failures."""
    clean = run_kernel(correct_kernel, prep.inputs, prep.grad_out, prep.case.causal)
    for m in mutants:
        got = run_kernel(m.fn, prep.inputs, prep.grad_out, prep.case.causal)
        if not _differs(got, clean):
            continue
        tally[(m.name, "active")] = tally.get((m.name, "active"), 0) + 1
        for rule in rules:
            failed = _failed_checks(got, prep, rule)
            tally[(m.name, rule)] = tally.get((m.name, rule), 0) + bool(failed)
            for name in failed:
                tally[(m.name, rule, name)] = tally.get((m.name, rule, name), 0) + 1


def _all_cases(mutants: Sequence[Mutant], grid: Grid) -> dict[Case, list[Mutant]]:
    """Each grid case with the mutants that apply to it (cases shared, so each is prepared once)."""
    by_case: dict[Case, list[Mutant]] = {}
    for m, dtype in itertools.product(mutants, grid.dtypes):
        if dtype in m.dtypes:
            for case in mutant_cases(m, dtype, grid):
                by_case.setdefault(case, []).append(m)
    return by_case


def score_mutants(
    rules: Iterable[str] = RULES,
    grid: Grid = GRIDS["quick"],
    mutants: Sequence[Mutant] | None = None,
    advance: Advance | None = None,
) -> list[MutantRow]:
    """One row per (mutant, dtype) in grid.dtypes where the mutant is a bug."""
    rules = check_rules(rules)
    mutants = list(MUTANTS.values()) if mutants is None else list(mutants)
    tallies: dict[torch.dtype, dict] = {d: {} for d in grid.dtypes}
    for case, ms in _all_cases(mutants, grid).items():
        _score_case(prepare(case), ms, rules, tallies[case.dtype])
        if advance:
            advance()
    rows = []
    for m, dtype in itertools.product(mutants, grid.dtypes):
        if dtype in m.dtypes:
            t = tallies[dtype]
            checks = {r: {key[2]: n for key, n in t.items() if key[:2] == (m.name, r) and len(key) == 3} for r in rules}
            failed = {r: t.get((m.name, r), 0) for r in rules}
            rows.append(
                MutantRow(
                    m.name,
                    dtype_name(dtype),
                    m.description,
                    m.source,
                    m.bug.describe(),
                    t.get((m.name, "active"), 0),
                    failed,
                    checks,
                )
            )
    return rows


def mutant_case_count(grid: Grid, mutants: Sequence[Mutant] | None = None) -> int:
    """How many distinct cases score_mutants prepares (for progress bars)."""
    return len(_all_cases(list(MUTANTS.values()) if mutants is None else list(mutants), grid))


def false_failures(
    rules: Iterable[str] = RULES,
    cases: Sequence[Case] = (),
    kernels: dict[str, Kernel] | None = None,
    advance: Advance | None = None,
) -> FalseFailures:
    """Run every correct kernel on every case; count, per rule, the runs that fail."""
    rules = check_rules(rules)
    kernels = CORRECT_KERNELS if kernels is None else kernels
    failed, examples, runs = dict.fromkeys(rules, 0), {r: [] for r in rules}, 0
    for case in cases:
        prep = prepare(case)
        for name, fn in kernels.items():
            runs += 1
            got = run_kernel(fn, prep.inputs, prep.grad_out, case.causal)
            for rule in rules:
                bad = [t for t, res in judge(got, prep, rule=rule).items() if not res]
                if bad:
                    failed[rule] += 1
                    if len(examples[rule]) < 5:
                        examples[rule].append(f"{name}: {case.label()}: {', '.join(bad)}")
        if advance:
            advance()
    return FalseFailures(runs, failed, examples)


def score(rules: Iterable[str] = RULES, size: str = "quick", advance: Advance | None = None) -> Score:
    """Catch rate over the mutants and false-failure rate over correct kernels, on grid `size`."""
    rules, grid = check_rules(rules), get_grid(size)
    rows = score_mutants(rules, grid, advance=advance)
    ff = false_failures(
        rules, correct_cases(grid.correct_cases, SCORE_SEED, grid.dtypes, grid.lengths), advance=advance
    )
    return Score(rules, tuple(rows), ff)


def step_count(size: str) -> int:
    """Steps `score(size=...)` reports through `advance`."""
    grid = get_grid(size)
    return mutant_case_count(grid) + grid.correct_cases


def correct_ratios(
    cases: Sequence[Case], kernels: dict[str, Kernel] | None = None, advance: Advance | None = None
) -> list[dict]:
    """For each correct-kernel run and tensor: flashcheck's statistics as ratios to the baseline's."""
    kernels = CORRECT_KERNELS if kernels is None else kernels
    out = []
    for case in cases:
        prep = prepare(case)
        for name, fn in kernels.items():
            got = run_kernel(fn, prep.inputs, prep.grad_out, case.causal)
            out += [{"kernel": name, "case": case.label(), **r} for r in _ratios(got, prep)]
        if advance:
            advance()
    return out


def _ratios(got: dict[str, torch.Tensor], prep: Prepared) -> list[dict]:
    rows = []
    for tensor, ref in prep.reference.items():
        stats = flashcheck_statistics(got[tensor], ref, prep.baseline[tensor], prep.case.dtype)
        row = {s: (v / b if b > 0 else (0.0 if v == 0 else math.inf)) for s, (v, b) in stats.items()}
        dtype, kind = str(prep.case.dtype).replace("torch.", ""), "output" if tensor == "out" else "gradient"
        rows.append({"tensor": tensor, "dtype": dtype, "kind": kind, "distribution": prep.case.distribution, **row})
    return rows


def derive_factors(
    ratios: Sequence[dict], quantile: float = QUANTILE, margin: float = MARGIN
) -> dict[tuple[str, str, str], Factors]:
    """Per (dtype, kind, distribution): each statistic's `quantile` over the ratios times `margin`, rounded
    up to 2 significant digits, and at least 1 (max: at least the peers' k, 2 for outputs, 3 for
    gradients)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in ratios:
        groups.setdefault((r["dtype"], r["kind"], r["distribution"]), []).append(r)
    out = {}
    for key, rows in sorted(groups.items()):
        least = {"max": K_GRADIENT if key[1] == "gradient" else K_FORWARD}
        vals = {}
        for stat in STATISTICS:
            q = torch.quantile(torch.tensor([r[stat] for r in rows], dtype=torch.float64), quantile).item()
            vals[stat] = max(least.get(stat, 1.0), _round_up(q * margin))
        out[key] = Factors(**vals)
    return out


def _round_up(x: float, digits: int = 2) -> float:
    """x rounded up to `digits` significant digits."""
    if not 0 < x < math.inf:
        return x
    exponent = math.floor(math.log10(x)) - digits + 1
    return float(round(math.ceil(x / 10**exponent - 1e-9) * 10**exponent, max(0, -exponent)))


def table_rows(score: Score) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the mutant x rule table: caught or not, then how many of its active cases failed ('missed:
    0/8 failed'; 'missed 0/8' read as nothing missed), the checks that fired (most often first); the last row holds
    the totals."""
    header = ["mutant", "dtype", "active", *score.rules]
    rows = []
    for r in score.rows:
        cells = [r.mutant, r.dtype, str(r.active)]
        for rule in score.rules:
            fired = sorted(r.checks[rule], key=lambda c: -r.checks[rule][c])
            word = "caught" if r.caught(rule) else "missed"
            cells.append(f"{word}: {r.failed[rule]}/{r.active} failed" + (f" ({', '.join(fired)})" if fired else ""))
        rows.append(cells)
    totals = [f"{score.caught(rule)}/{len(score.rows)} = {100 * score.catch_rate(rule):.1f}%" for rule in score.rules]
    rows.append(["total caught", "", "", *totals])
    return header, rows


def cases_line(score: Score) -> str:
    parts = []
    for rule in score.rules:
        failed, active = score.cases_caught(rule)
        parts.append(f"{rule} {failed}/{active} ({100 * failed / active if active else 0:.1f}%)")
    return "mutant cases caught (a case: one mutant on one grid point where its bug shows): " + ", ".join(parts)


def false_failure_line(score: Score) -> str:
    ff = score.false_failures
    parts = [f"{rule} {ff.failed[rule]}/{ff.runs} ({100 * ff.rate(rule):.1f}%)" for rule in score.rules]
    return f"false failures over {ff.runs} correct-kernel runs: " + ", ".join(parts)


def markdown_table(score: Score) -> str:
    """The table as Markdown, then the false-failure line."""
    header, rows = table_rows(score)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, "", cases_line(score), "", false_failure_line(score)])
