"""The command that installs an optional extra, as this installation needs it."""

from __future__ import annotations

from pathlib import Path


def source_checkout() -> Path | None:
    """The root of the source checkout this flashcheck runs from (an editable install: pyproject.toml and
    constraints.txt beside src/flashcheck), or None for an installed package."""
    root = Path(__file__).resolve().parents[3]
    marks = (root / "pyproject.toml", root / "constraints.txt", root / "src" / "flashcheck")
    if all(p.exists() for p in marks) and 'name = "flashcheck"' in (root / "pyproject.toml").read_text("utf-8"):
        return root
    return None


def install_hint(extra: str) -> str:
    """`pip install ...` of the optional extra `extra`: from a source checkout the checkout itself with its pinned
    constraints (so torch stays the pinned build), else the package from the index."""
    root = source_checkout()
    if root is not None:
        return f"pip install -c {root / 'constraints.txt'} -e '{root}[{extra}]'"
    return f"pip install 'flashcheck[{extra}]'"
