"""`flashcheck hunt TARGET --upstream DIR`: per finding a standalone reproducer a maintainer runs without flashcheck,
and a Markdown report of them.

Each script imports only the target's library (torch; jax; onnxruntime) and numpy. It holds the minimal case's
inputs as the library receives them (drawn by flashcheck from the case's seed, embedded as bytes: numpy cannot replay
torch's generator; the mask as the public call gets it; for onnxruntime the one-node ONNX model as exported), prints
the library's versions, the observed errors beside the FP64 reference's and the same-format reference's (the MATH
backend in the dtype; plain attention in the dtype), and exits 1 while the finding reproduces, 0 once fixed: NaN /
Inf where FP64 is finite, or an error over the budget flashcheck's judge computed for that case (the peers' rule,
embedded); a crash or a hang runs the call in a child process. Only findings a maintainer would take get a script:
kernel-bug, crash and hang (a format overflow the spec prescribes and a convention are not bugs of the library)."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import torch

from flashcheck.core.fileio import folder_problem, make_folder, safe_child, write_atomic
from flashcheck.hunt.case import DTYPES, make_inputs
from flashcheck.hunt.store import Finding
from flashcheck.hunt.target import PUBLIC_SDPA, Target, sink_as_key

REPORTED = ("kernel-bug", "crash", "hang")
_OURS = re.compile(r"^(\d\d-[\w-]+\.py|report\.md)$")
RUN_TIMEOUT_S = 300.0


def refusal(target: Target) -> str | None:
    """Why `target` gets no upstream reproducers (None: it does)."""
    if target.kind == "preset":
        return f"target {target.name!r} is flashcheck's own simulator (a preset): no library to report upstream"
    if target.kind == "callable":
        return f"target {target.name!r} is your own function: no upstream library (compare --case reruns its findings)"
    if target.api != "public":
        return f"target {target.name!r} reaches attention through a private op ({target.api}): users cannot call it"
    if _library(target) is None:
        return f"target {target.name!r}: no standalone reproducer is written for this backend yet"
    return None


def _library(target: Target) -> tuple[str, str] | None:
    """(the library part's file, the kernel it calls) of a target, None when there is none."""
    name = target.name.partition(":")[0]
    if name in PUBLIC_SDPA:
        return "torch_sdpa", PUBLIC_SDPA[name]
    if name in ("jax-xla", "jax-cudnn"):
        return "jax_nn", name.removeprefix("jax-")
    if name == "onnxruntime":
        return "onnx_attention", "CPUExecutionProvider"
    return None


def check_folder(path: str | Path, target: Target) -> Path:
    """The --upstream folder, checked before any work: ValueError (one line) when the target has no public API or the
    path is a link, a file, or a folder holding files other than a previous --upstream's."""
    if why := refusal(target):
        raise ValueError(f"--upstream: {why}")
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"--upstream {str(path)!r} is a symbolic link; give a folder of its own")
    problem = folder_problem(path)
    if problem == "does not exist":
        if folder_problem(path.parent or Path(".")) is not None:
            raise ValueError(f"--upstream {str(path)!r}: its parent folder {problem}; create it first")
        return path
    if problem is not None:
        raise ValueError(f"--upstream {str(path)!r} {problem}; give a folder")
    others = sorted(p.name for p in path.iterdir() if not _OURS.match(p.name) or not stat.S_ISREG(os.lstat(p).st_mode))
    if others:
        raise ValueError(f"--upstream {str(path)!r} holds other files ({', '.join(others[:3])}); give an empty folder")
    return path


def _embed(t: torch.Tensor | None) -> dict | None:
    if t is None:
        return None
    a = t.detach().cpu()
    a = a.numpy() if a.dtype == torch.bool else a.to(torch.float64).numpy()
    return {"shape": list(a.shape), "dtype": a.dtype.str, "data": base64.b64encode(a.tobytes()).decode()}


def _inputs(target: Target, f: Finding) -> dict:
    """The case's q, k, v, dout and mask as the library's public call receives them (judge.outputs, Target.call)."""
    from flashcheck.hunt.judge import _rounded

    case = f.case
    q, k, v, dout = make_inputs(case)
    mask, sink = _rounded(case)
    dt = DTYPES[case.dtype]
    q, k, v = (t.to(dt) for t in (q, k, v))
    mask = None if mask is None else mask.to(dt if mask.is_floating_point() else torch.bool)
    causal = case.causal
    if sink is not None:
        k, v, mask = sink_as_key(q, k, v, mask, causal, sink)
        causal = False
    return {"q": q, "k": k, "v": v, "dout": dout.to(dt), "mask": mask, "causal": causal}


def case_data(target: Target, f: Finding, bounds: tuple[float, float]) -> dict:
    """What the script embeds: the inputs as the library gets them, the finding and the judge's bounds."""
    part, kernel = _library(target)  # type: ignore[misc]
    x = _inputs(target, f)
    q, k, mask, causal = x["q"], x["k"], x["mask"], x["causal"]
    extra: dict = {"mask": None, "bias": None, "is_causal": False}
    if part == "torch_sdpa":
        from flashcheck.backends.sdpa import _sdpa_mask

        attn = _sdpa_mask(mask, causal, q, k)
        extra |= {"mask": _embed(attn), "is_causal": causal and attn is None}
    elif part == "jax_nn":
        from flashcheck.backends.jax_xla import _jax_device, _masks, _unjitted

        keep, bias, is_causal = _masks(mask, causal, q.shape[-2], k.shape[-2])
        jit = not _unjitted(q.dtype, _jax_device("cpu"))
        extra |= {"mask": _embed(keep), "bias": _embed(bias), "is_causal": is_causal, "jit": jit}
    else:
        from flashcheck.backends.onnx_rt import _graph, _mask

        attn, is_causal = _mask(mask, causal, q, k)
        attrs = (("is_causal", int(is_causal)),) + ((("scale", float(f.case.call_scale)),) if f.case.scale else ())
        ranks = (attn.dim(),) if attn is not None else ()
        model = _graph(q.dtype, None if attn is None else attn.dtype, attrs, ranks)
        extra |= {"mask": _embed(attn), "is_causal": is_causal, "model": base64.b64encode(model).decode()}
    return {
        "title": title(target, f), "target": target.name, "kind": f.kind, "tensor": f.tensor, "dtype": f.case.dtype,
        "describe": f.case.describe(), "backward": f.case.backward, "scale": f.case.call_scale, "kernel": kernel,
        "bounds": list(bounds), "timeout_s": 120, **{n: _embed(x[n]) for n in ("q", "k", "v", "dout")}, **extra,
    }  # fmt: skip


def title(target: Target, f: Finding) -> str:
    """One line: the public call, what goes wrong, from which logit, on what."""
    what = {"nan": f"NaN in {f.tensor}", "inf": f"Inf in {f.tensor}", "budget": f"{f.tensor} over the error budget"}
    said = f.where if f.kind == "crash" else what.get(f.kind, f"{f.kind} in {f.tensor}")
    logit = "" if f.max_logit is None or f.kind == "crash" else f" at max |logit| {f.max_logit:.3g}"
    return f"{target.via}: {said}{logit} ({f.case.describe()})"


def script(target: Target, f: Finding, bounds: tuple[float, float]) -> str:
    """The reproducer's text: a docstring, the embedded case, the library part, the common part."""
    from importlib import resources

    part, _ = _library(target)  # type: ignore[misc]
    here = resources.files("flashcheck.hunt.repro")
    lib, common = (here.joinpath(f"{n}.py").read_text() for n in (part, "common"))
    data = json.dumps(case_data(target, f, bounds))
    head = (
        f'#!/usr/bin/env python3\n"""{title(target, f)}\n\nA standalone reproducer written by `flashcheck hunt '
        f"{target.name} --upstream` (minimal case: {f.case.to_text()}; its inputs drawn from seed {f.case.seed} and "
        "embedded as bytes). It imports the library and numpy only. It prints the versions, the observed errors, "
        "the FP64 reference's and the same-format reference's; exit 1 while the finding reproduces, 0 once fixed."
        '"""\n'
        f"import json\n\nCASE = json.loads(r'''{data}''')\n\n"
    )
    return head + lib + "\n\n" + common


def write(folder: Path, target: Target, findings: list[Finding], bounds_of) -> list[dict]:
    """A script per reportable finding in `folder` (NN-KIND-TENSOR.py), each run once (its output and exit code kept
    for the report), and report.md. `bounds_of(finding)`: the judge's (max, mean) bounds of its tensor on its case."""
    folder = make_folder(folder, "the --upstream folder")
    done = []
    for i, f in enumerate(findings, 1):
        if f.category not in REPORTED:
            done.append({"finding": f, "skipped": f"category {f.category or 'unknown'}: not a bug of the library"})
            continue
        path = safe_child(folder, f"{i:02d}-{f.kind}-{f.tensor.replace(' ', '-')}.py", "a reproducer's file name")
        write_atomic(path, script(target, f, bounds_of(f)))
        done.append({"finding": f, "path": path, **run(path)})
    write_atomic(folder / "report.md", report(target, done))
    return done


def run(path: Path) -> dict:
    """Run a reproducer as a maintainer would (a fresh interpreter, flashcheck not on its path): exit code, output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    try:
        p = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, timeout=RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"exit": None, "output": f"no answer in {RUN_TIMEOUT_S:g} s"}
    text = (p.stdout + p.stderr).decode("utf-8", "replace")
    return {"exit": p.returncode, "output": "".join(c for c in text if c.isprintable() or c == "\n")[-4000:]}


def report(target: Target, done: list[dict]) -> str:
    """report.md: per finding a title, the environment, expected vs observed (the script's own output), the script."""
    import platform

    lines = [f"# Findings of `flashcheck hunt {target.name}`, for upstream", ""]
    lines += [f"Environment: Python {platform.python_version()} on {platform.platform()}; call: {target.via}.", ""]
    for d in done:
        f = d["finding"]
        lines += [f"## {title(target, f)}", ""]
        if "skipped" in d:
            lines += [f"No reproducer: {d['skipped']}.", ""]
            continue
        lines.append(f"- category: {f.category}; api: {f.api}" + (f"; known: {f.known}" if f.known else ""))
        lines.append("- expected: the FP64 reference, within the error of the same-format reference (the budget)")
        lines += [f"- observed (the reproducer's output when written; exit {d['exit']}):", "", "```"]
        lines += [
            d["output"].strip(),
            "```",
            "",
            f"Reproducer: `python {d['path'].name}` (the library and numpy only).",
            "",
        ]
    return "\n".join(lines) + "\n"
