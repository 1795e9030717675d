"""The reference and format-context runs (eager in each dtype) cached in the output folder and reused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path

import torch

from flashcheck.core.fileio import LinkRefused, make_folder, open_own, refuse_link, write_atomic
from flashcheck.validate.run import RunOutput

CACHE_VERSION = 4  # 4: generations carry teacher-forced logprobs (KL per position)
WHAT = "validate's cache folder"


def cache_file(out: str | Path, impl: str, dtype: str, key: dict) -> Path:
    """out/cache/{impl}-{dtype}-{hash}.pt; the hash covers every input that changes the run's numbers."""
    text = json.dumps({"v": CACHE_VERSION, "impl": impl, "dtype": dtype, **key}, sort_keys=True, default=str)
    return Path(out) / "cache" / f"{impl}-{dtype}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.pt"


def load_run(path: Path) -> RunOutput | None:
    """The cached run, or None when absent or unreadable (a damaged file is ignored with a warning). A cached file
    or cache/ folder that is a link is refused (LinkRefused): no run is trusted from elsewhere."""
    refuse_link(path.parent, WHAT)
    if not os.path.lexists(path):
        return None
    try:
        with open_own(path, "a cached run of validate") as f:
            return RunOutput.from_state(torch.load(f, map_location="cpu", weights_only=True))
    except LinkRefused:
        raise
    except Exception as e:  # any damage (truncated file, old layout) means: compute again
        warnings.warn(f"ignoring the damaged cache file {str(path)!r}: {type(e).__name__}: {e}", stacklevel=2)
        return None


def save_run(path: Path, run: RunOutput) -> None:
    """Write the run atomically (folders made; never into a linked cache/ folder nor through a link)."""
    make_folder(path.parent, WHAT)
    buf = io.BytesIO()
    torch.save(run.to_state(), buf)
    write_atomic(path, buf.getvalue())
