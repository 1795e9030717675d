"""What a person sees: every command's human output (no --json), progress, and the files' modes.

Each command runs at a small size through typer's CliRunner (stdout is not a terminal there), a few
through the installed `flashcheck` script. Off a terminal the output has no ANSI escapes, no rich
highlighting inside numbers, and headings and verdicts on one line each."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.fileio import atomic_target, write_atomic
from flashcheck.core.progress import progress

runner = CliRunner()
ESC = "\x1b["
SMALL = ["--seq-len", "64", "--heads", "1"]
SWEEP = """name = "human"
[[sweeps]]
question = "seq_len"
methods = ["flash:bf16"]
seq_lens = [32, 64]
blocks = [[16, 16]]
seeds = [0]
"""


def human(args: list[str], env: dict | None = None, codes: tuple[int, ...] = (0,)):
    """Run a command without --json; it must exit with one of `codes` (0) without a traceback or an ANSI
    escape."""
    res = runner.invoke(app, args, env=env)
    assert res.exit_code in codes, f"{args}: exit {res.exit_code}\n{res.output}\n{res.exception!r}"
    assert "Traceback" not in res.output and not isinstance(res.exception, Exception), res.output
    if env is None:
        assert ESC not in res.output, repr(res.output)
    return res


def one_line(output: str, *parts: str) -> str:
    """The single output line that holds every part (a heading or verdict is never wrapped)."""
    lines = [ln for ln in output.splitlines() if all(p in ln for p in parts)]
    assert len(lines) == 1, f"{parts} not together on one line:\n{output}"
    return lines[0]


def progress_lines(stderr: str, last: str, note: str) -> None:
    """stderr holds only progress lines `label k/n, S s, note`; the last one is `last, S s, note`."""
    lines = stderr.splitlines()
    assert lines and all(re.fullmatch(r"[\w-]+ \d+/\d+, \d+ s(, .+)?", ln) for ln in lines), stderr
    assert re.fullmatch(rf"{re.escape(last)}, \d+ s, {re.escape(note)}", lines[-1]), stderr


# ---- progress ---------------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_prints_plain_lines_and_a_last_one():
    every = io.StringIO()
    with progress(3, "seq_len", stream=every, interval=0) as advance:
        for n in (64, 128, 256):
            advance(note=f"L={n}")
    assert every.getvalue().splitlines() == [
        "seq_len 1/3, 0 s, L=64",
        "seq_len 2/3, 0 s, L=128",
        "seq_len 3/3, 0 s, L=256",
    ]
    rare = io.StringIO()
    with progress(40, "cases", done=10, stream=rare, interval=3600) as advance:
        for _ in range(30):
            advance()
    assert rare.getvalue() == "cases 40/40, 0 s\n"  # throttled: only the line at the end
    opened = io.StringIO()
    with progress(40, "cases", done=10, stream=opened, interval=3600, opening=True) as advance:
        advance(30)
    assert opened.getvalue() == "cases 10/40, 0 s\ncases 40/40, 0 s\n"  # a line at once (a study's), then the end


def test_progress_on_a_terminal_is_a_rich_bar_and_quiet_is_silent():
    tty = _Tty()
    with progress(2, "compare", stream=tty) as advance:
        advance(note="sdpa-math")
        advance(note="sim-flash")
    assert "2/2" in tty.getvalue() and "compare" in tty.getvalue() and ESC in tty.getvalue()
    quiet = io.StringIO()
    with progress(5, "x", stream=quiet, quiet=True) as advance:
        advance(3)
    assert quiet.getvalue() == ""


def test_progress_prints_no_last_line_when_the_work_fails():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress(3, "x", stream=out, interval=3600) as advance:
        advance()
        raise RuntimeError("boom")
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="total=-1"), progress(-1, "x"):
        pass


# ---- file modes -------------------------------------------------------------------------------------


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_atomic_gives_the_mode_of_an_ordinary_file(tmp_path, umask022):
    write_atomic(tmp_path / "summary.json", '{"a": 1}')
    write_atomic(tmp_path / "blob.bin", b"\x00\xff")
    (tmp_path / "plain.txt").write_text("x")
    assert _mode(tmp_path / "summary.json") == _mode(tmp_path / "plain.txt") == 0o644
    assert (tmp_path / "blob.bin").read_bytes() == b"\x00\xff" and _mode(tmp_path / "blob.bin") == 0o644
    os.umask(0o077)  # the umask is honoured, not overridden
    write_atomic(tmp_path / "private.json", "{}")
    assert _mode(tmp_path / "private.json") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "plain.txt", "private.json", "summary.json"]


def test_atomic_target_replaces_on_success_and_cleans_up_on_failure(tmp_path, umask022):
    target = tmp_path / "w.pt"
    with atomic_target(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".pt"
        torch.save({"x": torch.ones(2)}, tmp)
    assert torch.load(target)["x"].sum() == 2 and _mode(target) == 0o644
    with pytest.raises(OSError), atomic_target(target) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert torch.load(target)["x"].sum() == 2
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """A 4-case custom study run without --json under umask 022: (its folder, the command's result). Its figures
    are not rasterised (helpers.audited_figures(save=False)): each PNG is still the file the report's atomic write
    created, with the mode it gave, and no test reads their pixels."""
    from helpers import audited_figures

    folder = tmp_path_factory.mktemp("study")
    (folder / "sweep.toml").write_text(SWEEP)
    old = os.umask(0o022)
    try:
        with audited_figures(save=False) as seen:
            res = human(["study", "--config", str(folder / "sweep.toml"), "--out", str(folder / "s"), "--workers", "1"])
        assert seen and all(name.endswith(".png") for name, _, _ in seen), seen
    finally:
        os.umask(old)
    return folder / "s", res


@pytest.mark.xdist_group("cli_human_small_study")  # one worker computes the module fixture small_study once
def test_every_file_explain_and_study_write_is_0644(tmp_path, umask022, small_study):
    human(["explain", *SMALL, "--out", str(tmp_path)])
    files = [p for folder in (tmp_path, small_study[0]) for p in folder.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"summary.json", "report.html", "report.md", "study.json", "records.jsonl", "explain.png"} <= names
    assert {str(p): oct(_mode(p)) for p in files if _mode(p) != 0o644} == {}


# ---- every command, without --json ------------------------------------------------------------------


def _row(output: str, *cells: str) -> str:
    """The table row whose first cells are `cells` (rich's box characters between them)."""
    pattern = r"^[│|]\s*" + r"\s*[│|]\s*".join(re.escape(c) for c in cells) + r"\s*[│|]"
    match = re.search(pattern, output, flags=re.M)
    assert match, f"no table row {cells}:\n{output}"
    return output[match.start() : output.index("\n", match.start())]


def test_help_of_every_command():
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    top = human(["--help"])
    assert all(re.search(rf"^\s+{re.escape(n)}\s", top.output, flags=re.M) for n in names), top.output
    for name in names:
        res = human([name, "--help"])
        assert f" {name} [OPTIONS]" in " ".join(res.output.split()), res.output


def test_help_is_readable_at_80_columns():
    """At COLUMNS=80 every command's --help names every option in full, no line is wider than the terminal,
    and each option's help starts where at least 30 columns are left for it (rich's five-column table left
    `--baseline-numeri…` and help wrapped into 18 columns)."""
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        out = human([name, "--help"], env={"COLUMNS": "80"}).output
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80, (name, out)
        click_command = typer.main.get_command(app).commands[name]
        for param in click_command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("--"):
                    assert re.search(rf"{re.escape(opt)}(?![\w-])", out), (name, opt, out)
            words = (getattr(param, "help", None) or "").split()[:2]
            if not words:
                continue
            start = next((line.find(" ".join(words)) for line in lines if " ".join(words) in line), -1)
            assert start >= 0 and 80 - start >= 30, (name, param.name, start, out)


INVALID = "error: Invalid value for"


@pytest.mark.parametrize(
    "args,message",
    [
        (["compare", "--heads", "0"], f"{INVALID} '--heads': 0 is not allowed; --heads must be a positive integer"),
        (["compare", "--kernel", "tiled"], f"{INVALID} '--kernel': 'tiled' is not one of 'flash', 'standard'"),
        (["doctor", "--seq-len", "x"], f"{INVALID} '--seq-len': 'x' is not a valid integer"),
        (["study", "--executor", "dask"], f"{INVALID} '--executor': 'dask' is not one of 'local', 'ray'."),
        (["compare", "--no-such"], "error: No such option: --no-such"),
        (["no-such-command"], "error: No such command 'no-such-command'; see 'root --help'"),
        (["drift", "a"], "error: Missing argument 'B'; see 'root drift --help'"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_with_exit_2(args, message):
    """typer's own parsing errors read like the commands' checks: one line on stderr, no framed box."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith(message), res.stderr


def test_version():
    from importlib.metadata import version

    res = human(["--version"])
    assert res.output == f"flashcheck {version('flashcheck')}\n"


def test_no_arguments_still_prints_the_help():
    res = runner.invoke(app, [])
    assert "Usage:" in res.output and "\n  compare " in res.output and "error:" not in res.output


def test_out_creates_the_last_folder_only(tmp_path):
    """--out NEW is created; --out MISSING/NEW is refused before any work, and nothing is created."""
    human(["explain", *SMALL, "--out", str(tmp_path / "new")])
    assert (tmp_path / "new" / "summary.json").is_file()
    res = runner.invoke(app, ["explain", *SMALL, "--out", str(tmp_path / "typo" / "new")])
    assert res.exit_code == 2 and not (tmp_path / "typo").exists(), res.output
    one_line(res.output, "error: --out", "the folder", "typo' does not exist", "create it first")
    assert "explain 13/13" not in res.output  # refused before the measurement


def test_validate_says_how_many_texts_it_compared():
    """A --samples beyond the corpus is said in the table's title (the corpus is what was compared)."""
    from flashcheck.cli.validate import _inputs_line

    assert _inputs_line({"texts": 1000, "samples": 1000, "max_length": 128}) == "1000 texts, up to 128 tokens"
    line = _inputs_line({"texts": 5, "samples": 50, "max_length": 16})
    assert line == "5 texts (--samples 50: the corpus holds 5), up to 16 tokens"


def test_backends_human():
    res = human(["backends"])
    assert "yes" in _row(res.output, "sdpa-math") and "yes" in _row(res.output, "sim-flash")
    assert "torch SDPA MATH in true low precision" in _row(res.output, "sdpa-math-lowp")


def test_doctor_human():
    res = human(["doctor", "--seq-len", "64"])
    one_line(res.output, "SDPA picks for [1, 8, 64, 64] bfloat16 on cpu:", "scaled_dot_product")
    assert re.search(r"^  sdpa-math\s+yes$", res.output, flags=re.M), res.output
    one_line(res.output, "flash-attn:")
    one_line(res.output, "simulator's tensor-core MMA model:")  # "C routine", or why it runs in torch
    one_line(res.output, "simulator's FA2 step (softmax, P, accumulator):")
    one_line(res.output, "simulator's plain FA2 query tiles:")  # one C call per tile, or why step by step
    one_line(res.output, "simulator's FP8 / integer quantisation:")  # "C routine", or why kernels.native.fp8 is off
    assert "NONE" not in res.output and "None" not in res.output.splitlines()[0], res.output
    if torch.version.cuda is None:  # the CPU build: no wheel fits; the one a CUDA build would need
        one_line(res.output, "OS ", "torch", ", the CPU build (no CUDA)")
        one_line(res.output, "no flash-attn wheel fits torch's CPU build")
        one_line(res.output, "with a CUDA build of this torch: flash_attn-VERSION+cuXtorch")
        one_line(res.output, "SDPA backend switches on:", "the CPU build runs only math and flash")
        one_line(res.output, "deterministic algorithms: off")
        assert "cudnn" not in res.output.split("deterministic algorithms")[1].splitlines()[0], res.output
    assert "{" not in res.output and "True" not in res.output, res.output  # words, not a dict


def test_doctor_wheel_tag_names_the_cuda_major(monkeypatch):
    """flash-attn's release wheels say cu12 (not cu12.4, not cuNONE)."""
    from flashcheck import doctor

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    fa = doctor._flash_attn_wheel()
    assert "+cu12torch" in fa["wheel_tag"] and fa["cuda_tag"] == "cu12", fa
    monkeypatch.setattr(torch.version, "cuda", None)
    fa = doctor._flash_attn_wheel()
    assert fa["wheel_tag"] is None and fa["cuda_tag"] is None and "+cuXtorch" in fa["wheel_tag_with_cuda"], fa
    assert any("the CPU build (no CUDA)" in p for p in fa["problems"]), fa


def test_explain_human_heading_one_line_and_progress(tmp_path):
    res = human(["explain", *SMALL, "--out", str(tmp_path)])
    data = json.loads((tmp_path / "summary.json").read_text())
    heading = one_line(res.output, "rel_l2 vs FP64 of bf16-mixed: full", "dominant stage (")
    dom = data["dominant_stage"]  # its own share first, in the measure output's share is given in (issue 34)
    assert f"dominant stage (raising it to FP64 removes the most): {dom}, which alone (the other stages" in heading
    assert f"{data['alone']['output']:.3e}" in _row(res.output, "output", "bf16")
    progress_lines(res.stderr, "explain 13/13", "bf16-mixed")
    one_line(res.output, f"wrote {tmp_path}/summary.json, figures/explain.png")


@pytest.mark.parametrize("preset,policy", [("fa2-gpu", "fa2-gpu@bf16"), ("fa3-fp8", "fa3-fp8@fp8-e4m3")])
def test_explain_a_preset_without_numerics_takes_its_format(preset, policy, tmp_path):
    """--preset takes a format: without --numerics, bf16 (fp8-e4m3 for fa3-fp8), not the policy bf16-mixed."""
    res = human(["explain", "--preset", preset, *SMALL, "--out", str(tmp_path)])
    one_line(res.output, f"rel_l2 vs FP64 of {policy}: full")


def test_compare_human_heading_one_line():
    res = human(["compare", *SMALL])
    one_line(res.output, "flash [bf16-mixed] vs standard [bf16-mixed]", "L=64", "seed=0")
    for metric in ("max_abs", "mean_abs", "rmse", "rel_l2"):
        assert re.search(r"\d\.\d{3}e-\d\d", _row(res.output, metric))
    assert res.stderr == ""  # one case: no progress


def _console_at(width: int):
    """A terminal's console (no colour) of `width` columns, as `_console` makes for a tty."""
    from rich.console import Console

    def console(stderr: bool = False):
        stream = sys.stderr if stderr else sys.stdout
        return Console(file=stream, width=width, highlight=False, emoji=False, soft_wrap=False, color_system=None)

    return console


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "--backend", "sdpa-math,sdpa-math-lowp,sim-flash", "--seq-len", "32", "--heads", "1"],
        ["backends"],
    ],
)
def test_tables_are_whole_at_80_columns(monkeypatch, args):
    """On an 80-column terminal no cell is cut ("2.8…", "sdpa-math-lo…"): names and numbers whole, columns
    empty in every row (checks) dropped, no autograd class name (_FlashFunction) for the kernel that ran."""
    import flashcheck.cli.show as show_cli
    import flashcheck.cli.tools as tools_cli

    for width in (80, 200):
        monkeypatch.setattr(show_cli, "_console", _console_at(width))
        monkeypatch.setattr(tools_cli, "_console", _console_at(width))
        out = human(args, codes=(0, 1)).output
        assert "…" not in out and "_FlashFunction" not in out and "checks" not in out, out
        assert re.search(r"\bsdpa-math-lowp\b", out), out
        if args[0] == "compare":
            assert len(re.findall(r"\d\.\d{3}e-\d\d", out)) == 6, out  # rel_l2 and max_abs of each backend
            if width == 200:  # the table fits: one row per backend, the public op that ran
                assert "_scaled_dot_product_attention_math" in _row(out, "sdpa-math", "cpu", "bf16"), out


def test_compare_backends_human_with_progress():
    args = ["compare", "--backend", "sdpa-math,sim-flash", "--seq-len", "32,64", "--heads", "1"]
    res = human(args, codes=(0, 1))  # 1: a budget failed, and the table must say which
    one_line(res.output, "errors vs FP64; ratio = max_abs / baseline's; budget = the peers' rule")
    rows = [
        _row(res.output, b, "cpu", "bf16", n)
        for b in ("sdpa-math", "sim-flash[bf16-mixed, 128x128 fa2]")
        for n in ("32", "64")
    ]
    assert all(re.search(r"│ (pass|FAIL)\s+│", row) for row in rows), res.output
    assert res.exit_code == int(any("FAIL" in row for row in rows)), res.output
    progress_lines(res.stderr, "compare 4/4", "sim-flash bf16 L=64")
    quiet = runner.invoke(app, [*args, "--json"])  # off a terminal, --json prints JSON only
    assert quiet.exit_code == res.exit_code and quiet.stderr == "" and len(json.loads(quiet.output)["backends"]) == 4


@pytest.mark.xdist_group("cli_human_small_study")  # one worker computes the module fixture small_study once
def test_study_and_report_human(small_study):
    out, res = small_study
    from helpers import audited_figures

    one_line(res.output, "4 cases computed, 0 reused from the store")
    with audited_figures(save=False):  # its text is checked here, not its figures' pixels
        rebuilt = human(["report", str(out)])
    findings = json.loads((out / "summary.json").read_text())["findings"]
    assert any(f["status"] != "not measured" for f in findings)
    summary = json.loads((out / "summary.json").read_text())
    for output in (res.output, rebuilt.output):
        one_line(output, "Conclusion")
        for c in summary["conclusion"]:
            one_line(output, f"- {c['text']}")
        for f in findings:
            if f["status"] == "not measured":  # all of them on one line (issue 34)
                assert f["id"] in one_line(output, "not measured by this study (")
            else:
                one_line(output, f"{f['id']}: {f['status']} — {f['claim']}. Measured: {f['measured']}")


def test_a_long_verdict_stays_on_one_line(capsys):
    """Off a terminal a verdict is never wrapped (rich's default would wrap it at 80 columns)."""
    from flashcheck.cli.study import _print_findings

    measured = "1.01x at 32x32; rectangles 1.17x-1.81x (16x64 1.17x, 64x16 1.81x, 32x128 1.52x, 128x32 1.77x)" * 2
    finding = {"id": "square_tiles", "claim": "c", "measured": measured, "holds": False}
    summary = {"findings": [finding], "failed": 0, "failures": []}
    _print_findings(summary, None, "out")
    out = capsys.readouterr().out
    assert ESC not in out
    one_line(out, f"square_tiles: does not hold — c. Measured: {measured}")  # the claim as report.md has it


def _checkpoints(folder: Path, seed: int) -> None:
    folder.mkdir()
    gen = torch.Generator().manual_seed(seed)
    for step in (10, 20):
        state = {"wte.weight": torch.randn(32, 16, generator=gen), "ln.bias": torch.randn(16, generator=gen)}
        torch.save(state, folder / f"step_{step:08d}.pt")


def test_drift_human(tmp_path):
    _checkpoints(tmp_path / "a", 0)
    _checkpoints(tmp_path / "b", 1)
    res = human(["drift", str(tmp_path / "a"), str(tmp_path / "b")])
    one_line(res.output, "weight deviation A vs B")
    for step in ("10", "20"):
        assert re.search(r"\d\.\d{3}e[-+]\d\d", _row(res.output, step)), res.output


@pytest.mark.slow
def test_train_study_human(tmp_path, tiny_train_study_run):
    """`train-study --preset tiny --workers 2`, run once per session (conftest.tiny_train_study_run), checked
    as human() checks a command."""
    res, out = tiny_train_study_run, tiny_train_study_run.folder
    assert res.exit_code == 0 and "Traceback" not in res.output and not res.crashed, res.output
    assert ESC not in res.output, repr(res.output)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == []  # tiny is a smoke test: no verdicts, and it says so
    one_line(res.output, f"no verdicts: {summary['note']}")
    assert not re.search(r": (holds|does not hold|inconclusive) — ", res.output), res.output
    one_line(res.output, f"report: {out}/report.html")
    runs = tmp_path / "runs"  # drift on two of its run folders: their weights by step, not the resume point
    for name in ("flash-s0", "base-s0"):  # copies: the session's folder is read-only for tests
        shutil.copytree(out / "runs" / name, runs / name)
    drift = human(["drift", str(runs / "flash-s0"), str(runs / "base-s0")])
    steps = sorted(int(p.stem.split("_")[-1]) for p in (runs / "flash-s0" / "weights").glob("step_*.pt"))
    assert len(steps) > 2 and all(re.search(rf"^│ {s}\s", drift.output, flags=re.M) for s in steps), drift.output


# ---- off a terminal: no escapes, no highlighting inside numbers --------------------------------------


def test_forced_colour_never_styles_a_number(tmp_path):
    """With colour forced (FORCE_COLOR), styles appear (bold headers) but never around a number: rich's
    highlighter is off, so `21.52x` cannot come out as a coloured `21.` and a plain `52x`."""
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color"}
    outputs = [
        human(["compare", *SMALL], env=env).output,
        human(["explain", *SMALL, "--out", str(tmp_path)], env=env).output,
        human(["backends"], env=env).output,
    ]
    assert all(ESC in out for out in outputs)  # colour really was on
    for out in outputs:
        assert not re.search(r"\x1b\[[0-9;]*m[-+.]?\d", out), repr(out)
        assert not re.search(r"[\d.]\x1b\[", out), repr(out)


def test_installed_script_output_is_plain_and_stderr_quiet(tmp_path):
    """Also the profiler's silence: kineto prints `USDT: ... profiler_start` / `profiler_stop` on every profile
    unless its log level is 6, which backends.profiling.attention_ops sets; this compare profiles twice (one per
    backend) in a fresh interpreter without KINETO_LOG_LEVEL, and its stderr holds progress lines only."""
    exe = shutil.which("flashcheck", path=str(Path(sys.executable).parent)) or "flashcheck"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "KINETO_LOG_LEVEL")}
    res = subprocess.run(
        [exe, "compare", "--backend", "sdpa-math,sdpa-flash", "--seq-len", "32", "--heads", "1"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in res.stderr and ESC not in res.stdout + res.stderr, res.stderr[-2000:]
    assert res.returncode == int("FAIL" in res.stdout), res.stdout  # 1: a budget failed (the table says FAIL)
    assert "USDT" not in res.stderr and "profiler_st" not in res.stderr, res.stderr  # kineto's lines
    progress_lines(res.stderr, "compare 2/2", "sdpa-flash bf16 L=32")
    assert "flash_attention" in _row(res.stdout, "sdpa-flash", "cpu")
    wide = max(len(line) for line in res.stdout.splitlines())
    assert 100 < wide <= 160  # 160 columns off a terminal, not 80


@pytest.mark.parametrize(
    "flags,spec",
    [
        (["--heads", "4", "--kv-heads", "2"], {"heads": 4, "kv_heads": 2, "seq_len": 64}),
        (
            ["--heads", "2", "--seq-len", "4", "--seq-len-k", "96", "--kernel", "splitkv"],
            {"heads": 2, "seq_len": 4, "seq_len_k": 96},
        ),
        (
            ["--heads", "2", "--batch", "2", "--padding", "left:0.25"],
            {"heads": 2, "batch": 2, "seq_len": 64, "padding": "left:0.25"},
        ),
    ],
)
def test_compare_takes_gqa_decoding_and_padding(flags, spec):
    """The new input dimensions reach the measured inputs: the printed rel_l2 is the engine's on that InputSpec."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.compare import CompareConfig, run_compare

    args = ["compare", "--causal", "--block-q", "32", "--block-k", "32", *flags]
    args += [] if "--seq-len" in flags else ["--seq-len", "64"]
    res = human(args)
    kernel = "splitkv" if "splitkv" in flags else "flash"
    cfg = CompareConfig(
        kernel=kernel, numerics="bf16-mixed", inputs=InputSpec(**spec), causal=True, block_q=32, block_k=32
    )
    expected = run_compare(cfg).candidate["rel_l2"]
    assert f"{expected:.3e}" in _row(res.output, "rel_l2"), res.output


def test_doctor_lines_on_a_cuda_build_read_as_words():
    """What doctor prints where CUDA is (drawn here from a report dict): switches and settings in words."""
    from flashcheck.cli.tools import _determinism_line, _sdpa_flags_line

    det = {
        "deterministic_algorithms": True,
        "warn_only": False,
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
    assert _determinism_line(det, True) == (
        "deterministic algorithms: on; cudnn.deterministic on, cudnn.benchmark off, CUBLAS_WORKSPACE_CONFIG :4096:8"
    )
    flags = {"flash": True, "mem_efficient": False, "math": True, "cudnn": False}
    assert _sdpa_flags_line(flags, True) == "SDPA backend switches on: flash, math; off: mem_efficient, cudnn"


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGPIPE"), reason="no SIGPIPE on this platform")
def test_a_pipe_closed_early_is_not_a_failed_check():
    """`flashcheck compare | head -1`: the process ends by SIGPIPE as `cat` would, not with exit code 1."""
    import signal
    import subprocess
    import sys

    code = (
        "import sys; from flashcheck.cli import main; sys.argv = ['flashcheck', 'compare', '--seq-len', '16']; main()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == -signal.SIGPIPE, err
    assert first.startswith(b"flash [bf16-mixed] vs standard") and "Traceback" not in err


@pytest.mark.parametrize(
    "pad,causal,lk", [("right:0.25", False, 48), ("left:0.5", True, 48), ("left:0.5", True, 80), ("left:0.5", True, 32)]
)
def test_compare_padding_says_what_it_counted(pad, causal, lk):
    """The line under a padded comparison: the keys each batch row keeps and the query rows in the errors, the
    same rows the measurement uses (lse finite in the FP64 reference)."""
    from flashcheck.core.inputs import InputSpec, make_mask
    from flashcheck.measure.case import References

    args = ["compare", "--seq-len", "48", "--seq-len-k", str(lk), "--batch", "3", "--heads", "2", "--padding", pad]
    res = human([*args, "--causal"] if causal else args)
    line = one_line(res.output, f"padding {pad}: keys kept per batch row", "query rows (those that see a key")
    spec = InputSpec(batch=3, heads=2, seq_len=48, seq_len_k=lk, padding=pad)
    refs = References(spec, causal=causal)
    live = int(refs.live.sum()) // 2
    kept = make_mask(spec)[:, 0].any(dim=-2).sum(dim=-1).tolist()
    assert f"per batch row {', '.join(map(str, kept))} of {lk};" in line
    assert f"errors over {live} of 144 query rows" in line and live < 144


# ---- the first line: before torch is imported -----------------------------------------------------------------

# A process that ends (exit 42) the moment anything imports torch: what it printed by then is what a person sees
# within the first second or two (torch alone takes 2-8 s to import on a loaded machine).
ENDS_AT_TORCH = """
import os, sys
def _hook(event, args):
    if event == "import" and args[0] == "torch":
        sys.stdout.flush(); sys.stderr.flush(); os._exit(42)
sys.addaudithook(_hook)
from flashcheck.cli import main
sys.argv = ["flashcheck", *sys.argv[1:]]
main()
"""


def _until_torch(args: list[str], cwd: Path, terminal: bool = False) -> subprocess.CompletedProcess:
    """The run of ENDS_AT_TORCH; with `terminal`, its stderr a terminal (a pseudo-terminal read here)."""
    if not terminal:
        return subprocess.run([sys.executable, "-c", ENDS_AT_TORCH, *args], capture_output=True, text=True, cwd=cwd,
                              timeout=120)  # fmt: skip
    import pty

    main, side = pty.openpty()
    try:
        res = subprocess.run([sys.executable, "-c", ENDS_AT_TORCH, *args], stdout=subprocess.PIPE, stderr=side,
                             text=True, cwd=cwd, timeout=120)  # fmt: skip
    finally:
        os.close(side)
    err = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        err += chunk
    os.close(main)
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout, err.decode().replace("\r\n", "\n"))


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["study", "--help"]])
def test_help_and_version_never_import_torch(args, tmp_path):
    """`flashcheck --help` and `--version` finish without importing torch (7.7 s at load 8 did): exit 0."""
    res = _until_torch(args, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() and res.stderr == "", (res.returncode, res.stdout, res.stderr)


@pytest.mark.parametrize(
    "args,first",
    [
        (["study", "--preset", "tiny", "--out", "s"], "study: measuring the tiny preset into s"),
        (["study", "--preset", "serving-tiny", "--out", "s"], "study: measuring the serving-tiny preset into s"),
        (["study", "--preset", "modern", "--out", "s"], "study: measuring the modern preset into s"),
        (["study", "--config", "x.toml", "--out", "s"], "study: measuring the sweep of x.toml into s"),
        (["train-study", "--preset", "tiny", "--out", "t"], "train-study: training the tiny preset's runs into t"),
        (["validate", "--out", "v"], "validate: the bundled all-MiniLM-L6-v2 under eager,sdpa,flash_attention_2"),
        (["validate", "m", "--kv-cache", "fp8", "--out", "v"], "validate: m's generation with KV caches fp8"),
        (["hunt", "sdpa-math", "--budget", "5s", "--out", "h"], "hunt: searching the inputs that break sdpa-math"),
        (["consistency", "sim-fa3"],
         "consistency: certifying sim-fa3 (determinism,batch,batch-prefill,prefill-decode,chunked)"),
    ],
)  # fmt: skip
def test_a_long_command_says_what_it_does_before_torch_loads(args, first, tmp_path):
    """On a terminal, every long command's first line (stderr: stdout stays the result) is printed before torch
    is imported: nothing was printed for 32-43 s before the first progress line. Off a terminal none is (a usage
    error found after the imports stays the one line a script reads)."""
    res = _until_torch(args, tmp_path, terminal=True)
    assert res.returncode == 42, (res.returncode, res.stdout, res.stderr)  # it reached torch ...
    assert res.stdout == "" and res.stderr.splitlines()[0].startswith(first), res.stderr  # ... after its first line
    assert len(res.stderr.splitlines()) == 1 and not list(tmp_path.iterdir()), res.stderr  # nothing written yet
    piped = _until_torch(args, tmp_path)
    assert piped.returncode == 42 and piped.stdout == piped.stderr == "", piped


def test_preset_with_config_is_refused(tmp_path):
    """`study --preset tiny --config x.toml` ran the config alone, silently: now one line and exit 2, before any
    work (the process never imports torch)."""
    res = _until_torch(["study", "--preset", "tiny", "--config", "x.toml"], tmp_path)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr == (
        "error: --preset tiny and --config x.toml: give one of them (a --config file defines its own sweep, so the "
        "preset would not run)\n"
    )


@pytest.mark.parametrize("preset", ["sage2", "sage2pp", "sage1", "fa4-fp4"])
def test_compare_explain_and_predict_describe_a_preset_alike(preset, tmp_path):
    """One description of a preset's input quantisation (measure.substages, as explain's sub-stage rows name
    it) in compare's and predict's lines: compare said sage2's V was int8 where explain showed fp8-e4m3. An
    alias is named as such by all three (sage2 is sage2-hopper)."""
    from flashcheck.kernels.sim.presets import alias_of

    small = ["--seq-len", "64", "--heads", "1", "--head-dim", "32"]
    explained = human(["explain", "--preset", preset, *small, "--out", str(tmp_path / "x")]).output  # one run
    labels = json.loads((tmp_path / "x" / "summary.json").read_text())["substages"]
    inside = f"({labels['input:qk']['label']} and {labels['input:v']['label']})"
    compared = human(["compare", "--preset", preset, *small], codes=(0, 1)).output
    predicted = human(["predict", "--preset", preset, "--seq-len", "64", "--head-dim", "32"]).output
    assert f"this preset quantises its inputs inside the kernel {inside}" in compared, compared
    assert f"this leaves out the kernel's own input quantisation {inside}" in predicted, predicted
    alias = alias_of(preset)
    assert (alias is not None) == (preset in ("sage2", "sage2pp"))
    if alias:
        assert f"sim-flash[{preset}@fp16, alias of {alias}]" in compared
        said = f"(--preset {preset}, an alias of {alias})"
        assert said in one_line(predicted, f"flash:{alias}@fp16") and said in one_line(explained, "dominant stage")


def test_train_study_cpu_seconds_keep_two_digits_below_ten():
    """The tiny train-study printed 'on 2 idle cores about 0 s' (0.4 s rounded to whole seconds: new-user trial)."""
    from flashcheck.cli.training import seconds_text

    assert [seconds_text(x) for x in (263.4, 10.0, 4.21, 0.412, 0.0)] == ["263 s", "10 s", "4.2 s", "0.41 s", "0 s"]
