"""Every `flashcheck ...` command line in README.md and the docs site (docs/**/*.md) runs: exit 0, no traceback, as
a new user types it; and the docs keep up with the command line: every option of `flashcheck CMD --help` is on CMD's
page, every page is in the mkdocs nav, the README stays a short front door whose links and table point at real pages
and lines.

Each line runs in this process through the CLI's app (typer's CliRunner, in the line's folder; C-level
stderr caught by capfd), not through the installed script: a fresh interpreter per line cost ~4 s of torch
import each; `train-study` too (its pool's workers fork from a fresh fork server, core.pool.fresh_context, never
from this process, whatever threads earlier lines left here). The installed script itself (its plain output, quiet
stderr) is test_cli_human's test_installed_script_output_is_plain_and_stderr_quiet.

Lines come from the bash blocks of README.md and of every docs page (backslash continuations joined, `&&` chains
split, comments dropped); a line that several pages show, or that is the same line once made small, runs once. Sizes
are made small by explicit rewrites (`small`): `--preset tiny` where a study or training
preset is implied, `--size tiny` for `mutants`, `--seq-len` values 64, 128, ..., `--seq-len-k 256` and `--heads 1`; the
docs' TOML sweep gets `seq_lens = [64, 128]`. Folders a line reads (`DIR`, `RUN_A/ RUN_B/`) are made
before it runs.
`validate` gets `--samples 4 --max-length 16`, and `--check-pin` a pin of this environment; the `validate` lines
that run a model share one folder, in order, as a reader's would; models.md's decoder is built narrower (its heads,
width 128, 2 layers). `hunt` gets `--budget 1s`. `train-study` (the tiny preset) resumes a copy of the session's
tiny train-study (conftest.tiny_train_study_run), whose runs it would train again, as `study` resumes the tiny study;
an absolute --out (/tmp/...) is a folder of the test's own, under the same name."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tests.helpers import figures_from

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
STUDY_ARGS = ("--preset", "--config")
# a preset the docs show -> the preset its line runs in the test: the same questions at toy sizes
SMALL_PRESETS = {
    **{("study", p): "tiny" for p in ("quick", "paper", "fa3", "full", "production", "modern")},
    **{("study", p): "guide-tiny" for p in ("guide", "guide-full")},
    ("study", "serving"): "serving-tiny",
    **{("train-study", p): "tiny" for p in ("quick", "paper", "full")},
}


def doc_pages() -> list[Path]:
    """Every page of the docs site, sorted."""
    return sorted(DOCS.rglob("*.md"))


def _blocks(lang: str) -> list[str]:
    """The fenced `lang` blocks of README.md, then of every docs page."""
    return [b for path in (README, *doc_pages()) for b in re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(),
                                                                    flags=re.S | re.M)]  # fmt: skip


def readme_commands() -> list[str]:
    """Every `flashcheck ...` command of the bash blocks of README.md and the docs, in order, once each, without
    comments."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "flashcheck":
                    commands.append(shlex.join(words))
    return list(dict.fromkeys(commands))


def small(words: list[str]) -> list[str]:
    """The command at a test size: the same command and flags, smaller work."""
    cmd, args = words[1], list(words[2:])
    if cmd in ("study", "train-study") and not any(a in args for a in STUDY_ARGS):
        args += ["--preset", "tiny"]
    if cmd in ("study", "train-study") and "--preset" in args:
        i = args.index("--preset") + 1
        args[i] = SMALL_PRESETS.get((cmd, args[i]), args[i])
    if cmd == "consistency" and "--max-batch" in args:
        args[args.index("--max-batch") + 1] = "4"
    if cmd == "validate" and "--kv-cache" in args:
        for flag, value in (("--prompts", "2"), ("--new-tokens", "4")):
            if flag in args:
                args[args.index(flag) + 1] = value
    if cmd == "mutants":
        args = [a for i, a in enumerate(args) if a != "--size" and (i == 0 or args[i - 1] != "--size")]
        args += ["--size", "tiny"]
    if cmd == "validate" and "--check-pin" not in args:
        for flag, value in (("--samples", "4"), ("--max-length", "16")):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
    if cmd == "hunt":
        args = [a for i, a in enumerate(args) if a != "--budget" and (i == 0 or args[i - 1] != "--budget")]
        args += ["--budget", "1s"]
    if cmd in ("compare", "explain") and "--case" not in args:
        if "--seq-len" in args:
            i = args.index("--seq-len") + 1
            args[i] = ",".join(str(64 << n) for n in range(len(args[i].split(","))))
        else:
            args += ["--seq-len", "64"]
        if "--heads" not in args:
            args += ["--heads", "1"]
        if "--seq-len-k" in args:  # a KV cache of 8192 keys: 256 (still above the 64 queries)
            # with --splits S, enough 128-key blocks for the largest S (compare refuses S above the blocks)
            most = max(map(int, args[args.index("--splits") + 1].split(","))) if "--splits" in args else 2
            args[args.index("--seq-len-k") + 1] = str(max(256, 128 * most))
    return [words[0], cmd, *args]


def _readme_sweep() -> str:
    (toml,) = _blocks("toml")  # the docs' one sweep, which `study --config sweep.toml` runs
    shrunk, n = re.subn(r"^seq_lens = \[[^\]]*\]", "seq_lens = [64, 128]", toml, flags=re.M)
    assert n == 1, "the docs' sweep has no seq_lens line to shrink"
    return shrunk


def _checkpoints(folder: Path, seed: int) -> None:
    """Two steps of a small model's weights, named by step as the README's recorders save them."""
    folder.mkdir()
    gen = torch.Generator().manual_seed(seed)
    for step in (10, 20):
        state = {"wte.weight": torch.randn(32, 16, generator=gen), "ln.bias": torch.randn(16, generator=gen)}
        torch.save(state, folder / f"step_{step:08d}.pt")


def _finished(run) -> Path:
    """The folder of a session run (conftest.tiny_study_run, tiny_train_study_run: once per session) that
    finished, for the lines that read or resume it."""
    assert run.exit_code == 0, run.output
    return run.folder


TINY_TRAIN_STUDY = ["train-study", "--preset", "tiny"]  # the line whose runs the session's tiny train-study trained


def _session_run(words: list[str]) -> str | None:
    """The session fixture whose finished folder the line works on a copy of: the tiny study (`report DIR`,
    `study --out DIR`, `study`), the tiny train-study (`train-study`: its runs are complete, so the line
    resumes them to the analysis and the report), or None."""
    if "DIR" in words or words[1:] == ["study", "--preset", "tiny"]:
        return "tiny_study_run"
    return "tiny_train_study_run" if _train_study_out(words) else None


def _train_study_out(words: list[str]) -> str | None:
    """The folder of a tiny train-study line (`train-study`, `train-study --preset tiny --out FOLDER`), else None."""
    if words[1:4] != TINY_TRAIN_STUDY or len(words) not in (4, 6) or (len(words) == 6 and words[4] != "--out"):
        return None
    return words[5] if len(words) == 6 else "flashcheck-train-study-tiny"


def _in_cwd(words: list[str], cwd: Path) -> list[str]:
    """The line with an absolute --out (the docs' /tmp/flashcheck-train-tiny) in `cwd`, under its own name: a
    folder of this test, not one every session on the machine shares (a train-study resumes what it finds there,
    and refuses a folder another holds)."""
    if "--out" in words and Path(words[words.index("--out") + 1]).is_absolute():
        i = words.index("--out") + 1
        return [*words[:i], str(cwd / Path(words[i]).name), *words[i + 1 :]]
    return words


def _prepare(words: list[str], cwd: Path, session_folder: Callable[[], Path]) -> None:
    """Make what the line reads in `cwd`; session_folder() asked only by the lines that read it (the folder of
    the session's run _session_run names: a worker that asks for it while another computes it waits)."""
    if "DIR" in words:
        shutil.copytree(session_folder(), cwd / "DIR")
    if words[1:] == ["study", "--preset", "tiny"]:  # the fixture computed this study: resume it
        shutil.copytree(session_folder(), cwd / "flashcheck-study-tiny")
    if _train_study_out(words):  # the fixture trained these runs (--workers 2): resume them
        shutil.copytree(session_folder(), cwd / _train_study_out(words))
    if "--config" in words:
        (cwd / words[words.index("--config") + 1]).write_text(_readme_sweep())
    for run, seed in (("RUN_A/", 0), ("RUN_B/", 1)):
        if run in words:
            _checkpoints(cwd / run.rstrip("/"), seed)
    if words[1] == "judge":  # the file the README's numpy-only lines write, from a framework's arrays
        _dump_as_the_readme_says(cwd)
    decoder = words[1] == "validate" and len(words) > 2 and "llama" in words[2]  # models.md's sim: decoder line
    if decoder and "--kv-cache" not in words:  # as models.md makes it: benchmarks/make_tiny_decoder.py (a tokenizer)
        import runpy

        # its heads (8 query, 2 key/value, dim 64: what the kernel sees), narrower: width 128, 2 layers
        make = runpy.run_path(str(README.parent / "benchmarks" / "make_tiny_decoder.py"))["make"]
        make(cwd / words[2], hidden=128, layers=2)
    elif "--kv-cache" in words:  # the decoder folder the line names: a tiny Llama built from a config
        _tiny_llama(cwd / words[2])
    if _seeded_cache(words, cwd):  # the eager runs the first `validate` line cached, in this line's --out
        shutil.copytree(cwd / "flashcheck-validate" / "cache", _seeded_cache(words, cwd))
    if "--check-pin" in words:  # the pin an earlier `validate --pin` wrote, of this environment
        from flashcheck.core.environment import environment_fingerprint, write_pin

        write_pin(cwd / words[words.index("--check-pin") + 1], environment_fingerprint())


def _seeded_cache(words: list[str], cwd: Path) -> Path | None:
    """The cache folder of a `validate` line of the bundled model with an --out of its own (`--out my-check`, the
    sim: lines' `--out fc-models`) where the README's first `validate` line cached its eager runs in this folder
    (flashcheck-validate/cache: every line of the bundled model at the test's --samples 4 --max-length 16 has the
    same eager runs, the cache's key being the model, the texts and the settings); else None. Such a line starts
    from a copy of that cache: its own implementations, judging and report run, the eager runs it would compute
    again are read (computing them is the first line's, reading them `validate --pin`'s), ~2 s of CPU each."""
    if words[1] != "validate" or words[2:3] == [] or not words[2].startswith("--") or "--out" not in words:
        return None
    out = cwd / words[words.index("--out") + 1]
    has = (cwd / "flashcheck-validate" / "cache").is_dir() and out.name != "flashcheck-validate"
    return out / "cache" if has and not (out / "cache").exists() else None


def _tiny_llama(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(folder)


def _dump_as_the_readme_says(cwd: Path) -> None:
    """Run the README's dump lines (the python block that calls save_file) on numpy arrays, in `cwd`."""
    import numpy as np

    (block,) = [b for b in _blocks("python") if "save_file(" in b]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 64, 16)).astype(np.float32) for _ in range(3))
    s = np.tril(q @ k.transpose(0, 1, 3, 2) / 4) + np.triu(np.full((64, 64), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    names = {"q": q, "k": k, "v": v, "out": (p / p.sum(-1, keepdims=True)) @ v, "scale": 0.25}
    cwd_before = os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(block, "README.md", "exec"), names)
    finally:
        os.chdir(cwd_before)


def test_the_readme_dump_lines_write_a_file_judge_accepts(tmp_path: Path):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    line = next(c for c in readme_commands() if c.startswith("flashcheck judge"))  # the first: the file alone
    _dump_as_the_readme_says(tmp_path)
    res = CliRunner().invoke(app, [*shlex.split(line)[1:-1], str(tmp_path / shlex.split(line)[-1])])
    assert res.exit_code == 0 and "pass" in res.output, res.output


def test_the_readme_documents_every_command():
    """Every command is in a command line of the README or the docs (so it runs in test_readme_command_runs)."""
    names = set(_commands())
    documented = {shlex.split(c)[1] for c in readme_commands()}
    assert names <= documented, f"not in a README command line: {sorted(names - documented)}"
    assert len(readme_commands()) >= len(names)


def _shares_a_folder(line: str) -> bool:
    """The README's `validate` lines that run a model: one folder for all, in the README's order, as a reader
    runs them (`validate --pin` then takes the eager runs `validate` cached in flashcheck-validate/; alone,
    e.g. under -k, a line computes them itself)."""
    words = shlex.split(line)
    return words[1] == "validate" and "--check-pin" not in words


@pytest.fixture(scope="module")
def validate_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("validate")


def _readme_params() -> list:
    """One param per line that differs once made small (a line shown on several pages, or at two sizes that
    `small` makes one, runs once)."""
    shared = pytest.mark.xdist_group("readme_validate")  # one worker, in order: the cache of the first serves
    lines = {}
    for line in readme_commands():
        lines.setdefault(shlex.join(small(shlex.split(line))), line)
    return [pytest.param(line, marks=[shared] if _shares_a_folder(line) else []) for line in lines.values()]


@pytest.mark.slow
@pytest.mark.parametrize("line", _readme_params(), ids=lambda line: line[11:][:90])
def test_readme_command_runs(line: str, tmp_path: Path, request, monkeypatch, capfd):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    cwd = request.getfixturevalue("validate_folder") if _shares_a_folder(line) else tmp_path
    words = _in_cwd(small(shlex.split(line)), cwd)
    session = _session_run(words)
    _prepare(words, cwd, lambda: _finished(request.getfixturevalue(session)))
    for name in ("FORCE_COLOR", "KINETO_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(cwd)
    # a copy of a session run's folder: the line rebuilds the report the fixture rendered (and audited) from
    # the same records; its figures are copied from the fixture's, not rasterised again, and must be the same
    study = request.getfixturevalue(session) if session else None
    capfd.readouterr()
    with figures_from(study.folder / "figures") if study else contextlib.nullcontext([]) as saved:
        run = CliRunner().invoke(app, words[1:])
    low = capfd.readouterr()  # what C code (Kineto, XLA) wrote to the file descriptors themselves
    crashed = "" if run.exception is None or isinstance(run.exception, SystemExit) else repr(run.exception)
    err = run.stderr + low.out + low.err + crashed
    res = SimpleNamespace(returncode=run.exit_code, stdout=run.stdout, stderr=err)
    shown = f"{shlex.join(words)}\nexit {res.returncode}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    assert not crashed, shown
    if study is not None:
        assert sorted(saved) == sorted(name for name, _, _ in study.figures), shown
    # documented: `compare --backend` exits 1 when a budget fails, and its table then says FAIL
    expected = int("FAIL" in res.stdout) if "--backend" in words and "--json" not in words else 0
    if words[1] == "consistency":  # documented: exit 1 when a certificate does not hold, and it then says FAILS
        expected = int("FAILS" in res.stdout)
    if words[1] == "validate" and "sim:" in " ".join(words):  # documented (models.md): a simulated FP8/FP4 kernel
        expected = int("FAIL" in res.stdout)  # may fail the model's tolerance: exit 1, and its table says FAIL
    if words[1] == "hunt":  # documented: exit 1 when it finds something, and it then says FAIL
        expected = int("FAIL:" in res.stdout)
    assert res.returncode == expected, shown
    assert "Traceback" not in res.stdout + res.stderr, shown
    assert "USDT" not in res.stderr and "\x1b[" not in res.stdout + res.stderr, shown
    if "--json" in words:
        json.loads(res.stdout)
    else:
        assert res.stdout.strip(), shown


# ---- the docs keep up with the command line ------------------------------------------------------------------------

# pages other work writes (each says which); this site lists them in its nav
PAGES_OF_OTHERS = {"findings.md", "models.md", "training-claim.md", "architecture-native.md"}


def _help_options(command: str) -> list[str]:
    """The options `flashcheck COMMAND --help` shows (both names of an on/off pair), --help left out."""
    from typer.testing import CliRunner

    from flashcheck.cli import app

    res = CliRunner().invoke(app, [command, "--help"])
    assert res.exit_code == 0, res.output
    options = res.stdout.split("\nOptions:\n", 1)[1]
    # an option's line starts with two spaces and a dash; its names end at the first run of two spaces
    names = [n for line in options.splitlines() if line.startswith("  -")
             for n in re.findall(r"--[a-z0-9][a-z0-9-]*", re.split(r"\s{2,}", line.strip())[0])]  # fmt: skip
    return [n for n in dict.fromkeys(names) if n != "--help"]


def _commands() -> list[str]:
    """The commands `flashcheck --help` lists (however the app registers them)."""
    from typer.testing import CliRunner

    from flashcheck.cli import app

    res = CliRunner().invoke(app, ["--help"])
    listed = res.stdout.split("\nCommands:\n", 1)[1]
    names = re.findall(r"^  ([a-z][a-z0-9-]*)(?:\s|$)", listed, flags=re.M)
    assert len(names) >= 14, res.stdout  # study ... validate: the commands of today at least
    return names


@pytest.mark.parametrize("command", _commands())
def test_every_option_of_a_command_is_on_its_page(command: str):
    """A new flag without documentation fails: each option --help shows is named on docs/commands/COMMAND.md."""
    page = DOCS / "commands" / f"{command}.md"
    assert page.is_file(), f"{command} has no page: {page.relative_to(ROOT)}"
    text = page.read_text()
    missing = [o for o in _help_options(command) if not re.search(rf"{re.escape(o)}(?![a-z0-9-])", text)]
    assert not missing, f"{page.relative_to(ROOT)} does not name {missing}"


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists (paths under docs/)."""
    nav = MKDOCS.read_text().split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, flags=re.M)


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    pages = {str(p.relative_to(DOCS)) for p in doc_pages()}
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), f"listed twice in the nav: {sorted(n for n in nav if nav.count(n) > 1)}"
    assert pages - set(nav) == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"
    assert set(nav) - pages == set(), f"nav entries with no page: {sorted(set(nav) - pages)}"
    assert set(nav) >= PAGES_OF_OTHERS


def test_the_readme_is_a_short_front_door():
    """At most 200 lines; its first block installs and runs the study, then installs and runs the tests (CI's
    line); no internal issue numbers; every link into docs/ names a page that exists."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    first = _blocks("bash")[0].splitlines()
    assert first[0].startswith("python3 -m venv ") and first[0].endswith("&& flashcheck study"), first[0]
    assert re.match(r"^python3 -m venv .*pytest", first[1]), first[1]
    links = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert len(links) >= 10, links
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_readme_table_commands_are_lines_that_run():
    """Each command of the README's "I want to…" table is a line of some bash block (so test_readme_command_runs
    runs it)."""
    text = README.read_text()
    table = [line for line in text.splitlines() if line.startswith("|") and "`flashcheck " in line]
    shown = [shlex.join(shlex.split(c)) for line in table for c in re.findall(r"`(flashcheck [^`]+)`", line)]
    assert len(shown) >= 10, shown
    assert [c for c in shown if c not in readme_commands()] == []


def test_no_internal_issue_numbers_in_the_docs():
    """A reader never meets "issue 23": the README and every docs page this site owns speak of features, not of
    the tracker."""
    for path in (README, *(p for p in doc_pages() if p.name not in PAGES_OF_OTHERS)):
        found = re.findall(r"\b[Ii]ssues? #?\d+", path.read_text())
        assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_the_study_page_counts_each_presets_cases():
    """The "cases" column of docs/commands/study.md is each preset's count today (its sweeps' distinct cases, as the
    study computes them), so a preset that grows does not leave a stale number behind."""
    from flashcheck.study.cases import expand_sweep
    from flashcheck.study.config import preset

    page = (DOCS / "commands" / "study.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)`[^|]*\| (\d+) \|", page, flags=re.M)
    assert len(rows) >= 8, rows
    for name, cases in rows:
        assert len({c.case_id for s in preset(name).sweeps for c in expand_sweep(s)}) == int(cases), name
