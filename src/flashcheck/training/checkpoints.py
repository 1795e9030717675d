"""Checkpoints by path: one file (safetensors, torch .pt/.bin), a sharded Hugging Face checkpoint (index
or `-of-` shards), a torch.distributed.checkpoint folder, a Hugging Face model folder; and series of
checkpoints by step. Every reader hands out one tensor at a time."""

from __future__ import annotations

import os
import re
from pathlib import Path

from flashcheck.core.fileio import UnsafeFile, inside_folder
from flashcheck.training.dcp import DcpReader
from flashcheck.training.readers import CHECKPOINT_SUFFIXES, CheckpointError, Reader, checked, open_file
from flashcheck.training.safetensors_format import save_safetensors
from flashcheck.training.shards import INDEX_SUFFIX, SHARD, folder_checkpoint, index_of, open_group, open_index

__all__ = ["CHECKPOINT_SUFFIXES", "CheckpointError", "Reader", "open_checkpoint", "save_safetensors", "series"]


def open_checkpoint(path: str | Path) -> Reader:
    """A reader for one checkpoint, by its format; CheckpointError names what is allowed."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    if p.is_dir():
        if _is_dcp(p):
            return DcpReader(p)
        inner = folder_checkpoint(p)
        if inner is None:
            raise CheckpointError(
                f"{str(p)!r} is a folder that holds no single checkpoint: not a torch.distributed.checkpoint "
                f"(no .metadata), and no *{INDEX_SUFFIX}, shards (-00001-of-0000N), model.safetensors "
                "or pytorch_model.bin"
            )
        return open_checkpoint(checked(inner, p))
    checked(p)  # a FIFO would block the reader, a device never end
    if p.name.endswith(INDEX_SUFFIX):
        return open_index(p)
    if SHARD.match(p.name):
        return open_group(p)
    return open_file(p)


def _is_dcp(folder: Path) -> bool:
    return os.path.lexists(folder / ".metadata")


def _entries(folder: Path) -> list[tuple[str, Path]]:
    """(name that carries the step, checkpoint path) of each checkpoint directly in a folder; the shards of
    one checkpoint count once. Each must lie inside the folder, links followed, and a file must be regular
    (core.fileio.regular_file, the rule for shards too): CheckpointError otherwise."""
    out, groups = [], set()
    for child in sorted(folder.iterdir()):
        if child.name.startswith("."):  # temporary files of atomic writes, hidden folders
            continue
        if child.is_dir():
            if _is_dcp(child) or folder_checkpoint(child) is not None:
                _inside(child, folder)
                out.append((child.name, child))
            continue
        if child.name.endswith(INDEX_SUFFIX) or SHARD.match(child.name) or child.suffix in CHECKPOINT_SUFFIXES:
            checked(child, folder)
        if child.name.endswith(INDEX_SUFFIX):
            stem = child.name[: -len(INDEX_SUFFIX)]
            out.append((Path(stem).stem if Path(stem).suffix in CHECKPOINT_SUFFIXES else stem, child))
        elif m := SHARD.match(child.name):
            key = (m["prefix"], m["count"], m["suffix"])
            if index_of(child) is None and key not in groups:
                groups.add(key)
                out.append((m["prefix"], child))
        elif child.suffix in CHECKPOINT_SUFFIXES:
            out.append((child.stem, child))
    return out


def _inside(path: Path, folder: Path) -> None:
    try:
        inside_folder(path, folder)
    except UnsafeFile as exc:
        raise CheckpointError(str(exc)) from None


def series(path: str | Path) -> dict[int, Path]:
    """Checkpoints by step: a folder of checkpoints (files, sharded checkpoints or checkpoint folders) named
    with their step (the last number in the name), a run folder of `flashcheck train-study` (its weights/),
    or one checkpoint (step 0)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{str(p)!r} does not exist")
    if not p.is_dir():
        return {0: checked(p)}
    if _is_dcp(p):
        return {0: p}
    if (p / "weights").is_dir() and (p / "config.json").is_file():  # not its state.pt, the resume point
        return series(p / "weights")
    out: dict[int, Path] = {}
    for name, target in _entries(p):
        nums = re.findall(r"\d+", name)
        if not nums:
            continue
        step = int(nums[-1])
        if step in out:
            raise CheckpointError(f"{str(p)!r} holds two checkpoints of step {step}: {out[step].name}, {target.name}")
        out[step] = target
    if not out and folder_checkpoint(p) is not None:
        return {0: p}
    if not out:
        raise CheckpointError(
            f"{str(p)!r} holds no checkpoints named by step (e.g. step_000100.pt, checkpoint-100/) and is not one "
            f"checkpoint; formats: {', '.join(CHECKPOINT_SUFFIXES)}, Hugging Face shards with *{INDEX_SUFFIX}, "
            "distributed checkpoint folders"
        )
    return dict(sorted(out.items()))
