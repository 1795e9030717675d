"""The commands' human-readable tables and lines (compare's simulator, gradient, decoding and backend tables;
print_whole for any table of plain cells), printed to the console (cli.app._console)."""

from __future__ import annotations

from flashcheck.cli.app import _console


def verdict_text(f: dict) -> str:
    """What a verdict line says after its id and status: the claim, then what was measured, as report.md words it."""
    return f"{f['claim']}. Measured: {f['measured']}" if f.get("claim") else f["measured"]


def sim_name(cfg) -> str:
    return f"splitkv S={cfg.splits}" if cfg.kernel == "splitkv" and cfg.splits else cfg.kernel


def _rule_line(results: list[dict]) -> str:
    """The budget rule of the results, short enough for an 80-column line: the peers' (k=2 forward, 3 gradients)
    or flashcheck's (calibrated k; rel_l2, bias and row checks)."""
    rules = {r["budget"].get("rule", "peers") for r in results if r.get("status") == "ok"}
    return "flashcheck's rule" if rules == {"flashcheck"} else "the peers' rule"


def not_run_line(r: dict) -> str:
    """'sdpa-cudnn bf16 L=32 on cpu: skipped, REASON' for a backend result that did not run (skipped or failed)."""
    c = r["config"]
    why = r["reason"] if r["status"] == "skipped" else r["reason"].splitlines()[0]
    return f"{c['label']} {c['numerics']} L={c['seq_len']} on {c['device']}: {r['status']}, {why}"


def print_backends(results: list[dict]) -> None:
    """The results' table (none when every case was skipped or failed), then one line per case not run."""
    from rich.markup import escape

    console = _console()
    cols = ("backend", "device", "fmt", "L", "rel_l2", "max_abs", "baseline", "ratio", "budget", "kernel ran", "checks")
    rows, skipped = [], []
    for r in results:
        c = r["config"]
        if r["status"] != "ok":
            skipped.append(not_run_line(r))
            continue
        # public op names only (aten::...), not an autograd Function's class name (_FlashFunction, _JaxAttention)
        ops = [o for o in r["kernel_ops"] if "::" in o and o != "aten::scaled_dot_product_attention"]
        ops = ops[0].replace("aten::", "") if ops else ""
        grads = " ".join(f"{k}:{'ok' if g['budget']['passed'] else 'FAIL'}" for k, g in r.get("grad", {}).items())
        det = r.get("determinism")
        if det:
            grads += f" det:{'ok' if det['forward_identical'] and det.get('backward_identical', True) else 'NO'}"
            grads += f" batch:{'ok' if det['batch_invariant'] else 'NO'}"
        rows.append(
            [
                c["label"],
                c.get("device", "cpu"),
                c["numerics"],
                str(c["seq_len"]),
                f"{r['candidate']['rel_l2']:.3e}",
                f"{r['candidate']['max_abs']:.3e}",
                r["baseline_impl"],
                f"{r['ratio']['max_abs']:.2f}",
                "pass" if r["budget"]["passed"] else "FAIL",
                ops,
                grads.strip(),
            ]
        )
    if rows:
        console.print(f"errors vs FP64; ratio = max_abs / baseline's; budget = {_rule_line(results)}")
        print_whole(console, cols, rows)
    ok = [r for r in results if r["status"] == "ok"]
    if len(ok) == 1:  # one case: every metric, as plain compare prints them
        _print_metrics(console, ok[0])
    for r in ok:
        if not r["budget"]["passed"]:
            console.print(escape(_why_failed(r)), soft_wrap=True)
    for line in skipped:
        console.print(escape(line))


PREDICTS_INSIDE = (
    "flashcheck predict predicts the error after the kernel's own input quantisation, which both columns here include: "
    "`flashcheck explain` shows that input stage apart"
)


def predicts_line(inside: str | None = None, columns: str = "the 'candidate' column adds") -> str:
    """Which error `flashcheck predict` predicts, under a table whose `columns` hold the error with the inputs'
    rounding. inside: the format a preset quantises Q, K, V to inside the kernel (in every column then)."""
    if inside:
        return f"this preset quantises its inputs inside the kernel ({inside}); " + PREDICTS_INSIDE
    return (
        "flashcheck predict predicts the rel_l2 of the column 'vs FP64 of rounded inputs' (the kernel's own error); "
        f"{columns} the rounding of the inputs"
    )


def quantised_inside(pol) -> str | None:
    """What pol quantises inside the kernel from 16-bit inputs (kernels.sim.quantized: Sage, NVFP4, MX presets), Q/K
    and V each as explain names them (measure.substages.inside_words), or None."""
    from flashcheck.measure.substages import inside_words

    return inside_words(pol)


def _preset_inside(r: dict) -> str | None:
    """quantised_inside of a result row's preset (None for other methods)."""
    cfg = r["config"]
    if not cfg.get("preset"):
        return None
    from flashcheck.kernels.sim.presets import resolve

    try:
        pol = resolve(cfg["preset"], cfg["numerics"], cfg["seq_len"], cfg["seq_len"], cfg["head_dim"], cfg["causal"])
    except (KeyError, ValueError, TypeError):
        return None
    return quantised_inside(pol["policy"])


ROUNDED_COLUMN = "vs FP64 of rounded inputs"  # the column predicts_line names


def _print_metrics(console, r: dict) -> None:
    """One result's metrics: candidate, baseline, ratio and the candidate vs FP64 of its rounded inputs."""
    cols = ("metric (vs FP64)", "candidate", "baseline", "ratio", ROUNDED_COLUMN)
    rounded = r["vs_rounded_inputs"]["candidate"]
    rows = [
        [m, f"{v:.3e}", f"{r['baseline'][m]:.3e}", f"{r['ratio'][m]:.3f}", f"{rounded[m]:.3e}"]
        for m, v in r["candidate"].items()
    ]
    print_whole(console, cols, rows)
    if all(rounded.get(m) == v for m, v in r["candidate"].items()):
        why = _why_not_rounded(r)
        console.print(f"{ROUNDED_COLUMN} equals the candidate: {why}", markup=False, soft_wrap=True)
        if r["config"]["numerics"].startswith("fp8"):  # the kernel's own quantisation is in both columns
            console.print(PREDICTS_INSIDE, soft_wrap=True)
            return
    console.print(predicts_line(_preset_inside(r)), soft_wrap=True)


def _why_not_rounded(r: dict) -> str:
    """Why the reference of the rounded inputs is the original inputs' (issue 34: an equal column, unexplained)."""
    fmt = r["config"]["numerics"]
    if fmt.startswith("fp64"):
        return f"{fmt} inputs are not rounded, so both references are the same"
    if fmt.startswith("fp8"):
        return (
            f"this method scales and quantises its {fmt} inputs inside the kernel, a step flashcheck does not "
            "repeat outside it, so that reference is the FP64 output of the original inputs"
        )
    return "the method sees its inputs unrounded, so both references are the same"


def _why_failed(r: dict) -> str:
    """One line: which budget check failed, its value and bound, and what the bound was built from."""
    b, c = r["budget"], r["config"]
    failed = "; ".join(f"{x['name']} {x['value']:.3e} > {x['bound']:.3e}" for x in b["checks"] if not x["passed"])
    line = (
        f"{c['label']} {c['numerics']} L={c['seq_len']} FAIL ({b['rule']} rule): {failed}; bound = k {b['k']:g} x "
        f"{r['baseline_impl']}'s error (max {r['baseline']['max_abs']:.3e}) + floor {b['floor']:.2e}"
    )
    if c.get("preset") and r["baseline_impl"].startswith("eager:"):
        line += (
            f"; preset {c['preset']} quantises inside the kernel below its input format {c['numerics']} (its Q, K "
            "or P), which eager does not: to judge it beside FP8 attention give --baseline-numerics baseline-fp8 "
            "(standard attention with per-tensor FP8 inputs), or another standard policy as the yardstick"
        )
    return line


def print_whole(console, cols: tuple[str, ...], rows: list[list[str]], prose: tuple[str, ...] = ()) -> None:
    """Rows of plain strings as a table whose every cell is whole: columns empty in every row dropped, no cell
    cut, none wrapped but the `prose` columns (at spaces, given at most 30 columns); where that table is wider
    than the console, one block per row (column: value) instead."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    keep = [i for i in range(len(cols)) if any(row[i] for row in rows)]
    cols, rows = [cols[i] for i in keep], [[row[i] or "-" for i in keep] for row in rows]
    widths = [max(len(col), *(len(row[i]) for row in rows)) for i, col in enumerate(cols)]
    need = [min(w, 30) if col in prose else w for col, w in zip(cols, widths, strict=True)]
    # boxed (a cell's padding 1 + 1 and a rule between cells), else unboxed (two spaces between cells)
    for style, extra in ((box.HEAVY_HEAD, 3 * len(cols) + 1), (None, 2 * len(cols) - 2)):
        if sum(need) + extra <= console.width:
            table = Table(box=style, pad_edge=style is not None)
            for col, w in zip(cols, need, strict=True):
                table.add_column(escape(col), no_wrap=col not in prose, min_width=w)
            for row in rows:
                table.add_row(*map(escape, row))
            console.print(table)
            return
    w = max(map(len, cols[1:]))
    for row in rows:
        console.print(escape(row[0]), soft_wrap=True)
        for col, cell in zip(cols[1:], row[1:], strict=True):
            console.print(escape(f"  {col:<{w}}  {cell}"), soft_wrap=True)


def _shape(cfg) -> str:
    """The inputs and kernel settings of a heading: B, H (Hkv), L (Lk), D, blocks, algorithm, mask, inputs."""
    s = cfg.inputs
    heads = f"H={s.heads}" + (f" Hkv={s.kv_heads}" if s.kv_heads else "")
    lens = f"L={s.seq_len}" + (f" Lk={s.seq_len_k}" if s.seq_len_k else "")
    pad = f" padding={s.padding}" if s.padding != "none" else ""
    return (
        f"B={s.batch} {heads} {lens} D={s.head_dim} blocks={cfg.block_q}x{cfg.block_k} {cfg.algorithm}"
        f"{' causal' if cfg.causal else ''}{pad} {s.distribution} seed={s.seed}"
    )


def _policy_label(pol, named: str | None = None) -> str:
    """A policy's name, with every knob a flag set apart from the named policy's own (hadamard, FP8 scaling,
    delta_source, ds_correction): they do not show in the name."""
    from flashcheck.core.numerics import parse_policy

    base = parse_policy(named) if named else None
    knobs = []
    if base is not None and pol.hadamard != base.hadamard:
        knobs.append("hadamard" if pol.hadamard else "no hadamard")
    if base is not None and pol.fp8_scaling != base.fp8_scaling:
        knobs.append(f"fp8_scaling={pol.fp8_scaling}")
    knobs += [f"delta_source={pol.delta_source}"] if pol.delta_source != "forward" else []
    knobs += ["ds_correction"] if pol.ds_correction else []
    return ", ".join([pol.name, *knobs])


def print_compare(cfg, result) -> None:
    from rich.markup import escape
    from rich.table import Table

    splits = f"S={cfg.case().method.splits} ({cfg.chunks()} chunks) " if cfg.kernel == "splitkv" else ""
    title = (
        f"{cfg.kernel} [{_policy_label(cfg.candidate_policy(), cfg.numerics)}] vs standard "
        f"[{_policy_label(cfg.baseline_policy())}]  "
        f"{splits}{_shape(cfg)}"
    )
    console = _console()
    console.print(escape(title))
    table = Table()
    for col in ("metric (vs FP64)", "candidate", "baseline", "ratio", "candidate vs FP64 of rounded inputs"):
        table.add_column(col, justify="right")
    for key, value in result.candidate.items():
        table.add_row(
            key,
            f"{value:.3e}",
            f"{result.baseline[key]:.3e}",
            f"{result.ratio[key]:.3f}",
            f"{result.candidate_rounded[key]:.3e}",
        )
    console.print(table)
    console.print(predicts_line(quantised_inside(cfg.candidate_policy())), soft_wrap=True)
    if cfg.inputs.padding != "none":
        console.print(escape(padding_counts(cfg.inputs, cfg.causal)))


def padding_counts(spec, causal: bool) -> str:
    """What a padded comparison counted: the keys each batch row keeps and the query rows with a visible key
    (the only rows in the errors), from the same mask the measurement uses."""
    import torch

    from flashcheck.core.inputs import make_mask

    mask = make_mask(spec)[:, 0]  # bool [B, Lq, Lk], as the measurement builds it (no L x L float bias here)
    keys = mask.any(dim=-2).sum(dim=-1).tolist()  # [B]: keys some query row sees
    rows = mask.any(dim=-1)
    if causal:  # bottom-right aligned: row i sees key j <= i + Lk - Lq, so its first kept key must be one of them
        first = mask.to(torch.uint8).argmax(dim=-1)
        rows &= first <= torch.arange(spec.seq_len) + (spec.lk - spec.seq_len)
    live, total = int(rows.sum()), spec.batch * spec.seq_len
    return (
        f"padding {spec.padding}: keys kept per batch row {', '.join(map(str, keys))} of {spec.lk}; errors over "
        f"{live} of {total} query rows (those that see a key: padded query positions see none), in each of the "
        f"{spec.heads} heads"
    )


def print_grads(cfg, result) -> None:
    """The gradients' table: per dQ, dK, dV the candidate's and the baseline's errors vs FP64 autograd."""
    from rich.markup import escape
    from rich.table import Table

    pol = cfg.candidate_policy()
    knobs = f"delta_source={pol.delta_source}, ds_correction={'on' if pol.ds_correction else 'off'}"
    console = _console()
    console.print(
        escape(f"gradients vs FP64 autograd through the reference (dO drawn from seed={cfg.inputs.seed}); {knobs}")
    )
    table = Table()
    cols = ("gradient", "candidate rel_l2", "baseline rel_l2", "ratio rel_l2", "candidate max_abs")
    for col in (*cols, "baseline max_abs", "ratio max_abs"):
        table.add_column(col, justify="right")
    for name, g in result.grad.items():
        cells = [f"{g[who][m]:.3e}" for m in ("rel_l2", "max_abs") for who in ("candidate", "baseline")]
        table.add_row(name, *cells[:2], f"{g['ratio']['rel_l2']:.3f}", *cells[2:], f"{g['ratio']['max_abs']:.3f}")
    console.print(table)


def print_decoding(cfgs: list, records: list) -> None:
    """The split-KV decoding table: standard (the baseline), flash, then splitkv at each S, errors vs FP64."""
    from rich.markup import escape
    from rich.table import Table

    flash, base = records[0], records[0].baseline
    s_list = ",".join(str(c.splits) for c in cfgs[1:])
    console = _console()
    console.print(
        escape(
            f"split-KV decoding S={s_list} and flash [{cfgs[0].candidate_policy().name}] vs standard "
            f"[{cfgs[0].baseline_policy().name}]  {_shape(cfgs[0])}"
        )
    )
    table = Table()
    cols = ("kernel (vs FP64)", "chunks", "max_abs", "rel_l2", "rel_l2 / standard's", "rel_l2 / flash's")
    for col in (*cols, "rel_l2 vs FP64 of rounded inputs"):
        table.add_column(col, justify="right")
    table.add_row("standard", "-", f"{base['max_abs']:.3e}", f"{base['rel_l2']:.3e}", "1.000", "-", "-")
    for cfg, rec in zip(cfgs, records, strict=True):
        c = rec.candidate
        table.add_row(
            escape(sim_name(cfg)),
            str(cfg.chunks() or "-"),
            f"{c['max_abs']:.3e}",
            f"{c['rel_l2']:.3e}",
            f"{rec.ratio['rel_l2']:.3f}",
            f"{c['rel_l2'] / flash.candidate['rel_l2']:.3f}" if flash.candidate["rel_l2"] else "-",
            f"{rec.candidate_rounded['rel_l2']:.3e}",
        )
    console.print(table)
    console.print(
        predicts_line(quantised_inside(cfgs[0].candidate_policy()), "the max_abs and rel_l2 columns add"),
        soft_wrap=True,
    )
