"""`flashcheck hunt TARGET`: search the inputs that break an attention kernel (flashcheck.hunt)."""

from __future__ import annotations

import json
import re
import sys
import time

import typer

from flashcheck.cli.app import _console, _fail_usage, _not_others, _out_folder, _seed, _starting, app
from flashcheck.core.fileio import LinkRefused

TARGET_HELP = (
    "A backend (sdpa-flash, sdpa-math, jax-xla, onnxruntime:fp16, ...; NAME:FMT for one dtype), a simulator "
    "preset (torch-cpu-flash, fa2-gpu, ...) or a callable package.module:function taking (q, k, v, *, causal, "
    "scale, mask[, sink]) in [B, H, L, D]."
)
BUDGET_HELP = "Time budget: seconds, or a number with s, m or h (5m). A resumed hunt spends what is left of it."
UPSTREAM_HELP = (
    "Also write, per finding a maintainer would take (kernel-bug, crash, hang), a standalone reproducer that imports "
    "only the target's library and numpy (exit 1 while the bug is there, 0 once fixed), and report.md, into this "
    "folder (new, or one a previous --upstream wrote)."
)
MAX_BUDGET_S = 7 * 24 * 3600
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*$")


def parse_budget(text: str, flag: str = "--budget") -> float:
    """'90', '90s', '5m', '1.5h' -> seconds; ValueError names the flag, the value and what is allowed."""
    m = _BUDGET.match(str(text))
    seconds = float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]] if m else 0.0
    if not seconds > 0:
        raise ValueError(f"{flag} {text!r} is not allowed; give a positive time such as 90s, 5m or 1h")
    if seconds > MAX_BUDGET_S:
        raise ValueError(f"{flag} {text!r} is not allowed; give at most 7 days ({MAX_BUDGET_S // 3600}h)")
    return seconds


def default_folder(target: str) -> str:
    """hunt's --out when none is given: flashcheck-hunt-TARGET with ':' as '-' (flashcheck-hunt-sdpa-math-bf16),
    so that hunting another target needs no --out; flashcheck-hunt for a name no folder name can carry."""
    name = target.strip().replace(":", "-")
    return f"flashcheck-hunt-{name}" if re.fullmatch(r"[\w.+-]+", name) else "flashcheck-hunt"


@app.command()
def hunt(
    target: str = typer.Argument(..., help=TARGET_HELP),
    budget: str = typer.Option("5m", help=BUDGET_HELP),
    out: str = typer.Option(
        None,
        help="Folder of the findings store, summary.json and report.md (default: flashcheck-hunt-TARGET, "
        "':' as '-', so that each target resumes its own hunt).",
    ),
    seed: int = typer.Option(
        None, callback=_seed, help="Seed of Hypothesis's search (round i uses SEED + i; default: random)."
    ),
    device: str = typer.Option("cpu", help="cpu or cuda: where the target runs (the FP64 reference: cpu)."),
    rule: str = typer.Option("peers", help="Budget rule: peers (max and mean error, NaN/Inf) or flashcheck."),
    rounds: int = typer.Option(
        None, help="Stop after N rounds of 40 cases too (with --seed: the same cases anywhere)."
    ),
    forward_only: bool = typer.Option(False, "--forward-only", help="Judge outputs only, no dQ, dK, dV."),
    case_timeout: str = typer.Option(
        "120s",
        help="A case a backend or callable gives no answer to in this long is a hang finding (its worker is "
        "killed); seconds, or a number with s, m or h.",
    ),
    upstream: str = typer.Option(None, help=UPSTREAM_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json's content."),
) -> None:
    """Search the inputs that break an attention kernel: tile-boundary lengths, masks and fully masked rows,
    sinks, extreme log-sum-exps, overflow; each finding shrunk, with a one-line reproducer."""
    out = default_folder(target) if out is None else out
    try:
        seconds = parse_budget(budget)
        case_s = parse_budget(case_timeout, "--case-timeout")
        _check_rule_rounds(rule, rounds)
        _starting(f"hunt: searching the inputs that break {target} for up to {budget} into {out} (stopped early, "
                  "the same command resumes it)")  # fmt: skip
        tgt, folder, up = _checked_folders(target, device, out, upstream)
        _need_hypothesis()
    except ValueError as exc:
        _fail_usage(str(exc))
    from flashcheck.hunt.isolate import TargetLoadFailed

    start = time.monotonic()
    try:
        summary = _run(tgt, folder, (seconds, case_s), (seed, rounds), rule, not forward_only, as_json)
        if upstream is not None:
            summary["upstream"] = _upstream(tgt, folder, up, rule, case_s)
    except (LinkRefused, TargetLoadFailed) as exc:  # a link made in --out during the run; a target that cannot load
        _fail_usage(str(exc))
    except KeyboardInterrupt:
        typer.echo(f"interrupted after {time.monotonic() - start:.0f} s; rerun the same command to resume", err=True)
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _print(summary, folder)
    raise typer.Exit(0 if summary["passed"] else 1)


def _checked_folders(target: str, device: str, out: str, upstream: str | None):
    """(the target, named only; the --out folder; the --upstream folder or None), each checked before any work:
    ValueError, one line."""
    from flashcheck.hunt.search import HuntState, check_links
    from flashcheck.hunt.target import parse_target

    folder = _out_folder(out)
    check_links(folder)  # a linked findings/, summary.json, ... in --out: refused before any work
    _not_others(folder, "hunt", {"target", "kind", "rule", "budget_s"})  # not a study's summary.json
    tgt = parse_target(target, device, load=False)  # a callable's module: imported in the worker only
    HuntState.load(folder, tgt)  # another target's store in --out: refused before any work
    if upstream is None:
        return tgt, folder, None
    from flashcheck.hunt.upstream import check_folder

    return tgt, folder, check_folder(upstream, tgt)


def _check_rule_rounds(rule: str, rounds: int | None) -> None:
    """ValueError naming --rule or --rounds when it is not allowed."""
    if rule not in ("peers", "flashcheck"):
        raise ValueError(f"--rule {rule!r} is not allowed; expected peers or flashcheck")
    if rounds is not None and rounds < 1:
        raise ValueError(f"--rounds {rounds} is not allowed; give a positive integer")


def _need_hypothesis() -> None:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ValueError(
            "flashcheck hunt needs Hypothesis, a dependency of flashcheck that is missing here: "
            "pip install -c constraints.txt hypothesis"
        ) from None


def _run(tgt, folder, times: tuple, seeded: tuple, rule: str, backward: bool, as_json: bool) -> dict:
    """The semantics table, then the search with progress on stderr (seconds of the budget), then the report.
    times: (the budget, the case timeout) in seconds."""

    from flashcheck.core.progress import progress
    from flashcheck.hunt import report
    from flashcheck.hunt.search import hunt as run_hunt

    seconds, case_s = times
    quiet = as_json and not sys.stderr.isatty()
    table = _semantics(tgt, folder, case_s, quiet)
    total = max(1, round(seconds))
    with progress(total, f"hunt {tgt.name}, budget seconds", quiet=quiet) as advance:  # not a case count
        shown = {"s": 0, "t": time.monotonic()}

        def step(state, note: str) -> None:
            now = min(total, int(state.elapsed_s if "round" in note else time.monotonic() - start))
            advance(max(0, now - shown["s"]), note=f"{state.examples} cases, {len(state.findings)} found; {note}")
            shown["s"] = max(shown["s"], now)

        start = time.monotonic()
        seed, rounds = seeded
        state = run_hunt(
            tgt,
            folder,
            budget_s=seconds,
            seed=seed,
            rule=rule,
            backward=backward,
            rounds=rounds,
            on_step=step,
            case_timeout_s=case_s,
        )
    return report.write(folder, tgt, state, table, seconds, rule)


def _semantics(tgt, folder, case_s: float, quiet: bool) -> list:
    """The target built in its worker (TargetLoadFailed: one line), then the semantics probes, each under the case
    timeout, with progress on stderr."""
    from flashcheck.core.fileio import make_folder
    from flashcheck.core.progress import progress
    from flashcheck.hunt.isolate import IsolatedTarget, isolates
    from flashcheck.hunt.search import STDERR
    from flashcheck.hunt.semantics import probe_cases, semantics_table

    make_folder(folder, "the --out folder")
    label = f"semantics probes of {tgt.name}"
    with (
        progress(len(probe_cases("fp32")), label, quiet=quiet) as advance,
        IsolatedTarget(tgt, folder / STDERR, case_s, lambda s: advance(0, note=f"a probe running for {s:.0f} s")) as w,
    ):
        if isolates(tgt):
            w.load()
        return semantics_table(tgt, worker=w, on_probe=lambda p: advance(1, note=f"{p.name}: {p.returned}"))


def _upstream(tgt, folder, up, rule: str, case_s: float) -> list[dict]:
    """The reproducers of the stored findings (hunt.upstream), each finding's budget recomputed on its case in the
    worker; [{finding, script, exit}]."""
    import math

    from flashcheck.hunt.isolate import IsolatedTarget
    from flashcheck.hunt.judge import evaluate
    from flashcheck.hunt.search import STDERR
    from flashcheck.hunt.store import HuntState
    from flashcheck.hunt.upstream import write

    state = HuntState.load(folder, tgt)
    with IsolatedTarget(tgt, folder / STDERR, case_s) as w:

        def bounds(f):
            verdicts = evaluate(tgt, f.case, rule, run=w.outputs).verdicts
            return next((v.bounds for v in verdicts if v.tensor == f.tensor), (math.nan, math.nan))

        done = write(up, tgt, state.findings, bounds)
    return [
        {
            "finding": i,
            "script": str(d["path"]) if "path" in d else None,
            "exit": d.get("exit"),
            "note": d.get("skipped"),
        }
        for i, d in enumerate(done, 1)
    ]


def _print(summary: dict, folder) -> None:
    from rich.markup import escape

    from flashcheck.cli.show import print_whole
    from flashcheck.hunt.report import FINDING_HEADER, SEMANTICS_HEADER, finding_notes, finding_rows, headline

    console = _console()
    console.print(escape(headline(summary)))
    rows = finding_rows(summary["findings"])
    if rows:
        print_whole(console, tuple(FINDING_HEADER), rows)
        for f in summary["findings"]:
            for note in finding_notes(f):
                console.print(escape(note), soft_wrap=True)
            console.print(f"rerun: {escape(f['reproducer'])}", soft_wrap=True)
    sem = [
        [
            p["probe"],
            p["returned"],
            p["convention"],
            {True: "agrees", False: "DISAGREES", None: "not measured"}[p["agrees"]],
        ]
        for p in summary["semantics"]
    ]
    print_whole(console, tuple(SEMANTICS_HEADER), sem)
    if summary.get("crashes"):
        console.print(f"{summary['crashes']} cases killed the target's process; the hunt went on with a fresh worker")
    if summary["refusals"]:
        console.print(
            escape(f"{summary['refusals']} cases refused by the target, e.g. {summary['refusal_examples'][0]}")
        )
    for u in summary.get("upstream", []):
        said = f"exit {u['exit']}" if u["script"] else u["note"]
        console.print(
            escape(f"upstream: finding {u['finding']}: {u['script'] or 'no reproducer'} ({said})"), soft_wrap=True
        )
    verdict = "PASS: nothing found" if summary["passed"] else "FAIL: see the findings"
    console.print(f"{verdict}; report: {escape(str(folder / 'report.md'))}")


def rerun_case(target: str | None, case: str, device: str | None, as_json: bool) -> None:
    """`flashcheck compare --backend TARGET --case TEXT`: one hunted case judged again; exit 0, 1 or 2."""
    try:
        if not target:
            raise ValueError("--case needs --backend: the hunt TARGET to rerun it on")
        from flashcheck.hunt.case import parse_case
        from flashcheck.hunt.target import parse_target

        tgt, hc = parse_target(target, device or "cpu", load=False), parse_case(case)
        if hc.dtype not in tgt.dtypes:
            raise ValueError(f"--case dtype={hc.dtype}: {target} takes {', '.join(tgt.dtypes)}")
        if hc.backward and not tgt.backward:
            raise ValueError(f"--case backward=1: {target} is judged forward only; give backward=0")
        _check_case_fits(hc, tgt.backward)
    except ValueError as exc:
        _fail_usage(str(exc))
    from flashcheck.hunt.isolate import TargetLoadFailed

    try:
        outcome = _evaluate_isolated(tgt, hc)
    except TargetLoadFailed as exc:
        _fail_usage(str(exc))
    if as_json:
        d = {"target": tgt.name, "case": hc.to_text(), "error": outcome.error, "passed": outcome.passed}
        typer.echo(json.dumps(d | {"verdicts": [v.to_dict() for v in outcome.verdicts]}, indent=2))
    else:
        _print_case(tgt.name, hc, outcome)
    raise typer.Exit(0 if outcome.passed else 1)


def _evaluate_isolated(tgt, hc):
    """evaluate(tgt, hc), the target run in a worker when it may kill its process: a crash is a verdict."""
    import tempfile
    from pathlib import Path

    from flashcheck.hunt.isolate import CASE_TIMEOUT_S, IsolatedTarget, isolates
    from flashcheck.hunt.judge import evaluate

    if not isolates(tgt):
        return evaluate(tgt, hc)
    with (
        tempfile.TemporaryDirectory(prefix="flashcheck-case-") as tmp,
        IsolatedTarget(tgt, Path(tmp) / "stderr", CASE_TIMEOUT_S) as w,
    ):
        w.load()  # a callable's module imported in the worker: an import that fails is one line
        return evaluate(tgt, hc, run=w.outputs)


def _check_case_fits(hc, backward: bool) -> None:
    """InsufficientMemory (a ValueError, one line) when the case's sizes cannot fit here, as --seq-len's check."""
    from flashcheck.kernels.sim.memory import Footprint, check_fits

    heads = max(hc.heads, hc.kv_heads)
    fp = Footprint(batch=hc.batch, heads=heads, seq_len=hc.lq, head_dim=hc.head_dim, seq_len_k=hc.lk, backward=backward)
    check_fits(fp)


def _print_case(name: str, hc, outcome) -> None:
    from rich.markup import escape

    from flashcheck.cli.show import print_whole

    console = _console()
    console.print(escape(f"{name} on {hc.describe()} (peers' rule, FP64 reference)"))
    if outcome.error is not None:
        console.print(escape(f"FAIL: the target raised {outcome.error}"))
        return
    crash = next((v for v in outcome.failures if v.kind == "crash"), None)
    if crash is not None:  # run in a worker: the process that died was the worker's, not this one
        if crash.tensor == "hang":
            console.print(escape(f"FAIL: the target hung: {crash.message}"))
        else:
            console.print(escape(f"FAIL: the target crashed: {crash.where()}; its stderr said: {crash.message}"))
        return
    rows = [
        [v.tensor, "ok" if v.passed else "FAIL", "" if v.passed else v.where(), v.message] for v in outcome.verdicts
    ]
    print_whole(console, ("tensor", "verdict", "where", "failed checks"), rows, prose=("failed checks",))
    console.print("PASS" if outcome.passed else "FAIL: " + escape("; ".join(v.where() for v in outcome.failures)))
