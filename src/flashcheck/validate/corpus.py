"""The texts a validation runs on: the built-in corpus or a user's file (one text per line), sampled."""

from __future__ import annotations

import hashlib
import random
from importlib import resources
from pathlib import Path

MIN_TEXTS = 4  # two queries and two corpus texts at least, for the retrieval comparison


def builtin_corpus() -> list[str]:
    """The package's 1200 texts of mixed length (see corpus_gen.py, which generated them)."""
    text = resources.files("flashcheck.validate").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line.strip()]


def read_texts(path: str | Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file. ValueError for a missing, binary, non-UTF-8 or empty file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--texts {str(p)!r} is not a file; give a UTF-8 text file with one text per line")
    raw = p.read_bytes()
    if b"\x00" in raw:
        raise ValueError(f"--texts {str(p)!r} is a binary file (it contains NUL bytes); give UTF-8 text, one per line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--texts {str(p)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    texts = [line.strip() for line in text.splitlines() if line.strip()]
    if len(texts) < MIN_TEXTS:
        raise ValueError(f"--texts {str(p)!r} has {len(texts)} non-empty lines; at least {MIN_TEXTS} are needed")
    return texts


def sample_texts(texts: list[str], n: int | None, seed: int = 0) -> list[str]:
    """`n` texts drawn without replacement in a fixed pseudo-random order (all of them, shuffled, when n is
    None or larger than the list). ValueError when fewer than MIN_TEXTS remain."""
    if n is not None and n < MIN_TEXTS:
        raise ValueError(f"--samples {n} is not allowed; at least {MIN_TEXTS} are needed")
    if len(texts) < MIN_TEXTS:
        raise ValueError(f"{len(texts)} texts given; at least {MIN_TEXTS} are needed")
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    return [texts[i] for i in order[: n or len(texts)]]


def texts_hash(texts: list[str]) -> str:
    """sha256 of the texts in order (a cache key part)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()
