"""Every `flashcheck ...` command line in README.md runs: exit 0, no traceback, as a new user types it.

Each line runs in this process through the CLI's app (typer's CliRunner, in the line's folder; C-level
stderr caught by capfd), not through the installed script: a fresh interpreter per line cost ~4 s of torch
import each; `train-study` (FRESH) still runs in one. The installed script itself (its plain output, quiet
stderr) is test_cli_human's test_installed_script_output_is_plain_and_stderr_quiet.

Lines come from the README's bash blocks (backslash continuations joined, `&&` chains split, comments
dropped). Sizes are made small by explicit rewrites (`small`): `--preset tiny` where a study or training
preset is implied, `--size tiny` for `mutants`, `--seq-len` values 64, 128, ..., `--seq-len-k 256` and `--heads 1`; the
README's TOML sweep gets `seq_lens = [64, 128]`. Folders a line reads (`DIR`, `RUN_A/ RUN_B/`) are made
before it runs.
`validate` gets `--samples 8 --max-length 32`, and `--check-pin` a pin of this environment; the `validate` lines
that run a model share one folder, in order, as a reader's would."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tests.helpers import figures_from

README = Path(__file__).resolve().parents[1] / "README.md"
STUDY_ARGS = ("--preset", "--config")
FLASHCHECK = shutil.which("flashcheck", path=str(Path(sys.executable).parent)) or shutil.which("flashcheck")
# run through the installed script: train-study's pool forks (the default start method), and a fork of a
# process that earlier lines left with JAX's or XLA's threads can deadlock
FRESH = {"train-study"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def readme_commands() -> list[str]:
    """Every `flashcheck ...` command of the README's bash blocks, in order, once each, without comments."""
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
    if cmd == "study" and "--preset" in args and args[args.index("--preset") + 1] in ("guide", "guide-full"):
        args[args.index("--preset") + 1] = "guide-tiny"
    if cmd == "study" and "--preset" in args and args[args.index("--preset") + 1] == "serving":
        args[args.index("--preset") + 1] = "serving-tiny"
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
        for flag, value in (("--samples", "8"), ("--max-length", "32")):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
    if cmd == "hunt":
        args[args.index("--budget") + 1] = "2s"
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
    (toml,) = _blocks("toml")
    shrunk, n = re.subn(r"^seq_lens = \[[^\]]*\]", "seq_lens = [64, 128]", toml, flags=re.M)
    assert n == 1, "the README's sweep has no seq_lens line to shrink"
    return shrunk


def _checkpoints(folder: Path, seed: int) -> None:
    """Two steps of a small model's weights, named by step as the README's recorders save them."""
    folder.mkdir()
    gen = torch.Generator().manual_seed(seed)
    for step in (10, 20):
        state = {"wte.weight": torch.randn(32, 16, generator=gen), "ln.bias": torch.randn(16, generator=gen)}
        torch.save(state, folder / f"step_{step:08d}.pt")


@pytest.fixture
def tiny_study(tiny_study_run) -> Path:
    """A finished tiny study (`flashcheck study --preset tiny`, once per session: conftest.tiny_study_run) for
    the lines that read or resume one: `report DIR`, `study --out DIR`, `study` (whose default folder it is
    copied to)."""
    assert tiny_study_run.exit_code == 0, tiny_study_run.output
    return tiny_study_run.folder


def _reads_tiny_study(words: list[str]) -> bool:
    """The line works on a copy of the session's tiny study (`report DIR`, `study --out DIR`, `study`)."""
    return "DIR" in words or words[1:] == ["study", "--preset", "tiny"]


def _prepare(words: list[str], cwd: Path, tiny_study: Callable[[], Path]) -> None:
    """Make what the line reads in `cwd`; tiny_study() asked only by the lines that read it (the session's
    tiny study: a worker that asks for it while another computes it waits)."""
    if "DIR" in words:
        shutil.copytree(tiny_study(), cwd / "DIR")
    if words[1:] == ["study", "--preset", "tiny"]:  # the fixture computed this study: resume it
        shutil.copytree(tiny_study(), cwd / "flashcheck-study-tiny")
    if "--config" in words:
        (cwd / words[words.index("--config") + 1]).write_text(_readme_sweep())
    for run, seed in (("RUN_A/", 0), ("RUN_B/", 1)):
        if run in words:
            _checkpoints(cwd / run.rstrip("/"), seed)
    if words[1] == "judge":  # the file the README's numpy-only lines write, from a framework's arrays
        _dump_as_the_readme_says(cwd)
    if "--kv-cache" in words:  # the decoder folder the line names: a tiny Llama built from a config
        _tiny_llama(cwd / words[2])
    if "--check-pin" in words:  # the pin an earlier `validate --pin` wrote, of this environment
        from flashcheck.core.environment import environment_fingerprint, write_pin

        write_pin(cwd / words[words.index("--check-pin") + 1], environment_fingerprint())


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

    (line,) = [c for c in readme_commands() if c.startswith("flashcheck judge")]
    _dump_as_the_readme_says(tmp_path)
    res = CliRunner().invoke(app, [*shlex.split(line)[1:-1], str(tmp_path / shlex.split(line)[-1])])
    assert res.exit_code == 0 and "pass" in res.output, res.output


def test_the_readme_documents_every_command():
    from flashcheck.cli import app

    names = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
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
    shared = pytest.mark.xdist_group("readme_validate")  # one worker, in order: the cache of the first serves
    return [pytest.param(line, marks=[shared] if _shares_a_folder(line) else []) for line in readme_commands()]


@pytest.mark.slow
@pytest.mark.parametrize("line", _readme_params(), ids=lambda line: line[11:][:90])
def test_readme_command_runs(line: str, tmp_path: Path, request, monkeypatch, capfd):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    words = small(shlex.split(line))
    cwd = request.getfixturevalue("validate_folder") if _shares_a_folder(line) else tmp_path
    _prepare(words, cwd, lambda: request.getfixturevalue("tiny_study"))
    for name in ("FORCE_COLOR", "KINETO_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(cwd)
    study = None
    if words[1] in FRESH:
        res = subprocess.run([FLASHCHECK, *words[1:]], capture_output=True, text=True, timeout=600)
        crashed = ""
    else:
        # a copy of the session's tiny study: the line rebuilds the report the fixture rendered (and audited)
        # from the same records; its figures are copied from the fixture's, not rasterised again, and must be
        # the same figures
        if _reads_tiny_study(words):
            study = request.getfixturevalue("tiny_study_run")
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
    if words[1] == "hunt":  # documented: exit 1 when it finds something, and it then says FAIL
        expected = int("FAIL:" in res.stdout)
    assert res.returncode == expected, shown
    assert "Traceback" not in res.stdout + res.stderr, shown
    assert "USDT" not in res.stderr and "\x1b[" not in res.stdout + res.stderr, shown
    if "--json" in words:
        json.loads(res.stdout)
    else:
        assert res.stdout.strip(), shown
