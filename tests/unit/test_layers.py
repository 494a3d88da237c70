"""The packages' layers, read from the source: the control plane does not reach up into the swarm or the agents,
and the run's rules (``swarmyard.rules``) import nothing above them.

Every import counts: at the top of a module, in a function, under ``if TYPE_CHECKING:``, relative ones, and
``importlib.import_module`` of a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmyard

_SRC = Path(swarmyard.__file__).resolve().parent

#: What the plane may not import: the coordinator above it and the agents that call it.
_ABOVE_PLANE = ("swarm", "agents")
#: What the rules may not import: everything that does I/O or runs a part of the run.
_ABOVE_RULES = ("plane", "swarm", "agents", "broker", "machines", "cli", "boxd", "store")


def _module_name(path: Path) -> str:
    parts = path.relative_to(_SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, *, package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in ``source``, the source of ``module`` (a package's ``__init__`` when
    ``package``): ``from a import b`` yields ``a.b`` as well as ``a``, since ``b`` may be a module."""
    here = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, name
            for alias in node.names:
                yield node.lineno, f"{name}.{alias.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def violations(package: str, above: tuple[str, ...]) -> list[str]:
    """``path:line: name`` of every import under ``swarmyard/<package>`` of a module under one of ``above``."""
    out: list[str] = []
    modules = sorted((_SRC / package).rglob("*.py"))
    assert modules, f"no module under {package}/"
    for path in modules:
        module = _module_name(path)
        for line, name in imported(path.read_text(encoding="utf-8"), module, package=path.name == "__init__.py"):
            parts = name.split(".")
            if parts[0] == "swarmyard" and len(parts) > 1 and parts[1] in above:
                out.append(f"{path.relative_to(_SRC.parent)}:{line}: {name}")
    return out


def test_the_plane_imports_nothing_from_the_swarm_or_the_agents() -> None:
    assert violations("plane", _ABOVE_PLANE) == []


def test_the_rules_import_nothing_above_them() -> None:
    assert violations("rules", _ABOVE_RULES) == []


def test_the_rules_package_itself_imports_nothing() -> None:
    # the agent in every machine imports some of the rules: their package must not load more on its behalf
    assert list(imported((_SRC / "rules" / "__init__.py").read_text(encoding="utf-8"), "swarmyard.rules",
                         package=True)) == []


def test_the_rules_the_plane_applies_live_in_the_rules() -> None:
    names = {_module_name(p) for p in (_SRC / "rules").rglob("*.py")}
    assert {"swarmyard.rules.policies", "swarmyard.rules.originality", "swarmyard.rules.grounding",
            "swarmyard.rules.no_result", "swarmyard.rules.instructions"} <= names


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("from swarmyard.swarm.policies import explore_move\n", "swarmyard.plane.tools", "swarmyard.swarm.policies"),
    ("def f() -> None:\n    from swarmyard.agents import no_result\n", "swarmyard.plane.tools",
     "swarmyard.agents.no_result"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import swarmyard.swarm.coordinator\n",
     "swarmyard.plane.tools", "swarmyard.swarm.coordinator"),
    ("from ..swarm import completion\n", "swarmyard.plane.tools", "swarmyard.swarm.completion"),
    ("from . import models\n", "swarmyard.plane", "swarmyard.plane.models"),
    ("import importlib\nimportlib.import_module('swarmyard.agents.builtin')\n", "swarmyard.plane.tools",
     "swarmyard.agents.builtin"),
])
def test_every_kind_of_import_is_read(source: str, module: str, expected: str) -> None:
    names = [name for _, name in imported(source, module, package=module == "swarmyard.plane")]
    assert expected in names, names
