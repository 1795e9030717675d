"""The reference and format-context runs (eager in each dtype) cached in the output folder and reused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path

import torch

from flashcheck.core.fileio import LinkRefused, make_folder, open_own, refuse_link, write_atomic
from flashcheck.validate.run import Plan, RunOutput

CACHE_VERSION = 4  # 4: generations carry teacher-forced logprobs (KL per position)
WHAT = "validate's cache folder"


def cache_file(out: str | Path, impl: str, dtype: str, key: dict) -> Path:
    """out/cache/{impl}-{dtype}-{hash}.pt; the hash covers every input that changes the run's numbers."""
    text = json.dumps({"v": CACHE_VERSION, "impl": impl, "dtype": dtype, **key}, sort_keys=True, default=str)
    return Path(out) / "cache" / f"{impl}-{dtype}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.pt"


def load_run(path: Path) -> RunOutput | None:
    """The cached run, or None when absent or unreadable (a damaged file is ignored with a warning). A cached file
    or cache/ folder that is a link is refused (LinkRefused): no run is trusted from elsewhere."""
    refuse_link(path.parent, WHAT)
    if not os.path.lexists(path):
        return None
    try:
        with open_own(path, "a cached run of validate") as f:
            return RunOutput.from_state(torch.load(f, map_location="cpu", weights_only=True))
    except LinkRefused:
        raise
    except Exception as e:  # any damage (truncated file, old layout) means: compute again
        first = (str(e).strip().splitlines() or [""])[0]  # torch's messages run to many lines
        warnings.warn(f"ignoring the damaged cache file {str(path)!r}: {type(e).__name__}: {first}", stacklevel=2)
        return None


def save_run(path: Path, run: RunOutput) -> None:
    """Write the run atomically (folders made; never into a linked cache/ folder nor through a link)."""
    make_folder(path.parent, WHAT)
    buf = io.BytesIO()
    torch.save(run.to_state(), buf)
    write_atomic(path, buf.getvalue())


def run_fits(
    run: RunOutput, plan: Plan, impl: str, dtype: str, probe_only: bool, layout: tuple[int, int] | None = None
) -> str:
    """'' when a cached run has the layout the plan's own run would have, else what differs: the cache key covers
    every input, so only a damaged or hand-made file differs (its values cannot be checked; its shapes can).
    layout: (hidden states, width) of the model (model_layout), or None where its config does not say."""
    batches = plan.probe_batches if probe_only else plan.batches
    ids = sorted(t for b in batches for t in b.texts)
    probe = set(plan.probe)

    def tensor(x, dims: int, what: str) -> str:
        ok = isinstance(x, torch.Tensor) and x.dim() == dims and x.device.type == "cpu"
        return "" if ok else f"{what} is not a {dims}-D tensor"

    why = [
        "" if (run.impl, run.dtype, run.probe_only) == (impl, dtype, probe_only) else "another run's file",
        tensor(run.emb_ids, 1, "emb_ids") or ("" if run.emb_ids.tolist() == ids else "emb_ids are not the plan's"),
        tensor(run.emb, 2, "emb") or ("" if run.emb.shape[0] == len(ids) else "emb has another row count"),
        tensor(run.norms, 1, "norms") or ("" if run.norms.shape[0] == len(ids) else "norms has another length"),
        tensor(run.probe_ids, 1, "probe_ids") or ("" if set(run.probe_ids.tolist()) <= probe else "foreign probe ids"),
    ]
    layers = run.probe if isinstance(run.probe, list) else None
    if not layers or any(tensor(h, 2, "a probe layer") for h in layers):
        why.append("probe is not a list of 2-D tensors")
    elif isinstance(run.probe_ids, torch.Tensor) and {tuple(h.shape) for h in layers} != {
        (run.probe_ids.shape[0], layers[0].shape[1])
    }:
        why.append("the probe layers' shapes differ from probe_ids'")
    else:
        width = layers[0].shape[1]
        if isinstance(run.emb, torch.Tensor) and run.emb.dim() == 2 and run.emb.shape[1] != width:
            why.append(f"emb is {run.emb.shape[1]} wide, its hidden states {width}")  # emb pools the last one
        if layout is not None and (len(layers), width) != layout:
            why.append(f"{len(layers)} hidden states {width} wide, the model's are {layout[0]} of {layout[1]}")
    for name, dims in (("argmax", 1), ("last_logits", 2)):
        value = getattr(run, name)
        if value is not None and tensor(value, dims, name):
            why.append(tensor(value, dims, name))
    if run.generation is not None and not (
        isinstance(run.generation, list) and len(run.generation) == len(plan.prompts)
    ):
        why.append("generation is not one entry per prompt")
    return "; ".join(w for w in why if w)


def model_layout(cfg: dict) -> tuple[int, int] | None:
    """(hidden states a forward returns: the layers + the embeddings, their width) from a model's config.json, or
    None where it names neither in the usual keys."""
    layers = next((cfg[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(cfg.get(k), int)), None)
    width = next((cfg[k] for k in ("hidden_size", "n_embd", "d_model") if isinstance(cfg.get(k), int)), None)
    return (layers + 1, width) if layers and width else None
