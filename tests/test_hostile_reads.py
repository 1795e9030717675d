"""Files the tool reads, as hostile input (issue 34 items 5-7): damaged torch.distributed.checkpoint folders;
drift and validate on links, FIFOs and corrupt pickles; judge's decompression and allocation bombs, overlapping
and empty dumps, non-finite inputs. Each is one line and exit 2, nothing read outside the folder named."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

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
    "declared-2^40": (lambda f: _edit_metadata(f, _declared_size), "declares size [1048576, 1048576] (4398046511104 bytes)"),
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
