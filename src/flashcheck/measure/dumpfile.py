"""Reading a dump of attention inputs and outputs (.safetensors or .npz) written by any framework, as hostile
input: no pickle, sizes bounded before anything is allocated, only real floating and bool dtypes.

A .safetensors file is read by this module itself (8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}} with an optional "__metadata__" of strings, then the data), so that
no optional package is needed and every offset is checked against the file's size. A .npz is read with
numpy's np.load(allow_pickle=False), each member's uncompressed size checked in the zip directory first."""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flashcheck.core.jsonguard import read_safetensors_header

MAX_BYTES = 16 * 2**30  # bytes of all the arrays of one file together
MAX_TENSORS = 256
MAX_RANK = 4

# safetensors dtype name -> (torch dtype, item size in bytes); the dtypes a dump may hold
_ST_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "BOOL": (torch.bool, 1),
}
_NP_DTYPES = {
    np.dtype("float64"): torch.float64,
    np.dtype("float32"): torch.float32,
    np.dtype("float16"): torch.float16,
    np.dtype("bool"): torch.bool,
}


class DumpError(ValueError):
    """The file is malformed: the message names the file, the tensor at fault and what is allowed."""


@dataclass(frozen=True, slots=True)
class Dump:
    """The arrays of a dump as torch tensors (their stored dtype) and its scalar settings as strings
    (safetensors metadata, or npz 0-d arrays)."""

    path: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, str] = field(default_factory=dict)


def read_dump(path: str | Path, *, max_bytes: int = MAX_BYTES) -> Dump:
    """The tensors and settings of a .safetensors or .npz file; DumpError says why a file cannot be read."""
    p = Path(path)
    if not p.is_file():
        raise DumpError(f"{str(p)!r} is not a file")
    suffix = p.suffix.lower()
    if suffix == ".safetensors":
        tensors, meta = _read_safetensors(p, max_bytes)
    elif suffix == ".npz":
        tensors, meta = _read_npz(p, max_bytes)
    else:
        raise DumpError(f"{str(p)!r}: unknown file type {suffix or '(none)'!r}; expected .safetensors or .npz")
    return Dump(path=str(p), tensors=tensors, meta=meta)


def _read_safetensors(p: Path, max_bytes: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    size = p.stat().st_size
    with p.open("rb") as f:
        try:
            header, n = read_safetensors_header(f, size)
        except ValueError as exc:
            raise DumpError(f"{str(p)!r}: safetensors {exc}") from None
        if not isinstance(header, dict):
            raise DumpError(f"{str(p)!r}: the safetensors header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise DumpError(f"{str(p)!r}: __metadata__ must map names to strings")
        data_len = size - 8 - n
        entries = [_st_entry(p, name, e, data_len) for name, e in header.items()]
        _check_count_and_total(p, [(name, nbytes) for name, _, _, _, nbytes in entries], max_bytes)
        tensors = {}
        for name, dtype, shape, start, nbytes in entries:
            f.seek(8 + n + start)
            buf = bytearray(f.read(nbytes))
            tensors[name] = (
                torch.frombuffer(buf, dtype=dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)
            )
    return tensors, dict(meta)


def _st_entry(p: Path, name: str, e: object, data_len: int) -> tuple:
    """(name, torch dtype, shape, start, nbytes) of one header entry, every field checked."""
    where = f"{str(p)!r}: tensor {name!r}"
    if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
        raise DumpError(f"{where}: a header entry needs dtype, shape and data_offsets")
    if e["dtype"] not in _ST_DTYPES:
        allowed = ", ".join(_ST_DTYPES)
        raise DumpError(f"{where} has unknown dtype {e['dtype']!r}; allowed {allowed}")
    dtype, item = _ST_DTYPES[e["dtype"]]
    shape, offs = e["shape"], e["data_offsets"]
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_nonneg_int(d) for d in shape):
        raise DumpError(f"{where} has shape {shape!r}; expected at most {MAX_RANK} non-negative integers")
    if not (isinstance(offs, list) and len(offs) == 2 and all(_nonneg_int(o) for o in offs) and offs[0] <= offs[1]):
        raise DumpError(f"{where} has data_offsets {offs!r}; expected [start, end] with start <= end")
    nbytes = math.prod(shape) * item
    if offs[1] - offs[0] != nbytes or offs[1] > data_len:
        raise DumpError(
            f"{where}: data_offsets {offs} do not hold shape {shape} of {e['dtype']} ({nbytes} bytes) within the "
            f"{data_len} data bytes of the file"
        )
    return name, dtype, tuple(shape), offs[0], nbytes


def _nonneg_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_count_and_total(p: Path, sizes: list[tuple[str, int]], max_bytes: int) -> None:
    if len(sizes) > MAX_TENSORS:
        raise DumpError(f"{str(p)!r} holds {len(sizes)} arrays; at most {MAX_TENSORS} are read")
    total = sum(s for _, s in sizes)
    if total > max_bytes:
        raise DumpError(f"{str(p)!r}: its arrays take {total} bytes, more than the {max_bytes} bytes allowed")


def _read_npz(p: Path, max_bytes: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with zipfile.ZipFile(p) as z:  # the directory's uncompressed sizes, before numpy inflates anything
            sizes = [(i.filename, i.file_size) for i in z.infolist()]
    except (zipfile.BadZipFile, OSError) as exc:
        raise DumpError(f"{str(p)!r} is not a valid .npz (zip) file: {exc}") from None
    _check_count_and_total(p, sizes, max_bytes)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    try:
        with np.load(p, allow_pickle=False) as npz:
            for name in npz.files:
                try:
                    arr = npz[name]
                except ValueError as exc:  # object arrays (they need pickle, never allowed), a header that lies
                    raise DumpError(f"{str(p)!r}: array {name!r} cannot be read ({exc})") from None
                if not isinstance(arr, np.ndarray):  # numpy hands back a member not named *.npy as raw bytes
                    raise DumpError(f"{str(p)!r}: member {name!r} is not a .npy array (an .npz holds only .npy files)")
                if arr.ndim == 0:
                    meta[name] = _scalar_text(p, name, arr)
                else:
                    tensors[name] = _np_tensor(p, name, arr)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DumpError(f"{str(p)!r} is not a valid .npz file: {exc}") from None
    return tensors, meta


def _scalar_text(p: Path, name: str, arr: np.ndarray) -> str:
    """A 0-d array as the string a safetensors metadata entry would hold."""
    if arr.dtype.kind == "b":
        return "true" if bool(arr) else "false"
    if arr.dtype.kind in "iuf" or arr.dtype.kind == "U":
        return str(arr.item())
    raise DumpError(f"{str(p)!r}: setting {name!r} has dtype {arr.dtype}; expected a number, bool or string")


def _np_tensor(p: Path, name: str, arr: np.ndarray) -> torch.Tensor:
    dtype = _NP_DTYPES.get(arr.dtype)
    if dtype is None:
        hint = " (bf16: store the values as float32 and set dtype='bf16')" if arr.dtype.kind == "V" else ""
        allowed = ", ".join(str(d) for d in _NP_DTYPES)
        raise DumpError(f"{str(p)!r}: array {name!r} has unknown dtype {arr.dtype}{hint}; allowed {allowed}")
    if arr.ndim > MAX_RANK:
        raise DumpError(f"{str(p)!r}: array {name!r} has {arr.ndim} dims; at most {MAX_RANK}")
    return torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)
