"""torch.distributed.checkpoint folders (what FSDP training writes) read as hostile input, one tensor at a time.

A folder holds `.metadata` (a pickle: per tensor its dtype, size and chunks; per chunk the data file, offset and
length of its bytes) and data files such as `__0_0.distcp`, each chunk a `torch.save`d tensor at its offset.
Everything the metadata declares is checked before a file is opened or a byte allocated: only the metadata's
own data classes are unpickled (never a class that does something when built, such as FileSystemWriter), every
data file is a regular file inside the folder (a `relative_path` of ../../etc/passwd or a linked shard is refused),
every chunk lies within its file and within its tensor, the chunks tile the tensor, and a tensor's declared bytes
fit in the bytes its chunks store (a declared size of 2^40 is refused, not allocated). Chunks are read with
`torch.load(weights_only=True)` and each must be a tensor of the declared dtype and chunk shape."""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path

import torch

from flashcheck.core.fileio import UnsafeFile, load_refusal, regular_file
from flashcheck.training.readers import CheckpointError, Reader

MAX_METADATA = 1 << 30  # bytes of a .metadata pickle


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a distributed checkpoint's .metadata (torch writes it with pickle and reads it back with
    pickle.load, which runs whatever a planted file names): only the data classes that metadata is made of."""

    def find_class(self, module: str, name: str):
        if _metadata_global(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of checkpoint metadata; refused, nothing was run")


def _metadata_global(module: str, name: str) -> bool:
    """The globals torch's checkpoint metadata pickles reference: the data classes and enums defined in its
    metadata and filesystem modules (not the readers and writers defined beside them, whose construction opens
    or creates folders), tensor sizes and dtypes, layouts by name, paths."""
    import dataclasses
    import enum
    import importlib

    if module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"):
        obj = getattr(importlib.import_module(module), name, None)
        if not isinstance(obj, type) or obj.__module__ != module:  # a class defined there, not one imported
            return False
        return dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
    if module == "pathlib":
        return name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")
    return (module, name) == ("torch.serialization", "_get_layout")


def _sizes(x: object) -> tuple[int, ...] | None:
    """A tuple of non-negative ints, or None when `x` is anything else."""
    if not isinstance(x, tuple | list | torch.Size):
        return None
    ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x)
    return tuple(x) if ok else None


class DcpReader(Reader):
    """A torch.distributed.checkpoint folder; its tensors assembled from their chunks (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        md = self._metadata()
        self.meta: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._chunks: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], Path, int, int]]] = {}
        storage, tensors = getattr(md, "storage_data", None), getattr(md, "state_dict_metadata", None)
        if not isinstance(storage, dict) or not isinstance(tensors, dict):
            self._fail("its .metadata lacks the state_dict_metadata or storage_data table")
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        sizes: dict[Path, int] = {}
        for name, m in tensors.items():
            if not isinstance(m, TensorStorageMetadata):
                continue  # a BytesStorageMetadata entry (an object saved beside the tensors) is never read
            self._add_tensor(str(name), m, storage, sizes)

    def _fail(self, why: str):
        raise CheckpointError(f"{str(self.path)!r} is not a readable distributed checkpoint: {why}")

    def _metadata(self):
        from torch.distributed.checkpoint.metadata import Metadata

        try:
            meta = regular_file(self.path / ".metadata", self.path)
            if (size := meta.stat().st_size) > MAX_METADATA:
                self._fail(f".metadata holds {size} bytes, more than the {MAX_METADATA} allowed")
            with meta.open("rb") as f:
                md = _MetadataUnpickler(f).load()
        except CheckpointError:
            raise
        except UnsafeFile as exc:
            self._fail(str(exc))
        except Exception as exc:  # pickle raises many types for a corrupt file
            self._fail(f".metadata: {type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(md, Metadata):
            self._fail(f".metadata holds a {type(md).__name__}, not checkpoint Metadata")
        return md

    def _add_tensor(self, name: str, m, storage: dict, sizes: dict[Path, int]) -> None:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        where = f"tensor {name!r}"
        shape, dtype = _sizes(getattr(m, "size", None)), getattr(getattr(m, "properties", None), "dtype", None)
        chunks = getattr(m, "chunks", None)
        if shape is None or not isinstance(dtype, torch.dtype) or not isinstance(chunks, list):
            self._fail(f"{where} has a malformed entry (size, dtype or chunks)")
        try:
            item = torch.empty((), dtype=dtype).element_size()  # a quantized dtype cannot be built this way
        except (RuntimeError, TypeError):
            item = 0
        if dtype.is_complex or not item:
            self._fail(f"{where} has dtype {dtype}, which cannot be compared as real numbers")
        pieces, stored = [], 0
        for c in chunks:
            off, size = _sizes(getattr(c, "offsets", None)), _sizes(getattr(c, "sizes", None))
            if off is None or size is None or len(off) != len(shape) or len(size) != len(shape):
                self._fail(f"{where} has a chunk without offsets and sizes of its rank {len(shape)}")
            if any(o + s > d for o, s, d in zip(off, size, shape, strict=True)):
                self._fail(f"{where}: chunk at {list(off)} of size {list(size)} reaches past its size {list(shape)}")
            info = storage.get(MetadataIndex(name, off))
            file, start, length = self._storage(where, info, sizes)
            if math.prod(size) * item > length:
                self._fail(
                    f"{where}: chunk at {list(off)} declares {math.prod(size) * item} bytes of {dtype} but stores "
                    f"{length} bytes"
                )
            pieces.append((off, size, file, start, length))
            stored += length
        _tile(self._fail, where, shape, [(o, s) for o, s, *_ in pieces], item, stored)
        self.meta[name] = (shape, dtype)
        self._chunks[name] = pieces

    def _storage(self, where: str, info, sizes: dict[Path, int]) -> tuple[Path, int, int]:
        """(data file, offset, length) of one chunk, the file regular and inside the folder, the bytes within it."""
        rel, start, length = (getattr(info, a, None) for a in ("relative_path", "offset", "length"))
        if not isinstance(rel, str) or _sizes((start, length)) is None:
            self._fail(f"{where} has a chunk without a storage entry (data file, offset, length)")
        if getattr(info, "transform_descriptors", None):
            self._fail(f"{where} is stored through transforms {info.transform_descriptors!r}, which are not read")
        file = self.path / rel
        if file not in sizes:
            try:
                sizes[file] = regular_file(file, self.path).stat().st_size
            except (UnsafeFile, OSError) as exc:
                self._fail(f"data file {rel!r} of {where}: {exc}")
        if start + length > sizes[file]:
            self._fail(f"{where}: bytes [{start}, {start + length}) lie past the end of {rel!r} ({sizes[file]} bytes)")
        return file, start, length

    def keys(self):
        return dict(self.meta)

    def tensor(self, name):
        shape, dtype = self.meta[name]
        out = torch.empty(shape, dtype=dtype)
        for off, size, file, start, length in self._chunks[name]:
            piece = self._chunk(name, file, start, length)
            if not isinstance(piece, torch.Tensor) or piece.dtype != dtype or tuple(piece.shape) != size:
                got = f"{piece.dtype} {list(piece.shape)}" if isinstance(piece, torch.Tensor) else type(piece).__name__
                raise CheckpointError(
                    f"{str(self.path)!r}: tensor {name!r}: the chunk at {list(off)} in {file.name!r} holds {got}, "
                    f"not the declared {dtype} {list(size)}"
                )
            out[tuple(slice(o, o + s) for o, s in zip(off, size, strict=True))] = piece
        return out

    def _chunk(self, name: str, file: Path, start: int, length: int) -> object:
        try:
            with regular_file(file, self.path).open("rb") as f:
                f.seek(start)
                raw = f.read(length)
            if len(raw) != length:
                raise EOFError(f"{len(raw)} of {length} bytes (the file shrank)")
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for bytes that are not a saved tensor
            raise CheckpointError(
                f"{str(self.path)!r}: tensor {name!r}: data file {file.name!r} is not readable at [{start}, "
                f"{start + length}): {load_refusal(exc)}"
            ) from None


def _tile(fail, where: str, shape: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]], item: int,
          stored: int) -> None:  # fmt: skip
    """`fail` unless the chunks cover the tensor exactly once (their sizes add up to it, no two overlap)."""
    total = math.prod(shape)
    if sum(math.prod(s) for _, s in chunks) != total:
        fail(
            f"{where} declares size {list(shape)} ({total * item} bytes) but its chunks hold "
            f"{sum(math.prod(s) for _, s in chunks)} elements ({stored} bytes stored)"
        )
    boxes = [(o, s) for o, s in chunks if math.prod(s)]
    for i, (oa, sa) in enumerate(boxes):
        for ob, sb in boxes[i + 1 :]:
            if all(a < b + n and b < a + m for a, m, b, n in zip(oa, sa, ob, sb, strict=True)):
                fail(f"{where}: chunks at {list(oa)} and {list(ob)} overlap")
