"""Installs are reproducible: constraints.txt pins every package the README's commands ask for, torch at the local
CPU build, and the package's own torch requirement is a range that admits it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt line {line!r} is not NAME==VERSION"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0]).lower()


def test_constraints_pin_every_package_the_readme_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    readme = (ROOT / "README.md").read_text()
    extras = set()
    for line in readme.splitlines()[:8]:
        for group in re.findall(r"-e '\.\[([a-z,]+)\]'", line):
            extras.update(group.split(","))
    assert {"test", "plots", "validate"} <= extras, extras
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        wanted |= {_name(r) for r in project["optional-dependencies"][extra]}
    pins = _pins()
    assert not wanted - set(pins), f"not pinned in constraints.txt: {sorted(wanted - set(pins))}"
    assert pins["torch"] == "2.13.0"
    torch_req = next(r for r in project["dependencies"] if _name(r) == "torch")
    assert "2.13" not in torch_req.split("<")[0] or ">=" in torch_req, torch_req  # a range, not a pin


def test_the_first_install_line_gives_every_command() -> None:
    """The README's first command installs what every command needs: each extra a command's module names for
    itself (pip install 'flashcheck[X]') is in that line or in the core dependencies, Hypothesis (hunt) among
    them (`hunt` needed an extra the first line did not install)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    first = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "pip install" in ln)
    given = {_name(r) for r in project["dependencies"]}
    for group in re.findall(r"-e '\.\[([a-z,]+)\]'", first):
        for extra in group.split(","):
            given |= {_name(r) for r in project["optional-dependencies"][extra]}
    cli = "\n".join(p.read_text() for p in (ROOT / "src" / "flashcheck" / "cli").glob("*.py"))
    named = set(re.findall(r"flashcheck\[(\w+)\]", cli)) | set(re.findall(r"install_hint\(['\"](\w+)['\"]\)", cli))
    assert "plots" in named and "validate" in named, named  # the check reads what the commands say
    for extra in named:
        assert {_name(r) for r in project["optional-dependencies"][extra]} <= given, (extra, first)
    assert "hypothesis" in given and "hypothesis" in {_name(r) for r in project["dependencies"]}
