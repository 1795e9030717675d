"""Files the tool reads, as hostile input (issue 34 items 5-7): damaged torch.distributed.checkpoint folders;
drift and validate on links, FIFOs and corrupt pickles; judge's decompression and allocation bombs, overlapping
and empty dumps, non-finite inputs. Each is one line and exit 2, nothing read outside the folder named."""

from __future__ import annotations

import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flashcheck.cli import app

runner = CliRunner()


def _one_line_exit_2(res, *needles: str) -> None:
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in res.output, (needle, res.output)


# ---- item 5: torch.distributed.checkpoint folders --------------------------------------------------------------


def _dcp(folder: Path) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)},
                 checkpoint_id=str(folder))  # fmt: skip
    return folder


def _edit_metadata(folder: Path, edit) -> None:
    md = pickle.loads((folder / ".metadata").read_bytes())
    edit(md)
    (folder / ".metadata").write_bytes(pickle.dumps(md))


def _relative_path(target: str):
    def edit(md):
        for info in md.storage_data.values():
            info.relative_path = target

    return edit


def _declared_size(md):
    md.state_dict_metadata["w"].size = torch.Size([2**20, 2**20])  # 2^40 elements, 4 TiB of fp32


def _not_zip(folder: Path) -> None:
    data = folder / "__0_0.distcp"
    data.write_bytes(b"\x65" * data.stat().st_size)  # as long as the real one, so every offset fits


def _linked(folder: Path) -> None:
    (folder / "__0_0.distcp").unlink()
    (folder / "__0_0.distcp").symlink_to(folder.parent / "outside" / "__0_0.distcp")


DAMAGED = {
    "not-a-zip": (_not_zip, "data file '__0_0.distcp' is not readable at [0, "),
    "missing-shard": (lambda f: (f / "__0_0.distcp").unlink(), "No such file or directory"),
    "linked-shard": (_linked, "__0_0.distcp' is a link to"),
    "relative-path-out": (lambda f: _edit_metadata(f, _relative_path("../outside/__0_0.distcp")), "outside its folder"),
    "relative-path-passwd": (lambda f: _edit_metadata(f, _relative_path("../../../../etc/passwd")), "outside its"),
    "declared-2^40": (lambda f: _edit_metadata(f, _declared_size), "[1048576, 1048576] (4398046511104 bytes)"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_damaged_distributed_checkpoint_is_one_line_exit_2_and_nothing_outside_is_read(tmp_path, case):
    """A data file that is not a zip, missing, linked elsewhere or named by a `relative_path` that leaves the
    folder, and a declared size of 2^40 elements: one line naming the folder, exit 2. The file outside is a
    valid copy of the data file, so reading it would succeed: the refusal is what keeps it unread."""
    ok = _dcp(tmp_path / "ok")
    (tmp_path / "outside").mkdir()
    shutil.copy(ok / "__0_0.distcp", tmp_path / "outside" / "__0_0.distcp")
    bad = tmp_path / "bad"
    shutil.copytree(ok, bad)
    damage, needle = DAMAGED[case]
    damage(bad)
    res = runner.invoke(app, ["drift", str(bad), str(ok)])
    _one_line_exit_2(res, f"{str(bad)!r}", needle)


def test_dcp_metadata_unpickler_builds_data_classes_only(tmp_path, monkeypatch):
    """The .metadata allow-list admits torch's checkpoint data classes and enums, never a reader or writer
    defined beside them: a .metadata that builds FileSystemWriter(path) is refused before it is built."""
    from torch.distributed.checkpoint import filesystem

    built = []
    real_init = filesystem.FileSystemWriter.__init__

    def spy(self, *args, **kwargs):
        built.append(args)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(filesystem.FileSystemWriter, "__init__", spy)

    class Planted:
        def __reduce__(self):
            return filesystem.FileSystemWriter, (str(tmp_path / "made"),)

    bad = _dcp(tmp_path / "bad")
    (bad / ".metadata").write_bytes(pickle.dumps(Planted()))
    built.clear()
    res = runner.invoke(app, ["drift", str(bad), str(bad)])
    _one_line_exit_2(res, "FileSystemWriter is not part of checkpoint metadata; refused")
    assert built == [], "the unpickler constructed FileSystemWriter"


def test_an_intact_distributed_checkpoint_reads_every_tensor(tmp_path):
    from flashcheck.training.checkpoints import open_checkpoint

    reader = open_checkpoint(_dcp(tmp_path / "ok"))
    assert reader.keys() == {"w": ((2, 3), torch.float32), "b": ((2,), torch.bfloat16)}
    assert torch.equal(reader.tensor("w"), torch.arange(6.0).reshape(2, 3))
    assert reader.tensor("b").dtype == torch.bfloat16 and reader.tensor("b").tolist() == [1.0, 1.0]


# ---- item 6: drift and validate: links, FIFOs, corrupt pickles ---------------------------------------------------


def _weights(path: Path, value: float) -> Path:
    from flashcheck.training.checkpoints import save_safetensors

    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors({"w": torch.full((4,), value)}, path)
    return path


def _series_step_linked(tmp_path: Path) -> tuple[Path, Path, str]:
    """A series whose step 2 links elsewhere, against a series of steps 1 and 2."""
    _weights(tmp_path / "a" / "step_1.safetensors", 0.0)
    (tmp_path / "a" / "step_2.safetensors").symlink_to(tmp_path / "outside.safetensors")
    return tmp_path / "a", tmp_path / "b", "step_2.safetensors' is a link to"


def _model_file_linked(tmp_path: Path) -> tuple[Path, Path, str]:
    """A model folder whose model.safetensors links elsewhere, against one checkpoint file."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.safetensors").symlink_to(tmp_path / "outside.safetensors")
    return tmp_path / "a", tmp_path / "b" / "step_1.safetensors", "model.safetensors' is a link to"


@pytest.mark.parametrize("layout", [_series_step_linked, _model_file_linked], ids=["series-step", "model-file"])
def test_drift_refuses_a_checkpoint_file_linked_outside_its_folder(tmp_path, layout):
    """A series step or a model folder's model.safetensors that is a link to a file elsewhere is refused like a
    linked shard (one rule, core.fileio.regular_file): one line, exit 2. The target is a valid checkpoint, so
    following the link would have read it."""
    _weights(tmp_path / "outside.safetensors", 1.0)
    folder, other, needle = layout(tmp_path)
    _weights(tmp_path / "b" / "step_1.safetensors", 0.0)
    _weights(tmp_path / "b" / "step_2.safetensors", 0.0)
    res = runner.invoke(app, ["drift", str(folder), str(other)])
    _one_line_exit_2(res, needle, "outside its folder")


@pytest.mark.parametrize("where", ["in-series", "named"])
def test_drift_refuses_a_fifo_instead_of_waiting_on_it(tmp_path, where):
    """A FIFO named like a checkpoint inside a series, or named on the command line: one line, exit 2, at once."""
    _weights(tmp_path / "b" / "step_1.safetensors", 0.0)
    if where == "in-series":
        _weights(tmp_path / "a" / "step_1.safetensors", 0.0)
        fifo = tmp_path / "a" / "step_2.safetensors"
        _weights(tmp_path / "b" / "step_2.safetensors", 0.0)
        target = tmp_path / "a"
    else:
        fifo = target = tmp_path / "fifo"
    os.mkfifo(fifo)
    needle = f"{str(fifo)!r} is a FIFO (named pipe), not a regular file"
    if where == "named":
        _one_line_exit_2(runner.invoke(app, ["drift", str(target), str(tmp_path / "b")]), needle)
        return
    try:  # in a child process: a reader that opens the FIFO waits for a writer that never comes
        proc = subprocess.run([sys.executable, "-m", "flashcheck.cli", "drift", str(target), str(tmp_path / "b")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("drift blocked on a FIFO in the series")
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _copy_model(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.name not in skip:
            shutil.copy(p, dst / p.name)
    return dst


def test_validate_refuses_model_files_or_module_folders_linked_out_of_the_model_folder(tiny_bert, tmp_path):
    """A model.safetensors linked to a file elsewhere, and a sentence-transformers module folder that is a link
    out of the model's folder, are refused before anything is loaded (the target is a working model, so
    following the link would have loaded it): one line, exit 2."""
    from flashcheck.validate.loading import resolve_model

    linked = _copy_model(tiny_bert, tmp_path / "linked-weights", skip=("model.safetensors",))
    (linked / "model.safetensors").symlink_to(tiny_bert / "model.safetensors")
    st = tmp_path / "st"
    st.mkdir()
    (st / "modules.json").write_text('[{"type": "sentence_transformers.models.Transformer", "path": "0_T"}]')
    (st / "0_T").symlink_to(tiny_bert, target_is_directory=True)
    for folder, needle in ((linked, "model.safetensors' is a link to"), (st, "0_T' is a link to")):
        with pytest.raises(ValueError, match="outside its folder"):
            resolve_model(folder)
        res = runner.invoke(app, ["validate", str(folder), "--out", str(tmp_path / "o"), "--quiet"])
        _one_line_exit_2(res, needle, "outside its folder")


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


@pytest.mark.parametrize("kind", ["corrupt", "hostile"])
def test_validate_on_a_corrupt_or_hostile_pytorch_model_bin_is_one_line_exit_2(tiny_bert, tmp_path, kind):
    """pytorch_model.bin that is not a torch zip, or a raw pickle that would run code: one line, exit 2, the
    planted code never run."""
    folder = _copy_model(tiny_bert, tmp_path / "m", skip=("model.safetensors",))
    marker = tmp_path / "code-ran"
    payload = b"PK\x03\x04" + b"\x00" * 60 if kind == "corrupt" else pickle.dumps(_Planted(marker))
    (folder / "pytorch_model.bin").write_bytes(payload)
    args = ["validate", str(folder), "--out", str(tmp_path / "o"), "--quiet", "--samples", "24", "--impls", "eager"]
    res = runner.invoke(app, args)
    needle = "nothing in it was run" if kind == "hostile" else "could not be loaded"
    _one_line_exit_2(res, f"MODEL {str(folder)!r} could not be loaded", needle)
    assert not marker.exists()


# ---- item 7: judge: bombs, shared ranges, empty dumps, non-finite inputs -----------------------------------------


def _arrays(seq_len: int = 16) -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((1, 2, seq_len, 8)).astype(np.float32) for _ in range(3))
    out = torch.softmax(torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2) / 8**0.5, -1) @ torch.from_numpy(v)
    return {"q": q, "k": k, "v": v, "out": out.numpy()}


def _npy(arr: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """The .npy bytes of `arr`, its header declaring `shape` when given (the data left as they are)."""
    import io

    from numpy.lib import format as npy

    buf = io.BytesIO()
    header = npy.header_data_from_array_1_0(arr)
    if shape is not None:
        header["shape"] = shape
    npy.write_array_header_1_0(buf, header)
    buf.write(arr.tobytes())
    return buf.getvalue()


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.fixture
def inflated(monkeypatch) -> list[int]:
    """Bytes handed out by zip members' readers (what has been inflated)."""
    import zipfile

    seen, real = [], zipfile.ZipExtFile.read

    def read(self, n=-1):
        data = real(self, n)
        seen.append(len(data))
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    return seen


def test_judge_refuses_an_unknown_member_before_inflating_it(tmp_path, inflated):
    """An .npz whose extra member inflates to far more than the file (8 MiB of zeros here; 4 GiB in the attack)
    is refused by its name before a byte of it is inflated."""
    members = {f"{n}.npy": _npy(a) for n, a in _arrays().items()}
    members["bomb.npy"] = _npy(np.zeros(2**21, dtype=np.float32))
    path = _npz(tmp_path / "bomb.npz", members)
    assert path.stat().st_size < 2**16
    res = runner.invoke(app, ["judge", str(path)])
    _one_line_exit_2(res, "unknown name(s) 'bomb'")
    assert sum(inflated) == 0, f"{sum(inflated)} bytes inflated before the name was refused"


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ((1, 2, 2**20, 2**19), "its header's shape [1, 2, 1048576, 524288] of float32 needs 4398046511232"),
        ((1, 2, 8, 8), "its header's shape [1, 2, 8, 8] of float32 needs"),
    ],
    ids=["declares-2^40", "member-longer-than-its-shape"],
)
def test_judge_bounds_a_member_by_the_bytes_its_declared_shape_needs(tmp_path, inflated, shape, needle):
    """q.npy whose header declares 2^40 elements (numpy would allocate 4 TiB), or a member whose size in the zip
    directory is more than its shape needs: refused from the header, the data never inflated."""
    members = {f"{n}.npy": _npy(a) for n, a in _arrays().items()}
    members["q.npy"] = _npy(_arrays()["q"], shape)
    res = runner.invoke(app, ["judge", str(_npz(tmp_path / "q.npz", members))])
    _one_line_exit_2(res, "array 'q'", needle)
    assert sum(inflated) < 4096, f"{sum(inflated)} bytes inflated"


def _st(path: Path, tensors: dict[str, np.ndarray], shared: bool = False) -> Path:
    """A safetensors dump; with `shared`, every tensor's entry points at the first one's bytes."""
    import json

    header, data = {}, b""
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        start = 0 if shared else len(data)
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [start, start + len(raw)]}
        data += b"" if shared and data else raw
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def test_judge_refuses_tensors_that_share_one_data_range(tmp_path):
    """q, k, v and out read from one range of bytes: an output equal to its inputs is not a kernel's output."""
    q = _arrays()["q"]
    path = _st(tmp_path / "shared.safetensors", {"q": q, "k": q, "v": q, "out": q}, shared=True)
    _one_line_exit_2(runner.invoke(app, ["judge", str(path)]), "share data bytes")
    intact = runner.invoke(app, ["judge", str(_st(tmp_path / "ok.safetensors", _arrays()))])
    assert intact.exit_code == 0 and "pass" in intact.output, intact.output


def test_judge_refuses_an_empty_dump(tmp_path):
    path = _st(tmp_path / "empty.safetensors", _arrays(seq_len=0))
    _one_line_exit_2(runner.invoke(app, ["judge", str(path)]), "tensor 'q' has shape [1, 2, 0, 8], no values")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_judge_names_non_finite_inputs(tmp_path, bad):
    """NaN (or Inf) in q beside a finite out: the reference is not a number, so nothing can pass; named."""
    a = _arrays()
    a["q"][0, 1, 3, 2] = bad
    path = _st(tmp_path / "nan.safetensors", a)
    word = "1 NaN and 0 infinite" if math.isnan(bad) else "0 NaN and 1 infinite"
    res = runner.invoke(app, ["judge", str(path)])
    _one_line_exit_2(res, f"input 'q' holds {word} values (the first at [0, 1, 3, 2])")


def _two_chunk_dcp(folder: Path, rows: tuple[int, int] = (0, 1)) -> Path:
    """The checkpoint of _dcp with w [2, 3] stored as two row chunks in two data files (as two FSDP ranks write
    it); `rows` gives the chunks' first rows (0, 0 makes them overlap)."""
    import io

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    _dcp(folder)
    md = pickle.loads((folder / ".metadata").read_bytes())
    w = torch.arange(6.0).reshape(2, 3)
    md.state_dict_metadata["w"].chunks = []
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != "w"}
    for rank, row in enumerate(rows):
        buf = io.BytesIO()
        torch.save(w[row : row + 1].clone(), buf)
        (folder / f"__{rank}_1.distcp").write_bytes(buf.getvalue())
        offsets = torch.Size([row, 0])
        md.state_dict_metadata["w"].chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([1, 3])))
        md.storage_data[MetadataIndex("w", offsets)] = _StorageInfo(f"__{rank}_1.distcp", 0, len(buf.getvalue()))
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return folder


def test_a_tensor_in_chunks_across_data_files_reads_as_torch_reads_it(tmp_path):
    """Chunks in several data files are assembled as torch's own dcp.load assembles them (the oracle); chunks
    that overlap are refused."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from flashcheck.training.checkpoints import open_checkpoint

    folder = _two_chunk_dcp(tmp_path / "two")
    theirs = {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(theirs, checkpoint_id=str(folder))
    reader = open_checkpoint(folder)
    assert torch.equal(reader.tensor("w"), theirs["w"]) and torch.equal(theirs["w"], torch.arange(6.0).reshape(2, 3))
    overlap = _two_chunk_dcp(tmp_path / "overlap", rows=(0, 0))
    res = runner.invoke(app, ["drift", str(overlap), str(folder)])
    _one_line_exit_2(res, "tensor 'w': chunks at [0, 0] and [0, 0] overlap")  # 6 elements, as many as [2, 3]
