"""Reading a dump of attention inputs and outputs (.safetensors or .npz) written by any framework, as hostile
input: no pickle, sizes bounded before anything is allocated, only real floating and bool dtypes.

A .safetensors file is read by this module itself (8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}} with an optional "__metadata__" of strings, then the data), so that
no optional package is needed and every offset is checked against the file's size, and no two tensors share
bytes. A .npz is read member by member: names first, then each .npy header (numpy.lib.format), whose shape and
dtype must need exactly the member's uncompressed size in the zip directory, before any data is inflated."""

from __future__ import annotations

import itertools
import math
import zipfile
from collections.abc import Callable
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


NameCheck = Callable[[str, list[str]], None]
ShapeCheck = Callable[[str, dict[str, tuple[int, ...]]], None]
READ_SHARE = 0.5  # of the memory available here: the most a dump's arrays may take (the judging needs the rest)


class DumpError(ValueError):
    """The file is malformed: the message names the file, the tensor at fault and what is allowed."""


@dataclass(frozen=True, slots=True)
class Dump:
    """The arrays of a dump as torch tensors (their stored dtype) and its scalar settings as strings
    (safetensors metadata, or npz 0-d arrays)."""

    path: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, str] = field(default_factory=dict)


def read_dump(
    path: str | Path,
    *,
    max_bytes: int = MAX_BYTES,
    allowed: NameCheck | None = None,
    declared: ShapeCheck | None = None,
) -> Dump:
    """The tensors and settings of a .safetensors or .npz file; DumpError says why a file cannot be read.
    `allowed(path, names)` raises DumpError for names the caller does not read, before any data is read;
    `declared(path, {name: shape})` for shapes the caller cannot use (or whose work cannot fit here), once every
    header is read and before any data is. The arrays together may take at most max_bytes and READ_SHARE of the
    memory available here (kernels.sim.memory.available_bytes), checked on the declared sizes before any inflating."""
    p = Path(path)
    if not p.is_file():
        raise DumpError(f"{str(p)!r} is not a file")
    suffix = p.suffix.lower()
    checks = (_room(max_bytes), allowed, declared)
    if suffix == ".safetensors":
        tensors, meta = _read_safetensors(p, *checks)
    elif suffix == ".npz":
        tensors, meta = _read_npz(p, *checks)
    else:
        raise DumpError(f"{str(p)!r}: unknown file type {suffix or '(none)'!r}; expected .safetensors or .npz")
    return Dump(path=str(p), tensors=tensors, meta=meta)


def _room(max_bytes: int) -> tuple[int, str]:
    """(the most bytes a dump's arrays may take, the words that say why)."""
    from flashcheck.kernels.sim.memory import available_bytes, human_bytes

    avail = available_bytes()
    if avail is not None and READ_SHARE * avail < max_bytes:
        return int(READ_SHARE * avail), f"half the {human_bytes(avail)} of memory available here"
    return max_bytes, "the limit of a dump"


def _read_safetensors(
    p: Path, room: tuple[int, str], allowed: NameCheck | None, declared: ShapeCheck | None
) -> tuple[dict, dict[str, str]]:
    size = p.stat().st_size
    with p.open("rb") as f:
        try:
            header, n = read_safetensors_header(f, size)
        except ValueError as exc:
            raise DumpError(f"{str(p)!r} is not a valid safetensors file: {exc}") from None
        if not isinstance(header, dict):
            raise DumpError(f"{str(p)!r}: the safetensors header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise DumpError(f"{str(p)!r}: __metadata__ must map names to strings")
        data_len = size - 8 - n
        entries = [_st_entry(p, name, e, data_len) for name, e in header.items()]  # the header alone
        if allowed is not None:
            allowed(str(p), [*header, *meta])
        _check_count_and_total(p, [(name, nbytes) for name, _, _, _, nbytes in entries], room)
        _check_disjoint(p, entries)
        if declared is not None:
            declared(str(p), {name: shape for name, _, shape, _, _ in entries})
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


def _check_disjoint(p: Path, entries: list[tuple]) -> None:
    """DumpError when two tensors share data bytes (a writer stores each tensor once: q, k, v and out read from one
    range would be judged equal to themselves)."""
    spans = sorted((start, start + nbytes, name) for name, _, _, start, nbytes in entries if nbytes)
    for (_, end_a, a), (start_b, _, b) in itertools.pairwise(spans):  # sorted: an overlap shows in a neighbour
        if start_b < end_a:
            raise DumpError(f"{str(p)!r}: tensors {a!r} and {b!r} share data bytes; each tensor needs its own range")


def _nonneg_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_count_and_total(p: Path, sizes: list[tuple[str, int]], room: tuple[int, str]) -> None:
    if len(sizes) > MAX_TENSORS:
        raise DumpError(f"{str(p)!r} holds {len(sizes)} arrays; at most {MAX_TENSORS} are read")
    total, (most, why) = sum(s for _, s in sizes), room
    if total > most:
        raise DumpError(
            f"{str(p)!r}: its arrays declare {total} bytes, more than the {most} bytes a dump may take here ({why}); "
            "refused before reading them"
        )


def _read_npz(
    p: Path, room: tuple[int, str], allowed: NameCheck | None, declared: ShapeCheck | None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Each member's name, then its .npy header (shape and dtype, a few hundred bytes inflated), checked before
    any data is inflated: the directory's size of a member must be exactly what its header's shape needs, and
    all of them together within max_bytes (a small file can hold a 4 GiB member of zeros, or declare 2^40)."""
    try:
        with zipfile.ZipFile(p) as z:
            infos = z.infolist()
            names = [_member_name(p, i.filename) for i in infos]
            if len(set(names)) != len(names):
                raise DumpError(f"{str(p)!r} holds an array name twice; each name once")
            _check_count_and_total(p, [(n, 0) for n in names], room)
            if allowed is not None:
                allowed(str(p), names)
            plans = [_npy_plan(p, z, info, name) for info, name in zip(infos, names, strict=True)]
            _check_count_and_total(p, [(name, need) for name, _, need in plans], room)
            if declared is not None:
                declared(str(p), {name: tuple(plan[1]) for name, plan, _ in plans if plan[1]})  # arrays, not settings
            arrays = {name: _npy_data(p, z, info, name, plan) for (name, *plan), info in zip(plans, infos, strict=True)}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise DumpError(f"{str(p)!r} is not a valid .npz (zip) file: {exc}") from None
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    for name, arr in arrays.items():
        if arr.ndim == 0:
            meta[name] = _scalar_text(p, name, arr)
        else:
            tensors[name] = _np_tensor(p, name, arr)
    return tensors, meta


def _member_name(p: Path, filename: str) -> str:
    if not filename.endswith(".npy") or len(filename) == 4:
        raise DumpError(f"{str(p)!r}: member {filename!r} is not a .npy array (an .npz holds only NAME.npy files)")
    return filename[:-4]


def _npy_plan(p: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> tuple:
    """(name, (dtype, shape, fortran order, header bytes), data bytes) of one member: its .npy header read (only
    that much inflated) and checked, the shape's bytes against the member's size in the zip directory."""
    from numpy.lib import format as npy

    where = f"{str(p)!r}: array {name!r}"
    with z.open(info) as f:
        try:
            version = npy.read_magic(f)
            read = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f".npy format version {version[0]}.{version[1]} is not read (1.0 or 2.0)")
            shape, fortran, dtype = read(f)
        except ValueError as exc:
            raise DumpError(f"{where} has a malformed .npy header ({exc})") from None
        head = f.tell()
    ok = dtype in _NP_DTYPES if shape else dtype.kind in "biufU"  # arrays; 0-d settings
    if dtype.hasobject or not ok:
        hint = " (bf16: store the values as float32 and set dtype='bf16')" if dtype.kind == "V" else ""
        hint += " (objects need pickle, never read: allow_pickle=False)" if dtype.hasobject else ""
        what = ", ".join(str(d) for d in _NP_DTYPES) if shape else "a number, bool or string setting"
        raise DumpError(f"{where} has unknown dtype {dtype}{hint}; allowed {what}")
    if len(shape) > MAX_RANK:
        raise DumpError(f"{where} has {len(shape)} dims; at most {MAX_RANK}")
    need = math.prod(shape) * dtype.itemsize
    if info.file_size != head + need:
        raise DumpError(
            f"{where}: the zip directory gives it {info.file_size} bytes, but its header's shape {list(shape)} of "
            f"{dtype} needs {head + need} (header included); refused before inflating it"
        )
    return name, (dtype, shape, fortran, head), need


def _npy_data(p: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, plan: tuple) -> np.ndarray:
    (dtype, shape, fortran, head), need = plan
    buf, got = bytearray(need), 0  # writable, filled in slices (no second copy of a large array)
    with z.open(info) as f:
        f.read(head)
        while got < need and (piece := f.read(min(need - got, 1 << 24))):
            buf[got : got + len(piece)] = piece
            got += len(piece)
    if got != need:
        raise DumpError(f"{str(p)!r}: array {name!r} holds {got} of its {need} bytes (truncated)")
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")


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
