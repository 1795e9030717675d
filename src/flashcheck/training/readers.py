"""Readers of one checkpoint file that hand out one tensor at a time: safetensors (through the `safetensors`
library, which validates the header) and torch .pt/.bin state dicts (memory-mapped); torch.distributed.checkpoint
folders are read by training/dcp.py."""

from __future__ import annotations

from pathlib import Path

import torch

from flashcheck.core.fileio import UnsafeFile, load_refusal, regular_file
from flashcheck.training.safetensors_format import diagnose, torch_dtype

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
CHECKPOINT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (missing, corrupt, unknown format)."""


class Reader:
    """keys(): {name: (shape, dtype)}; tensor(name): a fresh (writable) CPU tensor; close(): release files."""

    path: Path

    def keys(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def tensor(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        """Release open files (the default holds none)."""


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        from flashcheck.core.extras import install_hint

        raise CheckpointError(
            f"reading .safetensors files needs the safetensors package (>= 0.8): {install_hint('drift')}"
        ) from None
    return safe_open


class SafetensorsReader(Reader):
    """One file through `safe_open(..., backend="pread")`: the header is validated on opening, and each
    tensor is read into its own buffer (the mmap backend, held open, keeps every tensor read resident)."""

    def __init__(self, path: Path) -> None:
        safe_open = _safe_open()
        self.path = path
        try:
            self._file = safe_open(str(path), framework="pt", backend="pread")
        except TypeError:
            import safetensors

            raise CheckpointError(
                f"safetensors {safetensors.__version__} is too old to read one tensor at a time; "
                "pip install 'safetensors>=0.8'"
            ) from None
        except Exception as exc:  # SafetensorError and OSError: the file or its header is broken
            raise CheckpointError(diagnose(path, str(exc))) from None
        self._keys = {}
        names = self._file.keys()
        for name in names:
            view = self._file.get_slice(name)
            dtype = torch_dtype(view.get_dtype())
            if dtype is None:
                raise CheckpointError(
                    f"{str(path)!r}: tensor {name!r} has dtype {view.get_dtype()}, "
                    "which cannot be compared as real numbers"
                )
            self._keys[name] = (tuple(view.get_shape()), dtype)

    def keys(self):
        return dict(self._keys)

    def tensor(self, name):
        try:
            return self._file.get_tensor(name)
        except Exception as exc:  # the file changed or broke after it was opened
            raise CheckpointError(f"{str(self.path)!r}: tensor {name!r} cannot be read: {exc}") from None

    def close(self) -> None:
        self._file.__exit__(None, None, None)


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
            raise CheckpointError(f"{str(path)!r} is not a readable torch checkpoint: {load_refusal(exc)}") from None
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


def checked(path: Path, folder: Path | None = None) -> Path:
    """`path` when it is a regular file, inside `folder` when given (core.fileio.regular_file); else CheckpointError."""
    try:
        return regular_file(path, folder)
    except UnsafeFile as exc:
        raise CheckpointError(str(exc)) from None


def open_file(path: Path) -> Reader:
    """A reader for one checkpoint file by its suffix."""
    if path.suffix == ".safetensors":
        return SafetensorsReader(path)
    if path.suffix in TORCH_SUFFIXES:
        return TorchReader(path)
    raise CheckpointError(
        f"unknown checkpoint format {path.suffix or path.name!r}; expected one of "
        f"{', '.join(CHECKPOINT_SUFFIXES)}, a Hugging Face *.index.json or a torch.distributed.checkpoint folder"
    )
