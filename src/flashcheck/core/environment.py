"""The software and hardware an attention result was measured on: a fingerprint, a pin file, a check."""

from __future__ import annotations

import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import torch

from flashcheck.core.fileio import write_atomic
from flashcheck.core.jsonguard import read_json

PIN_VERSION = 1
# Keys compared by check_pin; "platform" details such as the hostname are deliberately not recorded.
_KEYS = ("python", "platform", "torch", "transformers", "flash_attn", "cuda", "cudnn", "gpu", "impl")


def _package_version(name: str) -> str | None:
    """Installed distribution version, or None; reads metadata only (never imports the package)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _gpu_name() -> str | None:
    """Name of CUDA device 0, or None without one (queried here, never at import time)."""
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a broken driver reads as no GPU: the fingerprint must never raise
        return None
    return None


def environment_fingerprint(impl: str | None = None) -> dict:
    """Versions that decide attention numerics here: python, platform, torch, transformers, flash-attn,
    CUDA, cuDNN, GPU name, and (when given) the attention implementation that ran.

    Missing pieces are None. Values are plain strings so the dict round-trips through JSON.
    """
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "torch": torch.__version__,
        "transformers": _package_version("transformers"),
        "flash_attn": _package_version("flash-attn") or _package_version("flash_attn"),
        "cuda": torch.version.cuda,
        "cudnn": None if cudnn is None else str(cudnn),
        "gpu": _gpu_name(),
        "impl": impl,
    }


def write_pin(path: str | Path, fingerprint: dict) -> None:
    """Write a fingerprint as a pin file (JSON, atomically). Unknown keys raise ValueError."""
    unknown = sorted(set(fingerprint) - set(_KEYS))
    if unknown:
        raise ValueError(f"unknown fingerprint keys {unknown}; expected a subset of {list(_KEYS)}")
    doc = {"flashcheck_pin": PIN_VERSION, "environment": {k: fingerprint.get(k) for k in _KEYS}}
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_pin(path: str | Path) -> dict:
    """The fingerprint stored in a pin file; ValueError when it is missing, unreadable or not a pin."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pin file {str(path)!r} does not exist; write one with --pin FILE")
    try:  # read_json's ValueError names the file and the problem: "'FILE' (pin file) is not JSON (...)"
        doc = read_json(path, "pin file")
    except OSError as e:  # removed after the check above
        raise ValueError(f"pin file {str(path)!r} cannot be read: {e.strerror or e}") from None
    if (
        not isinstance(doc, dict)
        or doc.get("flashcheck_pin") != PIN_VERSION
        or not isinstance(doc.get("environment"), dict)
    ):
        raise ValueError(f"pin file {str(path)!r} is not a flashcheck pin (version {PIN_VERSION})")
    return doc["environment"]


def check_pin(path: str | Path, current: dict | None = None) -> list[str]:
    """Differences between a pin file and the running environment (or `current`), one line each.

    An empty list means the environment matches. The pin's "impl" (one name, or the comma-separated
    implementations a validation ran) is compared only when both sides name one, and matches when the
    running implementation is among the pinned ones. Raises ValueError for a missing or corrupt pin file.
    """
    pinned = read_pin(path)
    now = current if current is not None else environment_fingerprint(pinned.get("impl"))
    diffs = []
    for key in _KEYS:
        want, have = pinned.get(key), now.get(key)
        if key == "impl" and (want is None or have is None or str(have) in str(want).split(",")):
            continue
        if want != have:
            diffs.append(f"{key}: pinned {want!r}, running {have!r}")
    return diffs
