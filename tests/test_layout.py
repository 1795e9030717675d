"""The layout of shared/DESIGN.md, checked on the source: imports flow one way (no floor imports a higher
one), no capability imports another, no import cycles, and no function over 60 lines."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "flashcheck"
FLOORS = {
    "core": 1,
    "kernels": 2,
    "backends": 3,
    "measure": 4,
    "reporting": 4,
    "study": 5,
    "training": 5,
    "validate": 5,
    "guard": 5,
    "doctor": 5,
    "testing": 5,
    "hunt": 5,
    "questions": 6,
    "cli": 6,
    "__main__": 6,  # `python -m flashcheck`: the command line's entry, beside cli
}
CAPABILITIES = {"study", "training", "validate", "guard", "doctor", "testing", "hunt"}
# kernels' rooms, lowest first (docs/architecture-native.md): native code is checked against the torch models of
# formats below it, and everything above calls it; kernels/__init__.py (the package's front) may import any room
KERNEL_ROOMS = {"formats": 1, "native": 2, "tensorcore": 3, "sim": 4, "serving": 5}


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str | None:
    """The top-level part of flashcheck a module belongs to (None: the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A source file parsed once per worker (the graph, its three checks and the line counts share it)."""
    return ast.parse(path.read_text())


def _imports(path: Path) -> set[str]:
    tree = _tree(path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("flashcheck")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flashcheck"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def test_every_part_has_a_floor() -> None:
    for path in SRC.rglob("*.py"):
        part = _part(_module(path))
        assert part is None or part in FLOORS, f"{path.relative_to(SRC)} is outside the layout"


def test_imports_flow_down_and_capabilities_stay_apart() -> None:
    bad = []
    for mod, deps in _graph().items():
        src = _part(mod)
        if src is None:
            continue
        for dep in deps:
            dst = _part(dep)
            if dst is None or dst == src:
                if dst is None and src != "cli":
                    bad.append(f"{mod} imports the package root {dep}")
                continue
            if FLOORS[dst] > FLOORS[src]:
                bad.append(f"{mod} (floor {FLOORS[src]}) imports {dep} (floor {FLOORS[dst]})")
            elif src in CAPABILITIES and dst in CAPABILITIES:
                bad.append(f"capability {mod} imports capability {dep}")
            elif FLOORS[dst] == FLOORS[src] and src != dst and {src, dst} == {"measure", "reporting"}:
                bad.append(f"{mod} imports its sibling floor {dep}")
    assert not bad, "\n".join(sorted(bad))


def _room(module: str) -> str | None:
    """The room of flashcheck.kernels a module is in (None: outside kernels, or the package's __init__)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "kernels" else None


def test_kernel_rooms_flow_down() -> None:
    rooms = {_room(m) for m in _graph()} - {None}
    assert rooms == set(KERNEL_ROOMS), f"kernels' rooms {sorted(rooms)} differ from KERNEL_ROOMS"
    bad = []
    for mod, deps in _graph().items():
        src = _room(mod)
        for dep in deps:
            dst = _room(dep)
            if src and dst and KERNEL_ROOMS[dst] > KERNEL_ROOMS[src]:
                bad.append(f"{mod} (kernels/{src}) imports {dep} (kernels/{dst}, a higher room)")
            elif src and dep == "flashcheck.kernels":
                bad.append(f"{mod} imports the kernels package's front")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_functions_under_60_lines(path: Path) -> None:
    long = [
        f"{node.name} {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, ", ".join(long)
