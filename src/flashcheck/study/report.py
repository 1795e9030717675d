"""The study report, built from stored records only: findings, figures, report.md/html, summary.json."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from flashcheck.measure.method import baseline_name
from flashcheck.reporting import Bullets, Figure, Heading, Page, Table, Text, write_report
from flashcheck.study.cases import Case, CaseRecord, expand_sweep
from flashcheck.study.config import FA3_PAPER_RMSE, StudyConfig, Sweep
from flashcheck.study.store import ResultStore, read_jsonl, read_study_json

MAX_LISTED = 100  # failed cases listed in summary.json and the reports (all are in records.jsonl)


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a sweep: a method at one setting, over seeds (mean and std of metric and ratio)."""

    method: str
    seq_len: int
    head_dim: int
    block: tuple[int, int]
    distribution: str
    mean: float
    std: float
    ratio: float | None
    ratio_std: float | None
    n: int

    @property
    def label(self) -> str:
        return f"{self.block[0]}x{self.block[1]}" if self.block != (0, 0) else "-"


def _stats(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.pstdev(xs)) if xs else (float("nan"), float("nan"))


def sweep_points(sw: Sweep, records: dict[str, CaseRecord]) -> list[Point]:
    """Aggregate a sweep's ok records over seeds; each point carries the ratio to its baseline by the one rule
    (standard attention under the same policy; eager PyTorch at FMT for a backend)."""
    by_key: dict[tuple, list[CaseRecord]] = {}
    by_method: dict[tuple, CaseRecord] = {}
    for c in expand_sweep(sw):
        rec = records.get(c.case_id)
        if rec is None or rec.status != "ok":
            continue
        if c.kernel == "standard" or c.kernel == "eager":
            by_method[(c.method, c.input_key)] = rec
        by_key.setdefault((c.method, c.seq_len, c.head_dim, (c.block_q, c.block_k), c.distribution), []).append(rec)
    points = []
    for (method, length, d, block, dist), recs in by_key.items():
        vals = [r.errors[sw.metric] for r in recs]
        ratios = []
        for r in recs:
            base = by_method.get((baseline_name(r.case.method), r.case.input_key))
            if base is not None and base is not r and base.errors[sw.metric] > 0:
                ratios.append(r.errors[sw.metric] / base.errors[sw.metric])
        mean, std = _stats(vals)
        rmean, rstd = _stats(ratios) if ratios else (None, None)
        points.append(Point(method, length, d, block, dist, mean, std, rmean, rstd, len(recs)))
    return points


def _find(points: list[Point], method: str, **where) -> list[Point]:
    return [p for p in points if p.method == method and all(getattr(p, k) == v for k, v in where.items())]


def _finding(fid: str, claim: str, measured: str, holds: bool | None, paper: str | None = None) -> dict:
    return {"id": fid, "claim": claim, "measured": measured, "holds": holds, "paper": paper}


NOT_MEASURED = "not measured in this study"


def findings(config: StudyConfig, records: dict[str, CaseRecord]) -> list[dict]:
    """The verdicts: the seed paper's five findings and FA3's two, from whatever the study measured."""
    pts = {sw.question: sweep_points(sw, records) for sw in config.sweeps}
    return [*_length_findings(pts), *_tile_findings(pts), *_fa3_findings(pts.get("fa3", []))]


def _length_findings(pts: dict[str, list[Point]]) -> list[dict]:
    """Flash vs Baseline at BF16, and its growth with the sequence length."""
    out, nm = [], NOT_MEASURED
    sl = [p for p in pts.get("seq_len", []) if p.method == "flash:bf16" and p.ratio is not None]
    sl.sort(key=lambda p: p.seq_len)
    if sl:
        top = sl[-1]
        mixed = _find(pts["seq_len"], "flash:bf16-mixed", seq_len=top.seq_len)
        mtxt = f"; bf16-mixed {mixed[0].ratio:.2f}x" if mixed and mixed[0].ratio is not None else ""
        out.append(
            _finding(
                "flash_vs_baseline_bf16",
                "At BF16, Flash Attention deviates more than Baseline (max|O - O_fp64|)",
                f"{top.ratio:.2f}x at L={top.seq_len}, tiles {top.label}, uniform bf16{mtxt}",
                top.ratio > 1,
                "about 10x",
            )
        )
        out.append(
            _finding(
                "grows_with_seq_len",
                "The Flash/Baseline ratio grows with sequence length",
                f"{sl[0].ratio:.2f}x at L={sl[0].seq_len} -> {top.ratio:.2f}x at L={top.seq_len}",
                top.ratio > sl[0].ratio if len(sl) > 1 else None,
                "grows",
            )
        )
        return out
    return [
        _finding("flash_vs_baseline_bf16", "At BF16 Flash deviates more than Baseline", nm, None),
        _finding("grows_with_seq_len", "The ratio grows with sequence length", nm, None),
    ]


def _tile_findings(pts: dict[str, list[Point]]) -> list[dict]:
    """Block area, swapped block dimensions, square vs rectangular tiles."""
    out, nm = [], NOT_MEASURED
    ba = [p for p in pts.get("block_area", []) if p.method == "flash:bf16" and p.ratio is not None]
    ba.sort(key=lambda p: p.block[0] * p.block[1])
    out.append(
        _finding(
            "shrinks_with_block_area",
            "Larger tiles give less deviation",
            f"{ba[0].ratio:.2f}x at {ba[0].label} -> {ba[-1].ratio:.2f}x at {ba[-1].label}" if ba else nm,
            ba[0].ratio > ba[-1].ratio if len(ba) > 1 else None,
            "shrinks",
        )
    )

    sw = {p.block: p for p in pts.get("swapped", []) if p.method == "flash:bf16" and p.ratio is not None}
    if len(sw) == 2:
        p1, p2 = sorted(sw.values(), key=lambda p: p.block[0] > p.block[1])  # Br < Bc first, then swapped
        out.append(
            _finding(
                "swapped_blocks",
                "Swapping Br x Bc to Bc x Br (fewer keys per tile) deviates more",
                f"{p1.ratio:.2f}x at {p1.label} vs {p2.ratio:.2f}x swapped to {p2.label}",
                p2.ratio > p1.ratio,
                "more",
            )
        )
    else:
        out.append(_finding("swapped_blocks", "Swapping the block dimensions deviates more", nm, None))

    sq = [p for p in pts.get("square", []) if p.method == "flash:bf16" and p.ratio is not None]
    square = [p for p in sq if p.block[0] == p.block[1]]
    rect = [p for p in sq if p.block[0] != p.block[1]]
    if square and rect:
        lo, hi = min(p.ratio for p in rect), max(p.ratio for p in rect)
        s = square[0]
        out.append(
            _finding(
                "square_tiles",
                "Square tiles change nothing beyond their area: a square tile's ratio "
                "lies within those of the rectangles of the same area",
                f"{s.ratio:.2f}x at {s.label}; rectangles {lo:.2f}x-{hi:.2f}x "
                f"({', '.join(f'{p.label} {p.ratio:.2f}x' for p in rect)})",
                lo * 0.9 <= s.ratio <= hi * 1.1,
                "no change",
            )
        )
    else:
        out.append(_finding("square_tiles", "Square tiles change nothing", nm, None))
    return out


def _fa3_mean(points: list[Point], method: str) -> float | None:
    vals = [p.mean for p in points if p.method == method]
    return statistics.fmean(vals) if vals else None


def _fa3_findings(points: list[Point]) -> list[dict]:
    pairs = [
        (
            "fa3_fp16",
            "FA2 FP16 (fp32 softmax) has lower RMSE than Baseline FP16 (fp16 softmax)",
            "flash:fp16-mixed",
            "standard:fp16",
        ),
        (
            "fa3_fp8",
            "FA3 FP8 (block quantisation + Hadamard) has lower RMSE than Baseline FP8 (per tensor)",
            "flash:fa3-fp8",
            "standard:baseline-fp8",
        ),
    ]
    out = []
    for fid, claim, cand, base in pairs:
        a, b = _fa3_mean(points, cand), _fa3_mean(points, base)
        paper = f"{FA3_PAPER_RMSE[cand]:.1e} vs {FA3_PAPER_RMSE[base]:.1e}"
        if a is None or b is None:
            out.append(_finding(fid, claim, "not measured in this study", None, paper))
        else:
            out.append(_finding(fid, claim, f"{a:.2e} vs {b:.2e} ({b / a:.2f}x lower)", a < b, paper))
    return out


# --- figures --------------------------------------------------------------------------------------


def _x_axis(sw: Sweep) -> str:
    if len(sw.seq_lens) > 1:
        return "seq_len"
    if len(sw.blocks) > 1:
        return "block"
    if len(sw.head_dims) > 1:
        return "head_dim"
    return "policy"


def draw_figures(config: StudyConfig, records: dict[str, CaseRecord], folder: Path) -> dict[str, Path]:
    """One PNG per question; {} when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for sw in config.sweeps:
        points = sweep_points(sw, records)
        if not points:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        if sw.question == "fa3":
            _draw_fa3(axes, points, sw)
        else:
            _draw_sweep(axes, points, sw)
        fig.suptitle(f"{sw.question}: {sw.metric} vs FP64 ({sw.distributions[0]} inputs, {len(sw.seeds)} seed(s))")
        fig.tight_layout()
        path = folder / f"{sw.question}.png"
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        paths[sw.question] = path
    return paths


def _draw_sweep(axes, points: list[Point], sw: Sweep) -> None:
    x = _x_axis(sw)
    methods = list(dict.fromkeys(p.method for p in points))
    if x == "policy":
        policies = list(dict.fromkeys(p.method.split(":", 1)[1] for p in points))
        kernels = list(dict.fromkeys(p.method.split(":", 1)[0] for p in points))
        width = 0.8 / len(kernels)
        for i, kernel in enumerate(kernels):
            ys = [next((p.mean for p in points if p.method == f"{kernel}:{pol}"), float("nan")) for pol in policies]
            axes[0].bar([j + width * i for j in range(len(policies))], ys, width=width, label=kernel)
            rs = [next((p.ratio for p in points if p.method == f"{kernel}:{pol}"), None) for pol in policies]
            if any(r is not None for r in rs):
                xs = [j + width * i for j in range(len(policies))]
                axes[1].bar(xs, [float("nan") if r is None else r for r in rs], width=width, label=kernel)
        for ax in axes:
            ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right")
    else:
        for m in methods:
            ps = [p for p in points if p.method == m]
            ps.sort(key=lambda p: _xval(p, x))
            xs = [_xval(p, x) for p in ps]
            axes[0].errorbar(xs, [p.mean for p in ps], yerr=[p.std for p in ps], marker="o", label=m, capsize=3)
            if any(p.ratio is not None for p in ps):  # baselines (standard, eager) have no ratio
                axes[1].errorbar(
                    xs, [p.ratio for p in ps], yerr=[p.ratio_std for p in ps], marker="o", label=m, capsize=3
                )
        for ax in axes:
            ax.set_xscale("log", base=2)
            if x == "block":
                labels = sorted(
                    {(p.block, p.label) for p in points if p.block != (0, 0)}, key=lambda t: t[0][0] * t[0][1]
                )
                ax.set_xticks([b[0] * b[1] for b, _ in labels], [lab for _, lab in labels], rotation=30)
            ax.set_xlabel({"seq_len": "sequence length", "block": "tile Br x Bc (by area)", "head_dim": "head dim"}[x])
        _standard_lines(axes[0], points, x)
    axes[0].set_yscale("log")
    axes[0].set_ylabel(sw.metric)
    axes[0].legend(fontsize=7)
    axes[1].axhline(1.0, color="gray", lw=0.8)
    axes[1].set_ylabel("ratio to baseline (one rule)")
    axes[1].legend(fontsize=7) if axes[1].get_legend_handles_labels()[0] else None


def _standard_lines(ax, points: list[Point], x: str) -> None:
    if x != "block":
        return
    for p in points:
        if p.method.startswith("standard:"):
            ax.axhline(p.mean, ls="--", lw=0.8, color="gray")


def _xval(p: Point, x: str) -> float:
    return {"seq_len": p.seq_len, "head_dim": p.head_dim, "block": p.block[0] * p.block[1]}[x]


def _draw_fa3(axes, points: list[Point], sw: Sweep) -> None:
    methods = list(sw.methods)
    ours = [_fa3_mean(points, m) or float("nan") for m in methods]
    paper = [FA3_PAPER_RMSE.get(m, float("nan")) for m in methods]
    idx = range(len(methods))
    axes[0].bar([i - 0.2 for i in idx], ours, width=0.4, label="flashcheck (mean over L, D, seeds)")
    axes[0].bar([i + 0.2 for i in idx], paper, width=0.4, label="FA3 paper, Table 3")
    axes[0].set_yscale("log")
    axes[0].set_xticks(list(idx), methods, rotation=30, ha="right", fontsize=7)
    axes[0].set_ylabel("RMSE")
    axes[0].legend(fontsize=7)
    for m in methods:
        ps = sorted((p for p in points if p.method == m), key=lambda p: (p.head_dim, p.seq_len))
        for d in sorted({p.head_dim for p in ps}):
            pd = [p for p in ps if p.head_dim == d]
            axes[1].plot([p.seq_len for p in pd], [p.mean for p in pd], marker="o", label=f"{m} D={d}")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("sequence length")
    axes[1].set_ylabel("RMSE")
    axes[1].legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left")


# --- documents ------------------------------------------------------------------------------------


def _tables(config: StudyConfig, records: dict[str, CaseRecord]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    for sw in config.sweeps:
        rows = []
        for p in sorted(sweep_points(sw, records), key=lambda p: (p.method, p.head_dim, p.seq_len, p.block)):
            ratio = "" if p.ratio is None else f"{p.ratio:.2f} ± {p.ratio_std:.2f} (÷ {baseline_name(p.method)})"
            paper = f"{FA3_PAPER_RMSE[p.method]:.1e}" if sw.question == "fa3" and p.method in FA3_PAPER_RMSE else ""
            rows.append(
                [
                    p.method,
                    str(p.seq_len),
                    str(p.head_dim),
                    p.label,
                    f"{p.mean:.3e} ± {p.std:.1e}",
                    ratio,
                    paper,
                ]
            )
        out.append(
            (
                sw.question,
                ["method", "L", "D", "tiles", f"{sw.metric} (mean ± std)", "ratio to baseline", "paper"],
                rows,
            )
        )
    return out


def _load_config(folder: Path) -> StudyConfig:
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder; give the --out folder of `flashcheck study`")
    data = read_study_json(folder)
    if data is None:
        raise ValueError(f"{str(folder)!r} holds no study (no study.json); run `flashcheck study --out` first")
    return StudyConfig.from_dict(data, str(folder / "study.json"))


def case_label(c: Case) -> str:
    """One line naming a case: method, sizes, tiles, inputs, seed."""
    tiles = f" tiles {c.block_q}x{c.block_k}" if c.block_q else ""
    return f"{c.method} L={c.seq_len} D={c.head_dim}{tiles} {c.distribution} seed {c.seed}"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _problems(records: dict[str, CaseRecord]) -> tuple[list[dict], list[dict]]:
    """Failed cases one by one, and skipped cases grouped by method and reason."""
    failures = [
        {"case_id": r.case_id, "method": r.case.method, "case": case_label(r.case), "error": (r.error or "")[:500]}
        for r in records.values()
        if r.status == "failed"
    ]
    groups: dict[tuple[str, str], int] = {}
    for r in records.values():
        if r.status == "skipped":
            key = (r.case.method, _first_line(r.error))
            groups[key] = groups.get(key, 0) + 1
    skipped = [{"method": m, "reason": why, "cases": n} for (m, why), n in groups.items()]
    return failures, skipped


def build_report(folder: str | Path) -> dict:
    """Rebuild figures, report.md, report.html and summary.json in `folder` from its stored records.
    Computes nothing and never changes the store (records.jsonl, runs.jsonl, study.json)."""
    if not str(folder).strip():
        raise ValueError(f"folder {str(folder)!r} is empty; give a study folder (the --out of `flashcheck study`)")
    folder = Path(folder)
    config = _load_config(folder)
    records = ResultStore(folder).load()
    ok = {k: r for k, r in records.items() if r.status == "ok"}
    failures, skipped = _problems(records)
    found = findings(config, ok)
    figures = draw_figures(config, ok, folder / "figures")
    env = next(iter(records.values())).env if records else {}
    summary = {
        "study": config.name,
        "findings": found,
        "cases": len(records),
        "failed": len(failures),
        "skipped": skipped,
        "failures": failures[:MAX_LISTED],
        "runs": [run for _, run in read_jsonl(folder / "runs.jsonl", "runs")],
        "environment": env,
        "figures": {q: str(p.relative_to(folder)) for q, p in figures.items()},
    }
    tables = _tables(config, ok)
    inside = {q: p.relative_to(folder) for q, p in figures.items()}  # the page resolves them in `folder`
    write_report(folder, _page(summary, tables, inside), summary)
    return summary


def _problem_rows(summary: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for the failed and the skipped cases, when there are any."""
    out = []
    if summary["failures"]:
        more = summary["failed"] - len(summary["failures"])
        title = f"Failed cases ({summary['failed']}{f', the first {MAX_LISTED} listed' if more > 0 else ''})"
        rows = [[f["case"], _first_line(f["error"])] for f in summary["failures"]]
        out.append((title, ["case", "error (the traceback is in records.jsonl)"], rows))
    if summary["skipped"]:
        rows = [[s["method"], str(s["cases"]), s["reason"]] for s in summary["skipped"]]
        out.append(("Skipped cases", ["method", "cases", "reason"], rows))
    return out


def _page(summary: dict, tables, figures: dict[str, Path]) -> Page:
    """The study report as a reporting.Page: verdicts, failed/skipped cases, one section per question."""
    page = Page(f"flashcheck study {summary['study']}: is Flash Attention stable?")
    items = []
    for f in summary["findings"]:
        paper = f" (paper: {f['paper']})" if f.get("paper") else ""
        items.append((f["id"], f["holds"], f"{f['claim']}. Measured: {f['measured']}{paper}."))
    page.add(Heading("Verdicts"), Bullets(items))
    if not figures:
        page.add(Text("No figures: matplotlib is not installed (pip install 'flashcheck[plots]')."))
    page.add(
        Text(
            f"{summary['cases']} cases, {summary['failed']} failed. Errors are against an FP64 reference; the "
            "ratio is to the method's baseline by the one rule (standard attention under the same policy for a "
            "simulator, eager PyTorch in the same dtype for a real backend) on the same inputs, mean ± std over "
            "seeds."
        )
    )
    for title, header, rows in _problem_rows(summary):
        page.add(Heading(title), Table(header, rows))
    for question, header, rows in tables:
        page.add(Heading(question))
        if question in figures:
            page.add(Figure(figures[question], question))
        page.add(Table(header, rows))
    env = summary.get("environment", {})
    return page.add(Heading("Environment"), Text(", ".join(f"{k} {v}" for k, v in env.items())))
