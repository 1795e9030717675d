"""The production guide preset (questions.guide): the fp16 overflow boundaries its searches find, pinned by closed
forms; cost and memory measurements; a small guide run end to end, resumed, reported and printed."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from tests.helpers import audited_figures
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.numerics import Format, round_to
from flashcheck.questions.guide import measure as gm
from flashcheck.questions.guide.presets import errors_sweep as _guide_sweep
from flashcheck.questions.guide.report import build_guide_report
from flashcheck.questions.guide.tasks import (
    GUIDE_FILE,
    GUIDE_PRESETS,
    GuideSettings,
    load_results,
    read_settings,
    run_guide_tasks,
)
from flashcheck.study.config import StudyConfig
from flashcheck.study.runner import run_study

pytestmark = pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules

FP16_INF_FROM = 65520.0  # fp16's largest finite value is 65504; from 65520 on, round-to-nearest gives inf


@pytest.fixture(autouse=True)
def _figures_laid_out_not_rasterised():
    """No test here reads a PNG's pixels: each figure a report saves is laid out (tests.helpers.audited_figures
    runs figure_problems, which draws it without rendering: an error of matplotlib's layout still fails) and
    written empty instead of rasterised (a third of a report's time)."""
    with audited_figures(save=False):
        yield


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _max_score(seq_len: int, i: int) -> float:
    """Closed form: the largest score of the uniform fp16 policy, formed in fp32 from fp16-rounded inputs."""
    q, k, _ = gm.scaled_inputs(seq_len, i)
    qr, kr = (round_to(t, Format.FP16).float() for t in (q, k))
    return float(((qr @ kr.transpose(-1, -2)) * 0.125).max())


def test_fp16_score_overflow_boundary_found_by_the_search_and_pinned():
    """L=256, D=64, N(0,1) x sigma: flash:fp16 (uniform) is finite one step (2^(1/8)) below the boundary its
    search finds and not finite at it; there, and only there, the largest score passes 65520, so the fp16
    running max is inf and inf - inf is NaN; the same inputs are finite under bf16 and under fp16-mixed."""
    found = gm.scale_boundary("flash:fp16", 256)
    i = found["boundary_i"]
    assert found["monotone"] and i is not None
    assert _max_score(256, i - 1) < FP16_INF_FROM <= _max_score(256, i)
    assert i == gm.fp16_score_boundary_i(256) < gm.fp16_input_overflow_i(256)  # the scores, not the inputs
    assert gm.finite_at_scale("flash:fp16", 256, i - 1) and not gm.finite_at_scale("flash:fp16", 256, i)
    assert gm.finite_at_scale("flash:bf16", 256, i) and gm.finite_at_scale("flash:fp16-mixed", 256, i)


def test_fp16_softmax_sum_boundary_is_65520_keys_at_the_maximum():
    """Every key at the row maximum: each P entry is 1, so the fp16 running sum l is the number of keys
    exactly (steps of 128 are exact below 65536); 65519 rounds to 65504, 65520 to inf, and O / l is 0.
    fp16-mixed (fp32 statistics) and bf16 stay finite at 65520 keys."""
    assert round_to(torch.tensor([65519.0], dtype=torch.float64), Format.FP16).item() == 65504.0
    assert math.isinf(round_to(torch.tensor([FP16_INF_FROM], dtype=torch.float64), Format.FP16).item())
    assert gm.tied_outcome("flash:fp16", 65519) == "ok"
    assert gm.tied_outcome("flash:fp16", 65520) != "ok"
    assert gm.tied_outcome("flash:fp16-mixed", 65520) == "ok"
    q, k, v = gm.tied_inputs(65520)
    assert bool(torch.isfinite(gm._method("flash:bf16").run(q, k, v)).all())


def test_peak_memory_of_math_holds_the_scores_and_flash_does_not():
    """sdpa-math's forward keeps the [L, L] fp32 scores (at least 4 L^2 bytes); the CPU flash kernel's peak
    stays below one such matrix at L = 1024."""
    math_peak = gm.cost("sdpa-math:bf16", 1024, backward=False, heads=1, head_dim=64, repeats=1)["peak_bytes"]
    flash = gm.cost("sdpa-flash:bf16", 1024, backward=False, heads=1, head_dim=64, repeats=3)
    assert math_peak >= 4 * 1024**2 > flash["peak_bytes"] > 0
    assert len(flash["times"]) == 3 and all(t > 0 for t in flash["times"])


TINY = GUIDE_PRESETS["guide-tiny"]


@pytest.fixture(scope="module")
def guide_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("guide")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_study(
            StudyConfig(name="guide-test", sweeps=(_guide_sweep((64, 128, 256), 1, (0,)),)), out, workers=1, quiet=True
        )
        stats = run_guide_tasks(out, TINY, quiet=True)
    finally:
        torch.set_num_threads(prev)  # the module's other tests start from the process's own setting
    return out, stats


@pytest.mark.slow
@pytest.mark.xdist_group("guide_folder")  # one worker computes guide_folder once
def test_guide_run_resumes_and_reports_the_claims_first(guide_folder):
    out, stats = guide_folder
    assert stats["tasks_failed"] == 0 and stats["tasks_computed"] == len(load_results(out))
    again = run_guide_tasks(out, TINY, quiet=True)
    assert again["tasks_computed"] == 0  # everything stored: nothing recomputed
    assert read_settings(out) == TINY
    with pytest.raises(ValueError, match="other settings"):
        run_guide_tasks(out, GuideSettings(), quiet=True)
    summary = build_guide_report(out)
    assert summary["failed"] == 0
    assert {f["status"] for f in summary["findings"]} <= {"holds", "does not hold", "inconclusive", "structural"}
    fp16 = next(f for f in summary["findings"] if f["id"] == "fp16/flash:fp16")
    assert fp16["status"] == "structural" and "non-finite from sigma" in fp16["measured"]
    md = (out / "report.md").read_text()
    first_table = md.split("| claim | measured (95% interval) | verdict | conditions |")
    assert len(first_table) == 2 and "|" not in first_table[0]  # the claims are the report's first table
    assert "not measured here: needs a GPU" in md and (out / "figures" / "boundary.png").exists()
    assert json.loads((out / "summary.json").read_text())["findings"] == summary["findings"]
    gpu = [f for f in summary["findings"] if f["id"].startswith("gpu_")]
    if not torch.cuda.is_available():  # summary.json says what the table says: not inconclusive
        assert gpu and {f["shown"] for f in gpu} == {"not measured here"}
    for f in (f for f in summary["findings"] if not f["id"].startswith("gpu_")):  # a band missed says its side
        assert f["shown"] == f["status"] or (
            f["status"] in ("does not hold", "inconclusive") and f["shown"].startswith(f"{f['status']}: ")
        )


@pytest.mark.slow
@pytest.mark.xdist_group("guide_folder")  # one worker computes guide_folder once
def test_time_exponents_below_512_tokens_are_not_measured(guide_folder):
    """guide-tiny's lengths stop at 256, where per-call costs hide the n^2: its time claims say so (they read
    "does not hold: exponent 0.42"), as the speed-up claims below 512 do; memory claims keep their verdicts."""
    from flashcheck.questions.guide.claims import cost_claims

    claims = cost_claims(load_results(guide_folder[0]), TINY)
    times = [c for c in claims if c["id"].startswith("time/")]
    assert times and all(c["status"] == "inconclusive" for c in times), [(c["id"], c["status"]) for c in times]
    assert all("lengths stop at 256 (< 512" in c["measured"] for c in times)
    assert any(c["id"].startswith("memory/") and c["status"] != "inconclusive" for c in claims)


@pytest.mark.slow
@pytest.mark.xdist_group("guide_folder")  # one worker computes guide_folder once
def test_report_command_rebuilds_a_guide_folder_in_words(guide_folder):
    out, _ = guide_folder
    with (out / GUIDE_FILE).open("a") as f:
        f.write("{half a line")  # a killed run's last line: dropped with a warning, the rest kept
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert "structural: FP16 produced NaN at very long sequences" in result.output
    assert "Time is O(n^2) in the length" in result.output and "report.html" in result.output
    assert "Is the deviation worth it? At bf16 on this CPU, the flash kernel's relative error" in result.output


def test_guide_preset_refuses_ray_and_a_missing_folder(tmp_path):
    result = CliRunner().invoke(app, ["study", "--preset", "guide", "--executor", "ray", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "runs locally" in result.output
    with pytest.raises(ValueError, match="no guide measurements"):
        read_settings(tmp_path)


def test_gpu_claims_are_listed_with_their_command_here_and_judged_from_a_gpu_record():
    """Without a GPU every GPU claim says so and names the command; a gpu/same record from a GPU run (its
    shape as guide_measure.gpu_same writes it) is judged by bit identity, a missing flash-attn is a reason."""
    from flashcheck.questions.guide.claims import GPU_COMMAND, gpu_claims

    listed = gpu_claims()
    assert all(c["status"] == "inconclusive" and c["conditions"] == GPU_COMMAND for c in listed)
    assert all("needs a GPU" in c["measured"] for c in listed)
    same = {"available": True, "identical": False, "max_abs": 9.8e-4, "seq_len": 2048}
    judged = {c["id"]: c for c in gpu_claims({"gpu/same": {"status": "ok", "result": same}})}
    assert judged["gpu_same"]["status"] == "does not hold" and "0.00098" in judged["gpu_same"]["measured"]
    missing = {"available": False, "reason": "flash-attn is not installed"}
    judged = {c["id"]: c for c in gpu_claims({"gpu/same": {"status": "ok", "result": missing}})}
    assert judged["gpu_same"]["status"] == "inconclusive" and "not installed" in judged["gpu_same"]["measured"]


@pytest.mark.slow
@pytest.mark.xdist_group("guide_folder")  # one worker computes guide_folder once
def test_guide_summary_has_the_readme_keys_and_a_conclusion(guide_folder):
    """README's summary.json schema: findings with top-level id, claim, measured, status, holds, rule, interval,
    n; a conclusion of sentences each naming a section the report anchors. guide-tiny stops below 512, so the
    speed-up rows say so and are inconclusive."""
    out, _ = guide_folder
    summary = build_guide_report(out)
    keys = {"id", "claim", "measured", "status", "holds", "rule", "interval", "n"}
    assert all(keys <= set(f) for f in summary["findings"])
    exps = [f for f in summary["findings"] if f["id"].startswith("time/")]
    assert all(f["n"] == f["verdict"]["n"] and len(f["interval"]) == 2 for f in exps)
    md = (out / "report.md").read_text()
    assert summary["conclusion"] and summary["conclusion"][0]["text"] == summary["answer"]
    for c in summary["conclusion"]:
        assert c["text"] and f'<a id="{c["section"]}"></a>' in md
    speed = [f for f in summary["findings"] if f["id"].startswith("speedup")]
    assert len(speed) == 4 and all(f["status"] == "inconclusive" for f in speed)
    assert all("lengths stop at 256 (< 512)" in f["measured"] and "L = ," not in f["conditions"] for f in speed)


def _record(method: str, seq_len: int, err: float):
    from types import SimpleNamespace

    case = SimpleNamespace(method=method, seq_len=seq_len, seed=0)
    errs = {"rel_l2": err}
    return SimpleNamespace(status="ok", case=case, errors=errs, errors_rounded=errs)


def test_slope_shows_tau_and_says_when_too_few_lengths_for_the_trend_rule():
    """Three lengths, one seed, a perfectly rising error: the slope interval excludes 0 but Kendall's p is 1/3
    at best (scipy on 0, 1, 2 vs itself), so the verdict is inconclusive and says why; five lengths reach
    p = 1/60 < 0.05 and the claim holds."""
    from scipy import stats

    from flashcheck.questions.guide.claims import best_trend_p, slope_claims

    best = stats.kendalltau([0, 1, 2], [0, 1, 2]).pvalue
    assert best_trend_p([64, 128, 256]) == pytest.approx(best) and best > 0.05
    assert best_trend_p([64, 64, 128, 128, 256, 256]) < 0.05  # seeds at each length give ties, and power
    m = "flash:bf16"
    three = slope_claims([_record(m, n, 1e-3 * n**0.1) for n in (64, 128, 256)], {}, [m])[0]
    assert three["status"] == "inconclusive" and "tau=+1.00 (p=0.33)" in three["measured"]
    assert "too few lengths for the trend rule" in three["verdict"]["reason"]
    five = slope_claims([_record(m, n, 1e-3 * n**0.1) for n in (64, 128, 256, 512, 1024)], {}, [m])[0]
    assert five["status"] == "holds" and "too few lengths" not in five["verdict"]["reason"]
    assert five["interval"][0] > 0 and five["n"] == 5


def test_an_error_outside_the_stated_range_says_which_side():
    """'1e-3 to 1e-2 for FP16/BF16': fp16 at 4.5e-4 does not hold but reads as more accurate than the guide says
    (table cell and measured text), bf16 at 3e-2 as less accurate, bf16 at 3e-3 holds with no side."""
    from flashcheck.questions.guide.claims import error_claims
    from flashcheck.questions.guide.report import shown_status

    recs = [_record(m, n, e * (1 + 0.01 * i)) for i, n in enumerate((64, 128, 256))
            for m, e in (("flash:fp16", 4.5e-4), ("flash:bf16", 3e-2), ("sdpa-math:bf16", 3e-3))]  # fmt: skip
    low, high, inside = error_claims(recs, ["flash:fp16", "flash:bf16", "sdpa-math:bf16"])
    assert low["status"] == high["status"] == "does not hold" and inside["status"] == "holds"
    assert shown_status(low) == "does not hold: below the stated range: fp16 is more accurate than the guide says"
    assert low["measured"].endswith("; below the stated range: fp16 is more accurate than the guide says")
    assert (
        "above the stated range: bf16 is less accurate" in shown_status(high)
        and "lies above" in high["verdict"]["reason"]
    )
    assert shown_status(inside) == "holds" and "stated range" not in inside["measured"] and "side" not in inside


# --- the guide as part of quick, full and tiny ----------------------------------------------------------------


def test_quick_full_and_tiny_carry_the_guide_and_study_json_keeps_it(tmp_path):
    """quick has a small guide part (every claim at n >= 3: lengths 256..2048, >= 200 latency calls), full
    guide-full's, tiny guide-tiny's; the settings survive study.json and a [guide] table of a TOML config."""
    from flashcheck.questions.guide.presets import GUIDE_QUESTION, GUIDE_SETTINGS, guide_sweep
    from flashcheck.study.config import load_config, preset

    quick, full, tiny = preset("quick"), preset("full"), preset("tiny")
    assert quick.settings.get("guide") == GUIDE_SETTINGS["quick"]
    assert full.settings.get("guide") == GUIDE_SETTINGS["guide-full"]
    assert tiny.settings.get("guide") == GUIDE_SETTINGS["guide-tiny"] and preset("paper").settings.get("guide") is None
    q = quick.settings.get("guide")
    assert min(q.cost_lengths) == 256 and max(q.cost_lengths) == 2048 and len(q.cost_lengths) >= 3
    assert q.repeats >= 3 and q.latency_calls >= 200 and q.latency_blocks >= 3
    assert guide_sweep(quick).seeds == (0, 1, 2) and guide_sweep(quick).question == GUIDE_QUESTION
    data = json.loads(json.dumps(quick.to_dict()))
    assert StudyConfig.from_dict(data) == quick and "guide" not in preset("paper").to_dict()
    toml = tmp_path / "g.toml"
    toml.write_text('name = "g"\n[[sweeps]]\nquestion = "x"\nmethods = ["flash:bf16"]\n[guide]\nrepeats = 3\n')
    assert load_config(toml).settings.get("guide") == GuideSettings(repeats=3)
    toml.write_text(toml.read_text().replace("repeats = 3", "repeat = 3"))
    with pytest.raises(ValueError, match="unknown field 'repeat' in the guide table"):
        load_config(toml)


def test_a_failure_never_supersedes_a_success(tmp_path):
    """guide.jsonl read back: a later failed line of a task that finished ok is ignored; a later ok wins."""
    params = {"kind": "cost", "method": "sdpa-math:bf16", "seq_len": 64, "backward": False}  # lines as tasks write

    def result(t: float) -> dict:
        return {"times": [t], "peak_bytes": 1}

    lines = [
        {"id": "a", "params": params, "status": "ok", "result": result(1.0)},
        {"id": "a", "params": params, "status": "failed", "reason": "x"},
        {"id": "b", "params": params, "status": "failed", "reason": "y"},
        {"id": "b", "params": params, "status": "ok", "result": result(2.0)},
    ]
    (tmp_path / GUIDE_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = load_results(tmp_path)
    assert got["a"]["status"] == "ok" and got["b"]["result"] == result(2.0)
    # the order of finishing (workers vary it) does not reach the claims: tasks come back in the order of their ids
    (tmp_path / GUIDE_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines[2:] + lines[:2]))
    assert list(load_results(tmp_path)) == ["a", "b"]


def test_guide_counts_match_the_table_cv_interval_is_positive_and_no_none_cell():
    """The conclusion's counts are the claims table's verdict column counted (a GPU claim not measured here is
    neither counted nor shown as inconclusive); a noisy CV's interval stays above 0; a sum row with no bad
    outcome shows "-", not Python's None."""
    from flashcheck.questions.guide.claims import gpu_claims, latency_rows
    from flashcheck.questions.guide.report import _sum_rows, claims_blocks, guide_sentences

    found = [{"id": f"x{i}", "status": st, "measured": "m"} for i, st in enumerate(["holds", "inconclusive"] * 2)]
    fs = [*found, *({k: c[k] for k in ("id", "status", "measured")} for c in gpu_claims())]
    for f in fs:
        f |= {"claim": "c", "conditions": "k"}
    text = guide_sentences({"findings": fs, "answer": "a"})[0][0]
    shown = [row[2] for row in claims_blocks({"findings": fs})[1].rows]
    assert f"2 inconclusive, {len(fs) - 4} not measured here" in text and shown.count("inconclusive") == 2
    assert "2 hold," in text and shown.count("holds") == 2
    noisy = [[1.0, 1.0, 1.0, 9.0], [1.0, 1.1, 1.0, 1.0], [1.0, 1.0, 1.0, 1.01]]  # CVs 1.5, 0.05, 0.005
    res = {"lat": {"id": "lat", "status": "ok", "params": {"kind": "latency", "seq_len": 64}}}
    res["lat"]["result"] = {"blocks": {"sdpa-math:bf16": noisy}}
    cell = latency_rows(res, None)[0][2]
    low = float(cell.split("[")[1].split(",")[0])
    assert 0 < low < float(cell.split()[0])
    points = {"id": "s", "status": "ok", "params": {"kind": "sum_points", "method": "sdpa-math:bf16"}}
    points["result"] = {"boundary_keys": None, "outcome": None, "points": {"64": "ok", "256": "ok"}, "searched": False}
    row = _sum_rows({"s": points})[0]
    assert "None" not in row and row[2] == "-" and row[3] == "64, 256 (fixed list)"


@pytest.fixture
def tiny_study(tiny_study_run, tmp_path):
    """The tiny preset (its guide part is guide-tiny's), computed once per session (conftest.tiny_study_run):
    a copy of its folder, and the guide tasks its run computed and failed, as its CLI line printed them."""
    import re
    import shutil

    assert tiny_study_run.exit_code == 0, tiny_study_run.output
    out = tmp_path / "tiny"
    shutil.copytree(tiny_study_run.folder, out)
    said = " ".join(tiny_study_run.output.split())
    computed = re.search(r"FP64 references, (\d+) guide tasks", said)
    failed = sum(1 for r in load_results(out).values() if r["status"] != "ok")
    return out, {"guide_tasks_computed": int(computed.group(1)) if computed else None, "guide_tasks_failed": failed}


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_report")  # one worker builds conftest.tiny_report_run once
def test_the_study_report_has_the_guide_claims_and_summary_its_keys(tiny_study, tiny_report_run):
    """`flashcheck report` on a tiny study (the same code path as the default quick study): the guide's claims
    table (claim / measured / verdict / conditions) under its own heading, a conclusion sentence linking to it,
    summary.json's guide findings with README's keys, and the claims printed in words."""
    from flashcheck.questions.guide.tasks import tasks

    _, stats = tiny_study
    assert stats["guide_tasks_computed"] == len(tasks(TINY)) and stats["guide_tasks_failed"] == 0
    out, seen = tiny_report_run.folder, tiny_report_run.figures  # `flashcheck report` on a copy, once per session
    result = tiny_report_run
    assert result.exit_code == 0, result.output
    assert seen and all(problems == [] for _, problems, _ in seen), seen
    assert "The production guide's claims" in result.output
    assert "not measured here: Flash Attention needs an Ampere" in result.output  # as the table shows it
    assert "structural: FP16 produced NaN at very long sequences" in result.output
    summary = json.loads((out / "summary.json").read_text())
    guide = summary["guide"]
    keys = {"id", "claim", "measured", "status", "holds", "rule", "interval", "n", "conditions"}
    assert guide["findings"] and all(keys <= set(f) for f in guide["findings"])
    assert {f["id"] for f in guide["findings"]} >= {"latency_variance", "fp16/flash:fp16", "gpu_same"}
    assert summary["failed"] == 0 and guide["settings"] == json.loads(json.dumps(TINY.to_dict()))
    said = {c["section"]: c["text"] for c in summary["conclusion"]}
    assert said["guide"].startswith("The production guide's claims: of ")
    md = (out / "report.md").read_text()
    part = md.split('<a id="guide"></a>')[1].split('<a id="problems"></a>')[0]
    for st in ("inconclusive", "not measured here"):  # the counts are the table's verdicts (a cell may say why)
        n = len(re.findall(rf"\| {st}(?:: [^|]*)? \|", part))
        assert (f" {n} {st}" in said["guide"]) if n else st not in said["guide"]
    guide_md = md.split('<a id="cost"></a>')[1].split("## Environment")[0]
    assert "None" not in guide_md and "None" not in part
    lat = guide_md.split('<a id="latency"></a>')[1].split('<a id="fp16"></a>')[0]
    lows = [float(c.split("[")[1].split(",")[0]) for c in lat.split("|") if "[" in c]
    assert lows and min(lows) >= 0  # a CV's interval never goes below 0
    assert '<a id="guide"></a>' in md and "(#guide)" in md  # the conclusion links to the claims table
    assert "| claim | measured (95% interval) | verdict | conditions |" in md
    assert md.index("## Conclusion") < md.index("## The production guide's claims") < md.index("## Environment")
    assert "not measured here: needs a GPU" in md and (out / guide["figures"]["boundary"]).exists()


@pytest.mark.slow
def test_the_guide_part_of_a_study_resumes_after_a_kill(tiny_study, tmp_path):
    """What a killed run leaves (the finished tasks' lines, then half a line) is kept: a rerun computes no case
    and only the guide tasks that have no line; a failed task is tried again."""
    from flashcheck.study.config import preset

    out = tiny_study[0]  # a copy of the session's tiny study
    lines = (out / GUIDE_FILE).read_text().splitlines()
    kept = lines[:5]
    failed = {**json.loads(lines[5]), "status": "failed", "reason": "RuntimeError: boom"}
    failed.pop("result")
    (out / GUIDE_FILE).write_text("\n".join([*kept, json.dumps(failed)]) + "\n" + lines[6][:20])
    stats = run_study(preset("tiny"), out, workers=1, quiet=True)
    assert stats["cases_computed"] == 0 and stats["guide_tasks_failed"] == 0
    assert stats["guide_tasks_computed"] == len(lines) - len(kept)
    assert {k: r["status"] for k, r in load_results(out).items()} == {json.loads(x)["id"]: "ok" for x in lines}
    assert run_study(preset("tiny"), out, workers=1, quiet=True)["guide_tasks_computed"] == 0


def test_a_guide_folder_from_before_resumes_and_others_are_refused(tmp_path):
    """A --preset guide folder whose study.json predates the guide's settings in it is resumed (study.json
    gains them; guide.json is checked before the tasks); any other study that lacks them is another study."""
    from flashcheck.study.config import preset
    from flashcheck.study.runner import save_config

    for name, ok in (("guide-tiny", True), ("tiny", False)):
        folder = tmp_path / name
        folder.mkdir()
        old = {k: v for k, v in preset(name).to_dict().items() if k != "guide"}
        (folder / "study.json").write_text(json.dumps(old))
        if ok:
            save_config(folder, preset(name))
            assert json.loads((folder / "study.json").read_text())["guide"] == json.loads(json.dumps(TINY.to_dict()))
        else:
            with pytest.raises(ValueError, match="holds another study"):
                save_config(folder, preset(name))
            assert "guide" not in json.loads((folder / "study.json").read_text())


def test_speed_up_growth_over_three_lengths_says_the_trend_rule_cannot_decide(monkeypatch):
    """Three lengths: even a perfectly growing speed-up gives Kendall p = 0.33, and the row says so."""
    from flashcheck.questions.guide import claims as gc

    times = {"sdpa-math:bf16": {512: 2.0, 1024: 4.4, 2048: 10.0}, "sdpa-flash:bf16": {512: 1.0, 1024: 2.0, 2048: 4.0}}
    monkeypatch.setattr(gc, "_medians", lambda results, method, backward: times[method])
    rows = {c["id"]: c for c in gc._speed_claims({}, GuideSettings())}
    grows = rows["speedup_grows/forward"]
    assert grows["status"] == "inconclusive"
    assert (
        "too few lengths for the trend rule (3 lengths: even a perfectly monotone speed-up gives p = 0.33"
        in (grows["measured"])
    )


def _boundary_results(bf16_scale: int | None, bf16_sums: dict[str, str]) -> dict[str, dict]:
    """quick's boundary and sum tasks for flash:fp16: non-finite from sigma 2^9 at L=256 (inputs overflow at
    2^14), ok at Lk = 65519 and non-finite at 65520 keys at the maximum; the bf16 twin as given."""

    def task(tid: str, params: dict, result: dict) -> tuple[str, dict]:
        return tid, {"id": tid, "status": "ok", "params": params, "result": result}

    scale = {"kind": "scale", "seq_len": 256}
    points = {"kind": "sum_points"}
    fp16 = {"boundary_i": 72, "inputs_overflow_i": 112}
    return dict(
        [
            task("scale/flash:fp16/L=256", scale | {"method": "flash:fp16"}, fp16),
            task("scale/flash:bf16/L=256", scale | {"method": "flash:bf16"}, {"boundary_i": bf16_scale}),
            task(
                "sum/flash:fp16",
                points | {"method": "flash:fp16"},
                {"boundary_keys": 65520, "outcome": "non-finite", "searched": False,
                 "points": {"65519": "ok", "65520": "non-finite"}},
            ),
            task(
                "sum/flash:bf16",
                points | {"method": "flash:bf16"},
                {"boundary_keys": 65519 if "wrong" in bf16_sums.values() else None, "outcome": "wrong",
                 "searched": False, "points": bf16_sums},
            ),
        ]
    )  # fmt: skip


def test_fp16_structural_counts_only_where_bf16_is_right():
    """quick's flash:fp16 line: bf16 is wrong at 65519 and 65520 keys too, so the sum does not count for
    "NaN where BF16 was fine" (the line said structural beside "bf16 ... wrong at Lk = 65519"); the scale
    search, where bf16 stays finite, does. With bf16 failing everywhere fp16 fails the claim does not hold."""
    from flashcheck.questions.guide.claims import boundary_claims

    s = GuideSettings(boundary_methods=("flash:fp16",), sum_methods=("flash:fp16",), sum_keys=(65519, 65520))
    wrong = {"65519": "wrong", "65520": "wrong"}
    [f] = boundary_claims(_boundary_results(None, wrong), s)
    assert f["status"] == "structural"
    assert "fp16 fails where bf16 does not: L=256 sigma 2^9" in f["measured"]
    not_counted = "Not counted (bf16 fails there too): Lk = 65520 keys at the maximum (non-finite; bf16 wrong)"
    assert not_counted in f["measured"]
    [f] = boundary_claims(_boundary_results(64, wrong), s)  # bf16 non-finite from a lower sigma too
    assert f["status"] == "does not hold" and "bf16 failed too" in f["verdict"]["reason"]
    [f] = boundary_claims(_boundary_results(64, {"65519": "ok", "65520": "ok"}), s)
    assert f["status"] == "structural" and "Lk = 65520 keys at the maximum (non-finite; bf16 ok)" in f["measured"]


def test_each_timing_records_the_load_and_a_busy_machine_makes_its_verdict_inconclusive(monkeypatch, capsys):
    """A timed task stores the 1-minute load average before and after, the cores and this process's threads
    (a search does not); the latency claim that holds on a quiet machine is inconclusive when a timing it
    rests on ran with a load beyond 0.75 x cores besides the process's own thread (core.load)."""
    from flashcheck.core.load import busy
    from flashcheck.questions.guide import tasks as guide
    from flashcheck.questions.guide.claims import latency_claim
    from flashcheck.questions.guide.tasks import _run_one

    monkeypatch.setattr(guide, "run_task", lambda params, s: {"times": [0.1]})  # the record, not the timing
    cost = _run_one("cost/x", {"kind": "cost", "method": "sdpa-math:bf16", "seq_len": 32, "backward": False}, TINY)
    assert set(cost["load"]) == {"load1_before", "load1_after", "cpus", "own_threads"}
    assert cost["load"]["own_threads"] == TINY.threads and cost["load"]["cpus"] >= 1
    scale = _run_one("scale/x", {"kind": "scale", "method": "flash:fp16", "seq_len": 16}, TINY)
    assert scale["status"] == "ok" and "load" not in scale
    assert busy({"load1_before": 1.2, "load1_after": 3.0, "cpus": 2, "own_threads": 1}).startswith("load average 3")
    assert busy({"load1_before": 1.2, "load1_after": 2.4, "cpus": 2, "own_threads": 1}) is None  # 1.4 <= 1.5
    assert busy(None) is None and busy({"load1_before": None, "load1_after": None, "cpus": 2}) is None
    steady, noisy = [[1.0, 1.01, 1.0, 1.02]] * 3, [[1.0, 1.5, 0.7, 1.3], [1.0, 1.4, 0.8, 1.2], [1.2, 0.9, 1.5, 1]]
    quiet = {"load1_before": 0.1, "load1_after": 0.2, "cpus": 2, "own_threads": 1}
    task = {"id": "latency/L=64", "status": "ok", "params": {"kind": "latency", "seq_len": 64}, "load": quiet}
    task["result"] = {"blocks": {"sdpa-flash:bf16": steady, "sdpa-math:bf16": noisy}}
    assert latency_claim({"t": task}, TINY)["status"] == "holds"
    task["load"] = quiet | {"load1_after": 12.0}  # a shared machine under a load average of 12
    f = latency_claim({"t": task}, TINY)
    assert (
        f["status"] == "inconclusive"
        and f["measured"] == latency_claim({"t": task | {"load": quiet}}, TINY)["measured"]
    )  # the numbers stay; only the verdict says the machine was busy
    assert "1 of 1 timings ran on a busy machine (latency/L=64: load average 12.00" in f["verdict"]["reason"]
    from flashcheck.questions.guide.report import shown_status  # the table's verdict cell says why

    assert shown_status(f).startswith("inconclusive: the machine was busy (1 of 1 timings ran under a load average 12")
    assert shown_status(latency_claim({"t": task | {"load": quiet}}, TINY)) == "holds"
    task["id"] = "cost/sdpa-math:bf16/fwd/L=1024"  # a timing task's id holds colons: the why is still found
    f = latency_claim({"t": task}, TINY)
    assert shown_status(f).startswith("inconclusive: the machine was busy (1 of 1 timings ran under a load average 12")
    from flashcheck.cli.app import _console
    from flashcheck.cli.study import _print_claims  # and the console's claim line says it too

    _print_claims([f], _console())
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{shown_status(f)}: {f['claim']}") and "\n" not in line, line


def test_every_timing_verdict_measured_under_load_says_the_machine_was_busy():
    """The busy-machine reason was given only where it changed the verdict: a time exponent already inconclusive
    (its interval across a band edge) measured at load 17 on 2 cores said only the interval. Now each timing
    verdict resting on a busy timing says the machine was busy first, then its own reason."""
    from flashcheck.questions.guide.claims import cost_claims, latency_claim
    from flashcheck.questions.guide.report import shown_status

    load = {"load1_before": 0.1, "load1_after": 12.0, "cpus": 2, "own_threads": 1}
    results = {}
    for m in TINY.cost_methods:
        for bwd in (False, True):
            for n in (512, 1024, 2048, 4096):  # exponent ~2.9 with wide scatter: inconclusive on its own
                times = [1e-9 * n ** (3 if i % 2 else 1.5) for i in range(5)]
                tid = f"cost/{m}/{'fwd+bwd' if bwd else 'fwd'}/L={n}"
                params = {"kind": "cost", "method": m, "seq_len": n, "backward": bwd}
                results[tid] = {"id": tid, "status": "ok", "params": params, "load": load,
                                "result": {"times": times, "peak_bytes": 64 * n}}  # fmt: skip
    blocks = [[1.0, 1.5, 0.7, 1.3]] * 3
    results["latency/L=64"] = {"id": "latency/L=64", "status": "ok", "params": {"kind": "latency", "seq_len": 64},
                               "load": load, "result": {"blocks": {"sdpa-flash:bf16": blocks,
                                                                   "sdpa-math:bf16": blocks}}}  # fmt: skip
    timing = [f for f in cost_claims(results, TINY) if not f["id"].startswith("memory/")]
    timing.append(latency_claim(results, TINY))
    assert len(timing) > 2
    for f in timing:
        assert f["status"] == "inconclusive", f
        assert shown_status(f).startswith("inconclusive: the machine was busy ("), (f["id"], shown_status(f))
    memory = [f for f in cost_claims(results, TINY) if f["id"].startswith("memory/")]
    assert memory and not any("busy" in shown_status(f) for f in memory)  # peak bytes are not timings


def test_an_inconclusive_claim_says_why_busy_or_not():
    """Every inconclusive cell says why: the rule's reason where the machine was not busy (it said a bare
    "inconclusive"); a GPU claim not measured here stays "not measured here"."""
    from flashcheck.questions.guide.report import shown_status
    from flashcheck.reporting.verdicts import Estimate, compare

    v = compare(Estimate(value=1.1, low=0.9, high=1.3, n=5, method="mean"))
    f = {"id": "fp16_band", "status": v.status, "measured": "x", "verdict": v.to_dict()}
    assert v.status == "inconclusive" and shown_status(f) == f"inconclusive: {v.reason}", shown_status(f)
    assert "contains 1" in shown_status(f)
    gpu = {"id": "gpu_speed", "status": "inconclusive", "measured": "needs a GPU", "verdict": v.to_dict()}
    assert shown_status(gpu) == "not measured here"


def test_a_claim_line_says_its_why_once(capsys):
    """The console's claim line: the verdict's why after the status word only where the measured text after the
    dash does not hold it already (it printed "too few lengths" twice); a band's reason names the band."""
    from flashcheck.cli.app import _console
    from flashcheck.cli.study import _print_claims
    from flashcheck.reporting.verdicts import Estimate, band

    v = band(Estimate(value=2.4, low=2.29, high=2.51, n=5, method="mean"), 1.5, 2.5)
    assert v.reason == "interval [2.29, 2.51] overlaps an edge of the band [1.5, 2.5]"
    told = {"id": "a", "claim": "A", "status": "inconclusive", "measured": f"2.4; {v.reason}", "verdict": v.to_dict()}
    apart = {**told, "id": "b", "measured": "2.4"}
    _print_claims([told, apart], _console())
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"inconclusive: A (a) — 2.4; {v.reason}", lines
    assert lines[1] == f"inconclusive: {v.reason}: A (b) — 2.4", lines


def test_fp16_claim_before_any_search_is_stored_is_not_measured_yet():
    """A study still writing (no fp16 search stored yet) says 'not measured yet', not 'does not hold' (fixa2-1)."""
    from flashcheck.questions.guide.claims import boundary_claims

    s = GuideSettings(boundary_methods=("flash:fp16",), sum_methods=("flash:fp16",), sum_keys=(65519, 65520))
    [f] = boundary_claims({}, s)
    assert f["status"] == "inconclusive" and f["verdict"]["reason"] == "not measured yet"


def test_the_cost_figure_has_readable_ticks_when_times_span_under_two_decades(tmp_path):
    # CI, 2026-12-07: the tiny study's times (medians below, 1.2e-4 to 4.4e-3 s) drew matplotlib's minor labels
    # 3x10^-4 and 4x10^-4 over one another (figure_problems caught it; 3x10^5 and 4x10^5 on the memory axis here);
    # both axes are labelled at 1, 2, 5 x 10^k only (figures.log10_axis)
    pytest.importorskip("matplotlib")
    from tests.helpers import audited_figures

    from flashcheck.questions.guide.presets import GuideSettings
    from flashcheck.questions.guide.report import _draw_cost

    medians = {  # (method, backward): seconds at L = 64, 128, 256
        ("sdpa-math:bf16", False): (1.7e-4, 2.4e-4, 5.3e-4),
        ("sdpa-math:bf16", True): (4.4e-4, 6.1e-4, 1.3e-3),
        ("sdpa-flash:bf16", False): (1.2e-4, 1.7e-4, 3.6e-4),
        ("sdpa-flash:bf16", True): (4.7e-4, 1.3e-3, 4.4e-3),
        ("flash:bf16-mixed", False): (5.3e-4, 6.6e-4, 9.3e-4),
        ("flash:bf16-mixed", True): (1.2e-3, 1.4e-3, 2.5e-3),
    }
    s = GuideSettings(cost_lengths=(64, 128, 256))
    results = {}
    for (m, bwd), ts in medians.items():
        for L, t in zip(s.cost_lengths, ts, strict=True):
            params = {"kind": "cost", "method": m, "backward": bwd, "seq_len": L}
            result = {"times": [t * 0.97, t, t * 1.04], "peak_bytes": 16 * L * L * (2 + bwd)}
            results[str(len(results))] = {"status": "ok", "params": params, "result": result}
    with audited_figures(save=False) as seen:
        assert _draw_cost(tmp_path / "cost.png", results, s)
    assert [problems for _, problems, _ in seen] == [[]], seen
