"""The hunt: Hypothesis rounds over the input space until the time budget is spent, each finding shrunk.

A round is one @given search of `ROUND_EXAMPLES` cases (Hypothesis's generation, its `target()` phase steering
towards larger error / budget ratios, its shrinker, and its example database in the out folder, which replays a
failure that a killed run found but had not stored). A round locks onto the first failure of a kind not yet
found (kind x tensor, judge.KINDS) and shrinks it; after `shrink_s` it stops shrinking (the smallest case so far
is kept). Findings, the examples run and the time spent are stored atomically after every round, so that a
killed hunt resumes with the budget it had left and without finding the same thing twice.

A target that may kill its process (hunt.isolate.isolates: backends, user callables) runs in a worker; a case
that kills it is a `crash` finding, stored at once (before the progress line, before shrinking: marked
provisional until its round ends with the shrunk case), and the next case gets a fresh worker. The property
raises on a crash like on any failure, so Hypothesis shrinks it (each crashing step costs a worker restart, a
hanging one its timeout; a case that crashed is not run again in the same hunt), and its example database
replays it on resume, where it is a crash again, recorded once.

A seeded hunt draws the same cases wherever it runs: Hypothesis's pool of integer, float and string literals mined
from "local" source (every imported module outside site-packages and tests: flashcheck itself in an editable
install, not in a wheel; whatever else the session imported), which it starts searches from, is emptied for the
hunt (_fixed_pool), so the draws depend on the seed, the target and this package's version alone."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

from flashcheck.core.fileio import make_folder, refuse_link
from flashcheck.hunt.case import HuntCase, parse_case
from flashcheck.hunt.isolate import STDERR, IsolatedTarget, isolates
from flashcheck.hunt.judge import Outcome, evaluate
from flashcheck.hunt.onset import ONSET_KINDS, shrink_onset
from flashcheck.hunt.store import STORE, Finding, HuntState
from flashcheck.hunt.target import Target

ROUND_EXAMPLES = 40
DATABASE = "hypothesis-db"
STORAGE = "hypothesis-storage"  # Hypothesis's own files (its home directory), kept in --out rather than ./.hypothesis
WRITTEN = (STORE, "summary.json", "report.md", "report.html", STDERR)  # plain files a hunt writes into --out
FOLDERS = ("findings", DATABASE, STORAGE)  # folders a hunt writes into inside --out


def check_links(out: Path) -> None:
    """LinkRefused when --out itself or a file or folder the hunt writes inside it is a symbolic link."""
    refuse_link(out, "the --out folder")
    for name in (*WRITTEN, *FOLDERS):
        refuse_link(out / name, f"{name} in --out")


class _Found(Exception):
    """Raised inside the property to make Hypothesis shrink the locked failure."""


def hunt(
    target: Target,
    out: Path,
    *,
    budget_s: float,
    seed: int | None = None,
    rule: str = "peers",
    backward: bool = True,
    shrink_s: float | None = None,
    rounds: int | None = None,
    on_step: Callable[[HuntState, str], None] | None = None,
    isolate: bool | None = None,
    case_timeout_s: float | None = None,
) -> HuntState:
    """Hunt `target` for `budget_s` seconds in all (a resumed hunt spends what its store has left), storing
    into `out`. `seed`: Hypothesis's seed of round i is seed + i (None: random); `shrink_s`: the most time
    one finding's shrinking takes (None: a fifth of the budget, at least 10 s); `rounds`: stop after that many
    rounds in all (None: the budget alone), which makes a seeded hunt's cases independent of the machine's speed;
    `isolate`: run the target in a worker process (None: isolate.isolates(target)); `case_timeout_s`: in a worker, a
    case with no answer after that long is a crash finding of signal "hang" (None: no limit; in-process: none)."""
    import torch

    make_folder(out, "the --out folder")
    check_links(out)
    state = HuntState.load(out, target)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the cases are small: one intra-op thread is faster than contended ones
    try:
        if seed is None:  # a seed of our own: Hypothesis then prints no "@seed(...)" advice when interrupted
            import random

            seed = random.SystemRandom().randrange(2**32)
        if not (isolates(target) if isolate is None else isolate):
            with _fixed_pool():
                return _hunt(target, out, state, budget_s, (seed, rule, backward), shrink_s, rounds, on_step, None)
        waiting = None if on_step is None else (lambda s: on_step(state, f"a case running for {s:.0f} s"))
        with IsolatedTarget(target, out / STDERR, case_timeout_s, waiting) as worker, _fixed_pool():
            return _hunt(target, out, state, budget_s, (seed, rule, backward), shrink_s, rounds, on_step, worker)
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _fixed_pool():
    """Hypothesis's pool of local constants empty while the block runs (see the module docstring); a Hypothesis
    without that pool (before 6.131) has nothing to fix."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - Hypothesis moved its internals
        yield
        return
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "CONSTANTS_CACHE"):
        yield
        return
    mined = providers._get_local_constants
    providers._get_local_constants = providers.Constants
    providers.CONSTANTS_CACHE.cache.clear()  # each choice type's permitted constants, cached with the pool's
    try:
        yield
    finally:
        providers._get_local_constants = mined
        providers.CONSTANTS_CACHE.cache.clear()


def _hunt(target, out, state, budget_s, opts, shrink_s, rounds, on_step, worker) -> HuntState:
    from hypothesis.configuration import set_hypothesis_home_dir
    from hypothesis.database import DirectoryBasedExampleDatabase

    set_hypothesis_home_dir(str(make_folder(out / STORAGE, f"{STORAGE} in --out")))
    db = DirectoryBasedExampleDatabase(str(make_folder(out / DATABASE, f"{DATABASE} in --out")))
    clock = time.monotonic() - state.elapsed_s
    shrink_s = max(10.0, budget_s / 5) if shrink_s is None else shrink_s
    step = on_step or (lambda s, note: None)
    crashed: dict[str, Outcome] = {}  # case text -> its outcome, for the cases that crashed (killed or hung)
    while time.monotonic() - clock < budget_s and (rounds is None or state.rounds < rounds):
        run = None if worker is None else worker.outputs
        found = _round(target, state, db, clock, (budget_s, shrink_s), opts, step, (run, out, crashed))
        state.rounds += 1
        state.elapsed_s = time.monotonic() - clock
        if found is not None:
            same = [i for i, f in enumerate(state.findings) if f.signature == found.signature]
            if same:  # the crash stored when first seen, now shrunk
                state.findings[same[0]] = found
            else:
                state.findings.append(found)
        _failed_everywhere(state, time.monotonic() - clock)
        state.save(out, target)
        step(state, f"round {state.rounds}" + (f": found {found.kind} in {found.tensor}" if found else ""))
    return state


def _failed_everywhere(state: HuntState, now: float) -> None:
    """A target that raised on every case run so far (none judged) is a finding of kind `failed`, not a pass: a
    kernel that never works. Kept up to date while that holds; dropped once a case is judged."""
    others = [f for f in state.findings if f.kind != "failed"]
    if not state.examples or state.refusals < state.examples or len(state.first_error) != 2:
        state.findings = others
        return
    n, (case, error) = state.examples, state.first_error
    message = f"the target failed on {n} of {n} cases: first error {error}"
    where = f"every case ({n} of {n})"
    failed = Finding("failed", "all", parse_case(case), where, message, now, now, 0, 1.0, category="target-error")
    state.findings = [*others, failed]


def _round(target, state: HuntState, db, clock: float, times, opts, step, io) -> Finding | None:
    """One Hypothesis search; the shrunk finding of the first new kind of failure, or None."""
    from hypothesis import HealthCheck, Phase, given, reject, settings
    from hypothesis import seed as fix_seed
    from hypothesis import target as steer
    from hypothesis.errors import HypothesisException

    from flashcheck.hunt.space import cases

    budget_s, shrink_s = times
    seed, rule, backward = opts
    run, out, crashed = io
    known = {f.signature for f in state.findings if not f.provisional}
    lock: dict = {"sig": None, "best": None, "at": 0.0, "examples": 0}

    @settings(
        database=db,
        max_examples=ROUND_EXAMPLES,
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(cases(target, backward=backward))
    def prop(case: HuntCase) -> None:
        now = time.monotonic() - clock
        if lock["sig"] is None and now > budget_s:
            return  # out of time: the rest of the round passes without running
        done = now - lock["at"] > shrink_s or now > budget_s  # shrinking is bounded by the budget too
        if lock["sig"] is not None and done and case != lock["best"].case:
            return  # done shrinking: only the smallest case so far still fails
        outcome = crashed.get(case.to_text())  # a case that crashed is not rerun: a hang costs its whole timeout
        if outcome is None:
            outcome = evaluate(target, case, rule, run)
            _count(state, outcome)
            _store_crash(target, state, outcome, now, lambda: state.save(out, target), crashed)
        step(state, case.describe())
        if outcome.error is not None:
            reject()
        steer(min(outcome.margin(), 1e6), label="error / budget")
        sigs = [(v.kind, v.tensor) for v in outcome.failures]
        if lock["sig"] is None and (new := [s for s in sigs if s not in known]):
            lock.update(sig=new[0], at=now, examples=state.examples)
        if lock["sig"] in sigs:
            lock["best"] = outcome
            raise _Found

    prop = fix_seed(seed + state.rounds)(prop)
    try:
        prop()
    except _Found:
        pass
    except HypothesisException:  # flaky replay of a non-deterministic target, or an unsatisfiable round
        pass
    if lock["best"] is None:
        return None
    _to_onset(target, lock, rule, run)
    return annotated(target, _finding(lock, clock))


def _to_onset(target: Target, lock: dict, rule: str, run) -> None:
    """A numeric finding's case lowered to the smallest logits at which it still holds (hunt.onset)."""
    if lock["sig"][0] not in ONSET_KINDS:
        return
    least = _least_margin(lock["best"], lock["sig"])
    same = lambda c: _holds(evaluate(target, c, rule, run), lock["sig"], least)  # noqa: E731
    lock["best"] = shrink_onset(lock["best"].case, same)[1] or lock["best"]


def _least_margin(outcome: Outcome, sig: tuple[str, str]) -> float:
    """The margin a smaller case must keep to hold the same budget finding: half the found case's excess over the
    budget (an error that hovers at 1.01x the budget over a range of logits is no onset); 0 for the other kinds."""
    if sig[0] != "budget":
        return 0.0
    m = next(v.margin for v in outcome.failures if (v.kind, v.tensor) == sig)
    return 1.0 + (m - 1.0) / 2 if math.isfinite(m) else 1.0


def _holds(outcome: Outcome, sig: tuple[str, str], least: float = 0.0) -> Outcome | None:
    hit = any((v.kind, v.tensor) == sig and v.margin >= least for v in outcome.failures)
    return outcome if hit else None


def _finding(lock: dict, clock: float) -> Finding:
    """The locked failure's smallest case as a Finding (found when locked, shrunk now)."""
    best: Outcome = lock["best"]
    v = next(v for v in best.failures if (v.kind, v.tensor) == lock["sig"])
    end = time.monotonic() - clock
    return Finding(v.kind, v.tensor, best.case, v.where(), v.message, lock["at"], end, lock["examples"], v.margin)


def annotated(target: Target, f: Finding) -> Finding:
    """`f` with its api, category (and why, in the message), max_logit and known report (hunt.classify)."""
    from flashcheck.hunt.classify import category, known_report, max_logit

    cat, why = category(target, f.kind, f.tensor, f.case)
    message = f.message if not why or why in f.message else f"{f.message} ({why})"
    logit = max_logit(f.case)
    known = known_report(target.name, f.kind, f.tensor, f.case)
    return dataclasses.replace(f, api=target.api, category=cat, max_logit=logit, known=known, message=message)


def _store_crash(
    target: Target, state: HuntState, outcome: Outcome, now: float, save: Callable[[], None], crashed: dict
) -> None:
    """A crash of a kind not stored yet: stored now (provisional, unshrunk), before anything else happens. Every
    crashing outcome is kept in `crashed` by its case's text: Hypothesis's shrinker reaches the same case again from
    other choices (7 times in 12 steps shrinking a hang), and a rerun would cost a restart, a hang its timeout."""
    crash = next((v for v in outcome.failures if v.kind == "crash"), None)
    if crash is None:
        return
    crashed[outcome.case.to_text()] = outcome
    state.crashes += 1
    if (crash.kind, crash.tensor) in {f.signature for f in state.findings}:
        return
    f = Finding("crash", crash.tensor, outcome.case, crash.where(), crash.message, now, now, state.examples, 1.0)
    state.findings.append(dataclasses.replace(annotated(target, f), provisional=True))
    save()


def _count(state: HuntState, outcome: Outcome) -> None:
    state.examples += 1
    if outcome.error is not None:
        state.refusals += 1
        if not state.first_error:
            state.first_error = [outcome.case.to_text(), outcome.error]
        if len(state.refusal_examples) < 5 and outcome.error not in state.refusal_examples:
            state.refusal_examples.append(outcome.error)
