"""The safetensors format: dtype names, a diagnosis that names the file and tensor a header breaks, and a
small atomic writer (record_weights uses it; reading goes through the `safetensors` library).

A file is an 8-byte little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets}}
(plus an optional "__metadata__" of strings), then the data; each tensor's [start, end) is relative to
the data, the tensors tile it without gaps, and end - start = prod(shape) * the dtype's size."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from flashcheck.core.fileio import atomic_target
from flashcheck.core.jsonguard import (  # noqa: F401  (shards and tests import MAX_HEADER, nesting_problem here)
    MAX_HEADER,
    MAX_NESTING,
    nesting_problem,
    read_safetensors_header,
)

BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64,
    "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip

TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}  # fmt: skip


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype name; None where the values are not real numbers torch holds."""
    attr = TORCH_DTYPES.get(name)
    return getattr(torch, attr, None) if attr else None


def diagnose(path: Path, library_message: str) -> str:
    """Why a safetensors file is malformed, naming the file and (where one is at fault) the tensor; falls
    back to the library's message when this reading finds nothing wrong."""
    where = f"{str(path)!r} is not a valid safetensors file"
    try:
        header, data_len = _raw_header(path)
        problem = _header_problem(header, data_len)
    except ValueError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror or exc}"
    return f"{where}: {problem or library_message}"


def _raw_header(path: Path) -> tuple[object, int]:
    size = path.stat().st_size
    with path.open("rb") as f:
        header, n = read_safetensors_header(f, size)
    return header, size - 8 - n


def _header_problem(header: object, data_len: int) -> str | None:
    if not isinstance(header, dict):
        return f"the header is a JSON {type(header).__name__}, expected an object {{tensor name: entry}}"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                return "__metadata__ must map names to strings"
            continue
        problem = _entry_problem(entry)
        if problem:
            return f"tensor {name!r}: {problem}"
        spans.append((*entry["data_offsets"], name))
    end = 0
    for start, stop, name in sorted(spans):
        if start != end:
            return f"tensor {name!r}: data_offsets [{start}, {stop}] start at {start}; expected {end} (gap or overlap)"
        if stop > data_len:
            return f"tensor {name!r}: data_offsets [{start}, {stop}] pass the end of the data ({data_len} bytes)"
        end = stop
    if end != data_len:
        return f"{data_len - end} bytes of data after the last tensor"
    return None


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return f"entry is a JSON {type(entry).__name__}, expected an object with dtype, shape, data_offsets"
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        return f"entry lacks {', '.join(missing)}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in BITS:
        return f"unknown dtype {dtype!r}; expected one of {', '.join(BITS)}"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"shape {shape!r} is not a list of non-negative integers"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        return f"data_offsets {offsets!r} is not two non-negative integers [start, end]"
    start, stop = offsets
    if stop < start:
        return f"data_offsets [{start}, {stop}] are reversed (end before start)"
    need = math.prod(shape) * BITS[dtype]
    if need != 8 * (stop - start):
        return f"shape {shape} of {dtype} needs {need / 8:g} bytes; data_offsets [{start}, {stop}] hold {stop - start}"
    return None


_WRITABLE = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}  # fmt: skip


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write tensors as a safetensors file, atomically (one tensor's bytes in memory at a time)."""
    header, offset = {}, 0
    for name, t in tensors.items():
        if t.dtype not in _WRITABLE:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}; expected one of {', '.join(map(str, _WRITABLE))}")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _WRITABLE[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with atomic_target(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for t in tensors.values():
            t = t.detach().contiguous().cpu()
            f.write((t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
