"""Shared fixtures: a seeded generator; two threads, as on CI; every test must leave torch's process-wide state
(and the environment, and the modules' attributes) as it found it."""

from __future__ import annotations

import json
import operator
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


def _built_once() -> None:
    """typer builds the whole click command tree (every command's signature read and typed, ~30 ms; 56 ms under load)
    at each CliRunner.invoke, and the suite invokes the CLI about 1,500 times: ~20 s of test_bad_input's 60 s. The
    tree is built once per app and set of registered commands and kept, as the installed script builds it once per
    process; click makes a fresh context per invocation from it, as it does for the script. Private typer name
    (typer is pinned in constraints.txt): where it moved, every invoke builds the tree as before."""
    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is None:
        return
    built: dict[int, tuple] = {}

    def get_command(app):
        key = (tuple(map(id, app.registered_commands)), tuple(map(id, app.registered_groups)))
        app_, key_, command = built.get(id(app), (None, None, None))
        if app_ is not app or key_ != key:
            command = build(app)
            built[id(app)] = (app, key, command)  # the app kept alive: its id is never reused for another
        return command

    typer.testing._get_command = get_command


_built_once()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


# --- one tiny study and one tiny train-study per test session (issue 22, item 10) ---------------------------------
# `flashcheck study --preset tiny --workers 2` and `flashcheck train-study --preset tiny --workers 2`, each computed
# once per session through the CLI and shared (study: test_study, test_guide, test_readme; train-study:
# test_training, test_training_robust, test_cli_human); tests copy a folder before changing it. Under pytest-xdist
# the workers share one computation through a file lock in the session's common temporary folder.


@dataclass(frozen=True)
class TinyStudy:
    """A finished tiny study: its folder (read-only for tests: copy it first), the CLI's exit code and output,
    and every figure it saved as (file name, figure_problems, y labels) from tests.helpers.audited_figures."""

    folder: Path
    exit_code: int
    output: str
    figures: list[tuple[str, list[str], list[str]]]


@dataclass(frozen=True)
class TinyTrainStudy(TinyStudy):
    """A finished tiny train-study (human output, no --quiet), as TinyStudy; stdout and stderr apart (the
    progress lines are on stderr), and repr() of the exception the command raised other than SystemExit."""

    stdout: str
    stderr: str
    crashed: str


def _invoke_audited(args: list[str]) -> dict:
    from tests.helpers import audited_figures
    from typer.testing import CliRunner

    from flashcheck.cli import app

    with audited_figures() as seen:
        res = CliRunner().invoke(app, args)
    crashed = "" if res.exception is None or isinstance(res.exception, SystemExit) else repr(res.exception)
    return {"exit_code": res.exit_code, "output": res.output, "stdout": res.stdout, "stderr": res.stderr,
            "crashed": crashed, "figures": seen}  # fmt: skip


def _once_per_session(tmp_path_factory, request, name: str, args: list[str]) -> dict:
    """The result of `flashcheck *args --out FOLDER` (_invoke_audited, plus "folder"), computed once per session."""
    from filelock import FileLock

    worker = getattr(request.config, "workerinput", {}).get("workerid")
    # under xdist every worker's basetemp lies in one folder of this session; alone, our own basetemp
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    root = root / f"{name}-session"
    root.mkdir(exist_ok=True)
    done = root / "run.json"
    with FileLock(str(root / "lock")):
        if not done.is_file():
            out = root / "study"
            done.write_text(json.dumps({"folder": str(out), **_invoke_audited([*args, "--out", str(out)])}))
    data = json.loads(done.read_text())
    data["figures"] = [(name, list(problems), list(ylabels)) for name, problems, ylabels in data["figures"]]
    return data


@pytest.fixture(scope="session")
def fork_server() -> None:
    """This test process's fork server (core.pool.fresh_context: one per process, its modules those of the first
    pool that started it) started with every pool's preload: the study's, the training's (torch._dynamo: 1.0 s
    of CPU in each training worker forked from a server without it) and the hunt's. For the tests that run pools
    in this process (pytestmark of their modules) and the session's tiny studies."""
    from flashcheck.core.pool import fresh_context
    from flashcheck.hunt.isolate import PRELOAD as hunt
    from flashcheck.study.executors import PRELOAD as study
    from flashcheck.training.experiments import PRELOAD as training

    fresh_context(list(dict.fromkeys([*study, *training, *hunt])))


@pytest.fixture(scope="session")
def forked_cli(tmp_path_factory):
    """start(args, *, new_session=False, sigint_default=False) -> tests.helpers.ForkedCLI: `flashcheck ARGS` in a
    process of its own, forked from one interpreter per test process that imported torch and the CLI's commands
    (tests.helpers.cli_forker): for the tests that kill, interrupt or watch a running command, each of which
    started a fresh interpreter (about 2 s of CPU for torch alone)."""
    from tests.helpers import cli_forker

    with cli_forker(tmp_path_factory.mktemp("forked-cli")) as start:
        yield start


@pytest.fixture(scope="session")
def tiny_study_run(tmp_path_factory, request, fork_server) -> TinyStudy:
    data = _once_per_session(tmp_path_factory, request, "tiny-study", ["study", "--preset", "tiny", "--workers", "2"])
    return TinyStudy(Path(data["folder"]), data["exit_code"], data["output"], data["figures"])


@dataclass(frozen=True)
class TinyReport:
    """`flashcheck report` on a copy of the session's tiny study without its report.md: the folder it wrote
    (read-only for tests: copy it first), the CLI's exit code and output, the figures it saved (audited, not
    rasterised: tests.helpers.audited_figures(save=False))."""

    folder: Path
    exit_code: int
    output: str
    figures: list[tuple[str, list[str], list[str]]]


@pytest.fixture(scope="session")
def tiny_report_run(tiny_study_run, tmp_path_factory) -> TinyReport:
    """The session's one `flashcheck report` of the tiny study (test_study and test_guide each rebuilt it, a few
    seconds of CPU each; their tests carry xdist_group("tiny_report"), so that one worker builds it once)."""
    import shutil

    from tests.helpers import audited_figures
    from typer.testing import CliRunner

    from flashcheck.cli import app

    folder = tmp_path_factory.mktemp("tiny-report") / "tiny"
    shutil.copytree(tiny_study_run.folder, folder)
    (folder / "report.md").unlink()
    with audited_figures(save=False) as seen:  # the session's study rendered its PNGs (checked there)
        res = CliRunner().invoke(app, ["report", str(folder)])
    return TinyReport(folder, res.exit_code, res.output, seen)


@pytest.fixture(scope="session")
def tiny_train_study_run(tmp_path_factory, request, fork_server) -> TinyTrainStudy:
    args = ["train-study", "--preset", "tiny", "--workers", "2"]
    data = _once_per_session(tmp_path_factory, request, "tiny-train-study", args)
    return TinyTrainStudy(
        Path(data["folder"]), data["exit_code"], data["output"], data["figures"], data["stdout"], data["stderr"],
        data["crashed"],
    )  # fmt: skip


def _flushes_denormals() -> bool:
    """torch.set_flush_denormal has no getter: a float64 subnormal times one is zero when it is on."""
    return float(torch.tensor([2.0**-1070], dtype=torch.float64) * 1.0) == 0.0


# Each setter takes the value its getter gave (restore after a leak, so one leak fails one test, not the rest).
_SWITCHES = {
    "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
    "torch.are_deterministic_algorithms_enabled()": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
    ),
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.get_default_device()": (torch.get_default_device, torch.set_default_device),
    "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
    "torch.is_inference_mode_enabled()": (torch.is_inference_mode_enabled, None),
    "torch.is_anomaly_enabled()": (
        lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        lambda v: torch.set_anomaly_enabled(*v),
    ),
    "torch.is_autocast_enabled('cpu')": (lambda: torch.is_autocast_enabled("cpu"), None),
    "flush denormal (torch.set_flush_denormal)": (_flushes_denormals, torch.set_flush_denormal),
    "torch.backends.cuda.*_sdp_enabled()": (
        lambda: tuple(getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in ("flash", "mem_efficient", "math")),
        lambda v: [
            getattr(torch.backends.cuda, f"enable_{n}_sdp")(on)
            for n, on in zip(("flash", "mem_efficient", "math"), v, strict=True)
        ],
    ),
    "torch.backends.cuda.matmul.allow_tf32": (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v),
    ),
    "torch.backends.cudnn flags": (
        lambda: (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32),
        lambda v: [
            setattr(torch.backends.cudnn, n, x)
            for n, x in zip(("deterministic", "benchmark", "allow_tf32"), v, strict=True)
        ],
    ),
    "torch.backends.mkldnn.enabled": (
        lambda: torch.backends.mkldnn.enabled,
        lambda v: setattr(torch.backends.mkldnn, "enabled", v),
    ),
    "torch function modes (TorchFunctionMode left entered)": (torch._C._len_torch_function_stack, None),
}
_NAMESPACES = ("torch", "torch.nn.functional")  # plus every flashcheck module loaded before the test
# One-time setup done by the first import of a module, whichever test makes it: not a test's leak. torch._dynamo
# wraps torch.manual_seed, inductor sets its cache folder, torch.profiler Kineto's log level, lightning wraps
# torch.compile and asks for NVML's CUDA check; flashcheck's model loaders set HF_HUB_OFFLINE (no download, ever);
# importing jax sets TF_CPP_MIN_LOG_LEVEL and TPU_SKIP_MDS_QUERY, importing ray RAY_CLIENT_MODE.
_TORCH_LAZY = {
    "RAY_CLIENT_MODE",
    "HF_HUB_OFFLINE",
    "TF_CPP_MIN_LOG_LEVEL",
    "TPU_SKIP_MDS_QUERY",
    "torch.manual_seed",
    "torch.compile",
    "TORCHINDUCTOR_CACHE_DIR",
    "KINETO_LOG_LEVEL",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
}


_TRACKED: list = [0, []]  # len(sys.modules) when last listed, the (name, module) pairs _attributes copies


def _attributes() -> dict[str, dict[str, object]]:
    """A copy of the namespace of torch's main namespaces and of each flashcheck module loaded: a monkeypatch not
    undone (setattr outside the monkeypatch fixture) replaces an attribute (_replaced). Copies, compared by
    identity at the end: per test, a tenth of the time that formatting each attribute's name took. The modules
    are listed again only when sys.modules grew or shrank (listing its ~3000 entries twice per test cost more
    than the copies)."""
    if _TRACKED[0] != len(sys.modules):
        _TRACKED[:] = [len(sys.modules), [
            (name, mod) for name, mod in list(sys.modules.items())
            if mod is not None and (name in _NAMESPACES or name == "flashcheck" or name.startswith("flashcheck."))
        ]]  # fmt: skip
    return {name: dict(vars(mod)) for name, mod in _TRACKED[1]}


def _replaced(before: dict[str, dict[str, object]], after: dict[str, dict[str, object]]) -> list[str]:
    """'MODULE.NAME replaced' for each attribute in both snapshots that is another object now."""
    out = []
    for name, old in before.items():
        new = after.get(name)
        if new is None or (len(new) == len(old) and all(map(operator.is_, old.values(), new.values()))):
            continue  # the same keys in the same order (nothing added or removed), each the same object
        for k, v in old.items():
            if new.get(k, v) is not v and f"{name}.{k}" not in _TORCH_LAZY:
                out.append(f"{name}.{k} replaced")
    return out


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST" and k not in _TORCH_LAZY}


def _switches() -> dict[str, object]:
    return {name: get() for name, (get, _) in _SWITCHES.items()}


def _put_back(before: dict[str, object]) -> list[str]:
    """Sets every switch that differs from `before` back; returns what differed."""
    changed = []
    for name, (get, put) in _SWITCHES.items():
        now = get()
        if now != before[name]:
            changed.append(f"{name}: {before[name]!r} -> {now!r}")
            if put is not None:
                put(before[name])
    return changed


_SESSION = _switches()  # as this file leaves them: what every test starts from


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """torch's intra-op thread count set to 1, then 2, for the test (restored after)."""
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny BERT folder as test_validate builds it (model.safetensors, config and tokenizer files), one per module."""
    pytest.importorskip("transformers")
    from tests.test_validate import _save, _tokenizer
    from transformers import BertConfig, BertModel

    tok = _tokenizer(96)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=96, pad_token_id=0)  # fmt: skip
    return _save(BertModel(cfg).eval(), tok, tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(autouse=True)
def _leaves_global_state_alone(request):
    """Fails (at teardown) the test that changed torch's process-wide switches, an environment variable or a
    module attribute, naming each, after putting the switches back so the tests after it run as they would alone
    (issue 21: a test that left fp32 judged against a changed state made another fail only in the full suite).
    A switch already changed when the test starts was changed by a module- or session-scoped fixture: an error
    at setup."""
    early = _put_back(_SESSION)
    if early:
        pytest.fail(f"a fixture of {request.node.nodeid} changed process-wide state: " + "; ".join(early), False)
    before = _switches()
    attrs, env = _attributes(), _environment()
    yield
    changed = _put_back(before)
    now_attrs = _attributes()
    changed += _replaced(attrs, now_attrs)
    now_env = _environment()
    changed += [f"env {k}: {env.get(k)!r} -> {now_env.get(k)!r}" for k in sorted(env.keys() | now_env.keys())
                if env.get(k) != now_env.get(k)]  # fmt: skip
    for k in env.keys() | now_env.keys():
        if env.get(k) != now_env.get(k):
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
    if changed:
        pytest.fail(f"{request.node.nodeid} left process-wide state changed: " + "; ".join(changed), pytrace=False)


# --- pytest-xdist: the machine's cores shared among the workers (issue 22, item 10) ---------------------------------
# Each worker process gets cores / workers torch threads (and its subprocesses the same OMP_NUM_THREADS), so that
# n workers on n cores do not run 2n threads on n cores. Set once per worker, before any test's state snapshot.


def pytest_configure(config) -> None:
    global _SESSION
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), before any worker starts
        _compile_sources()
        _rewrite_tests(config)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0) or 0)
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        _SESSION = _switches()  # what every test of this worker starts from


def _compile_sources() -> None:
    """Byte-compile flashcheck and the tests' helpers once, before the workers start: where PYTHONDONTWRITEBYTECODE
    is set (CI's machines and this one set it), every fresh interpreter the suite starts (a study's fork server, a
    spawned worker, a script run as users run it: ~150 of them) compiled each flashcheck module it imported again,
    ~0.4 s of CPU each. A folder that cannot be written is left as it is."""
    import compileall
    import re

    root = Path(__file__).resolve().parents[1]
    for folder in (root / "src" / "flashcheck", root / "tests"):
        if folder.is_dir() and os.access(folder, os.W_OK):  # test modules: pytest's own rewritten cache instead
            compileall.compile_dir(folder, quiet=2, workers=1, rx=re.compile(r"[/\\]test_[^/\\]*\.py$"))


def _rewrite_tests(config) -> None:
    """pytest's assertion rewriting of each test module done once, here, and cached as pytest caches it (its pyc
    beside the module), not by every worker as it collects (~5 s of CPU each). pytest writes that cache only
    where bytecode may be written (PYTHONDONTWRITEBYTECODE unset) but reads it always. Private pytest API (pytest is
    pinned in constraints.txt): where it moved, the workers rewrite as before."""
    try:
        from _pytest.assertion import rewrite as rw

        state = config.stash[rw.assertstate_key]
        for fn in sorted(Path(__file__).parent.glob("test_*.py")):
            pyc = rw.get_cache_dir(fn) / (fn.name[:-3] + rw.PYC_TAIL)
            if rw._read_pyc(fn, pyc) is None and rw.try_makedirs(pyc.parent):
                source_hash, code = rw._rewrite_test(fn, config)
                rw._write_pyc(state, code, source_hash, pyc)
    except (ImportError, AttributeError, KeyError, TypeError, OSError):
        return


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """--dist loadgroup, as pytest-xdist meant it: xdist 3.8 marks a grouped test by writing "nodeid@group" to
    Item._nodeid, but pytest 9 reads Item.nodeid from Item._id, so every xdist_group was ignored (a module
    fixture shared by a group was computed again in each worker that drew one of its tests). Runs in each
    worker after xdist's hook; a no-op where nodeid already carries the suffix (pytest < 9) or outside xdist."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        suffixed = item.__dict__.get("_nodeid")
        if isinstance(suffixed, str) and suffixed != item.nodeid and hasattr(type(item._id), "parse"):
            item._id = type(item._id).parse(suffixed)  # Node._id is a slot: the parsed id keeps this string
