"""Sharded checkpoints, as Hugging Face saves large models, read as one checkpoint: shards
`model-00001-of-00002.safetensors`, `model-00002-of-00002.safetensors` and the index
`model.safetensors.index.json` ({"weight_map": {tensor: shard file}}); without an index, the `-of-`
naming (every shard present, no tensor in two shards)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from flashcheck.training.readers import CHECKPOINT_SUFFIXES, CheckpointError, Reader, checked, open_file
from flashcheck.training.safetensors_format import MAX_HEADER, nesting_problem

SHARD = re.compile(r"^(?P<prefix>.+)-(?P<index>\d+)-of-(?P<count>\d+)(?P<suffix>\.safetensors|\.pt|\.pth|\.bin)$")
INDEX_SUFFIX = ".index.json"


class ShardedReader(Reader):
    """Several shard files as one checkpoint; `where` maps each tensor to its shard."""

    def __init__(self, path: Path, shards: list[Path], weight_map: dict[str, str] | None) -> None:
        self.path = path
        self._readers: dict[str, Reader] = {}
        for shard in shards:
            checked(shard, shard.parent)
        try:
            for shard in shards:
                self._readers[shard.name] = open_file(shard)
            self._keys = {name: r.keys() for name, r in self._readers.items()}
            self._where = self._locate(weight_map)
        except BaseException:
            self.close()
            raise

    def _locate(self, weight_map: dict[str, str] | None) -> dict[str, str]:
        where: dict[str, str] = {}
        for shard, keys in self._keys.items():
            for name in keys:
                if name in where and not (weight_map and name in weight_map):
                    raise CheckpointError(
                        f"{str(self.path)!r}: tensor {name!r} is in two shards, {where[name]} and {shard}"
                    )
                where.setdefault(name, shard)
        for name, shard in (weight_map or {}).items():
            if name not in self._keys[shard]:
                raise CheckpointError(f"{str(self.path)!r} maps tensor {name!r} to {shard}, which does not hold it")
            where[name] = shard
        return where

    def keys(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {name: self._keys[shard][name] for name, shard in self._where.items()}

    def tensor(self, name: str) -> torch.Tensor:
        return self._readers[self._where[name]].tensor(name)

    def close(self) -> None:
        for r in self._readers.values():
            r.close()


def index_of(shard: Path) -> Path | None:
    """The index file of a shard's checkpoint (`model.safetensors.index.json`), None if absent."""
    m = SHARD.match(shard.name)
    index = shard.parent / f"{m['prefix']}{m['suffix']}{INDEX_SUFFIX}" if m else None
    return index if index is not None and index.is_file() else None


def open_index(index: Path) -> ShardedReader:
    """The checkpoint an index file describes; CheckpointError names a malformed index or a missing shard."""
    try:
        if (size := checked(index).stat().st_size) > MAX_HEADER:
            raise ValueError(f"{size} bytes, more than the {MAX_HEADER} an index may hold")
        raw = index.read_bytes()
        if problem := nesting_problem(raw):
            raise ValueError(f"it {problem}")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{str(index)!r} is not a readable checkpoint index: {exc}") from None
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        raise CheckpointError(f'{str(index)!r}: expected {{"weight_map": {{tensor name: shard file name}}}}')
    shards = sorted(set(wm.values()))
    for name in shards:
        tensor = next(t for t, s in wm.items() if s == name)
        if Path(name).name != name or Path(name).suffix not in CHECKPOINT_SUFFIXES:
            raise CheckpointError(f"{str(index)!r}: shard {name!r} (of tensor {tensor!r}) is not a checkpoint file")
        if not (index.parent / name).is_file():
            raise CheckpointError(f"{str(index)!r}: shard {name!r} (of tensor {tensor!r}) does not exist")
    return ShardedReader(index, [index.parent / s for s in shards], wm)


def open_group(shard: Path) -> ShardedReader:
    """The checkpoint a shard belongs to, by its `-of-` name: its index if there is one, else every shard."""
    index = index_of(shard)
    if index is not None:
        return open_index(index)
    m = SHARD.match(shard.name)
    width, count = len(m["index"]), int(m["count"])
    paths = [shard.parent / f"{m['prefix']}-{i:0{width}d}-of-{m['count']}{m['suffix']}" for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if count < 1 or missing:
        raise CheckpointError(
            f"sharded checkpoint {m['prefix']}-*-of-{m['count']}{m['suffix']} in {str(shard.parent)!r} "
            f"lacks {', '.join(missing) or 'shards'} and has no {m['prefix']}{m['suffix']}{INDEX_SUFFIX}"
        )
    return ShardedReader(paths[0], paths, None)


def folder_checkpoint(folder: Path) -> Path | None:
    """The one checkpoint a folder holds as Hugging Face writes it (save_pretrained, Trainer checkpoints):
    an index file, one shard group, model.safetensors or pytorch_model.bin (safetensors first), or its
    only checkpoint file; None when there is none or several."""
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    for suffix in CHECKPOINT_SUFFIXES:
        indexes = [p for p in files if p.name.endswith(suffix + INDEX_SUFFIX)]
        if len(indexes) == 1:
            return indexes[0]
        groups = {(m["prefix"], m["count"]): p for p in files if (m := SHARD.match(p.name)) and m["suffix"] == suffix}
        if len(groups) == 1:
            return next(iter(groups.values()))
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    single = [p for p in files if p.suffix in CHECKPOINT_SUFFIXES]
    return single[0] if len(single) == 1 else None
