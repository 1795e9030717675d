"""Checkpoint readers that load one tensor at a time: safetensors (read by offset, no full load), torch
.pt/.bin state dicts (memory-mapped), torch.distributed.checkpoint folders; and checkpoint series by step."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import torch

_ST_DTYPES = {
    "F64": (np.float64, torch.float64),
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.uint16, torch.bfloat16),
    "I64": (np.int64, torch.int64),
    "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16),
    "I8": (np.int8, torch.int8),
    "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (missing, corrupt, unknown format)."""


class Reader:
    """keys(): {name: (shape, dtype)}; tensor(name): a fresh (writable) CPU tensor."""

    path: Path

    def keys(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def tensor(self, name: str) -> torch.Tensor:
        raise NotImplementedError


class SafetensorsReader(Reader):
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100_000_000:
                    raise ValueError("header too large")
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error) as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {exc}") from None
        self.base = 8 + n
        self.meta = {k: v for k, v in header.items() if k != "__metadata__"}
        size = path.stat().st_size
        for name, m in self.meta.items():
            if m.get("dtype") not in _ST_DTYPES or m["data_offsets"][1] + self.base > size:
                raise CheckpointError(f"{str(path)!r}: tensor {name!r} is truncated or of unknown dtype")

    def keys(self):
        return {k: (tuple(m["shape"]), _ST_DTYPES[m["dtype"]][1]) for k, m in self.meta.items()}

    def tensor(self, name):
        m = self.meta[name]
        npd, td = _ST_DTYPES[m["dtype"]]
        start, stop = m["data_offsets"]
        count = (stop - start) // np.dtype(npd).itemsize
        arr = np.fromfile(self.path, dtype=npd, count=count, offset=self.base + start)
        t = torch.from_numpy(arr)
        return (t.view(td) if td == torch.bfloat16 else t).reshape(m["shape"])


class TorchReader(Reader):
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            try:
                obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy format: no mmap
        except Exception as exc:  # torch raises many types for a corrupt or foreign file
            raise CheckpointError(
                f"{str(path)!r} is not a readable torch checkpoint: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            ) from None
        for key in ("state_dict", "model", "module"):
            if isinstance(obj, dict) and isinstance(obj.get(key), dict):
                obj = obj[key]
        if not isinstance(obj, dict):
            raise CheckpointError(f"{str(path)!r} holds a {type(obj).__name__}, not a state dict")
        self.tensors = dict(_flatten(obj))

    def keys(self):
        return {k: (tuple(t.shape), t.dtype) for k, t in self.tensors.items()}

    def tensor(self, name):
        return self.tensors[name].clone()


def _flatten(obj: dict, prefix: str = ""):
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            yield prefix + str(k), v
        elif isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")


class DcpReader(Reader):
    """A torch.distributed.checkpoint folder (what FSDP training writes); shards assembled per tensor."""

    def __init__(self, path: Path) -> None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = path
        try:
            md = FileSystemReader(str(path)).read_metadata()
        except Exception as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable distributed checkpoint: {exc}") from None
        self.meta = {
            k: (tuple(m.size), m.properties.dtype)
            for k, m in md.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)
        }

    def keys(self):
        return dict(self.meta)

    def tensor(self, name):
        import warnings

        import torch.distributed.checkpoint as dcp

        shape, dtype = self.meta[name]
        out = {name: torch.empty(shape, dtype=dtype)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(out, checkpoint_id=str(self.path))
        return out[name]


CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def open_checkpoint(path: str | Path) -> Reader:
    """A reader for one checkpoint, by its format; CheckpointError names what is allowed."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    if p.is_dir():
        if (p / ".metadata").exists():
            return DcpReader(p)
        raise CheckpointError(f"{str(p)!r} is a folder without .metadata: not a torch.distributed.checkpoint")
    if p.suffix == ".safetensors":
        return SafetensorsReader(p)
    if p.suffix in (".pt", ".pth", ".bin"):
        return TorchReader(p)
    raise CheckpointError(
        f"unknown checkpoint format {p.suffix or p.name!r}; expected one of "
        f"{', '.join(CHECKPOINT_SUFFIXES)} or a torch.distributed.checkpoint folder"
    )


def series(path: str | Path) -> dict[int, Path]:
    """Checkpoints by step: a folder of checkpoints named with their step (the last number in the name),
    or one checkpoint (step 0)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{str(p)!r} does not exist")
    if p.is_file() or (p / ".metadata").exists():
        return {0: p}
    out = {}
    for child in sorted(p.iterdir()):
        is_ckpt = child.suffix in CHECKPOINT_SUFFIXES or (child.is_dir() and (child / ".metadata").exists())
        nums = re.findall(r"\d+", child.stem if child.is_file() else child.name)
        if is_ckpt and nums:
            out[int(nums[-1])] = child
    if not out:
        raise CheckpointError(
            f"{str(p)!r} holds no checkpoints named by step (e.g. step_000100.pt); "
            f"formats: {', '.join(CHECKPOINT_SUFFIXES)}, distributed checkpoint folders"
        )
    return dict(sorted(out.items()))


_ST_NAMES = {td: name for name, (_, td) in _ST_DTYPES.items()}


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write a safetensors file (header JSON, then raw little-endian data), atomically."""
    import os

    path = Path(path)
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {
            "dtype": _ST_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)
