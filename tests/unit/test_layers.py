"""The packages' layers, read from the source: the control plane does not reach up into the swarm or the agents,
the run's rules (``swarmyard.rules``) import nothing above them, and what runs inside a machine
(``swarmyard.guest``) imports the standard library and itself only.

Every import counts: at the top of a module, in a function, under ``if TYPE_CHECKING:``, relative ones, and
``importlib.import_module`` of a literal name.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmyard

_SRC = Path(swarmyard.__file__).resolve().parent

#: What the plane may not import: the coordinator above it and the agents that call it.
_ABOVE_PLANE = ("swarm", "agents")
#: What the rules may not import: everything that does I/O or runs a part of the run.
_ABOVE_RULES = ("plane", "swarm", "agents", "broker", "machines", "guest", "cli", "boxd", "store")


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


def guest_violations() -> list[str]:
    """``path:line: name`` of every import under ``swarmyard/guest`` of anything but the standard library and the
    guest package itself (``import swarmyard`` too: the package's ``__init__`` loads the error tree)."""
    out: list[str] = []
    modules = sorted((_SRC / "guest").rglob("*.py"))
    assert modules, "no module under guest/"
    for path in modules:
        module = _module_name(path)
        for line, name in imported(path.read_text(encoding="utf-8"), module, package=path.name == "__init__.py"):
            top = name.split(".")[0]
            if (top == "swarmyard" and name != "swarmyard.guest" and not name.startswith("swarmyard.guest.")) or (
                    top != "swarmyard" and top not in sys.stdlib_module_names):
                out.append(f"{path.relative_to(_SRC.parent)}:{line}: {name}")
    return out


def test_the_guest_imports_the_standard_library_and_itself_only() -> None:
    # the machine's init starts with ``python -I -S`` and bare package objects: nothing else is on its way
    assert guest_violations() == []


def test_the_guest_package_itself_imports_nothing() -> None:
    # the governed agent and the launcher's helpers import ``swarmyard.guest.seccomp`` in every governed machine
    assert list(imported((_SRC / "guest" / "__init__.py").read_text(encoding="utf-8"), "swarmyard.guest",
                         package=True)) == []


def test_the_machines_init_and_its_helpers_live_in_the_guest() -> None:
    names = {_module_name(p) for p in (_SRC / "guest").rglob("*.py")}
    assert {"swarmyard.guest.init", "swarmyard.guest.relay", "swarmyard.guest.landlock", "swarmyard.guest.seccomp",
            "swarmyard.guest.noexec", "swarmyard.guest.wire"} <= names
    assert (_SRC / "guest" / "init.c").is_file()
    assert not list((_SRC / "machines").glob("*.c"))


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


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def run_time_imports(source: str, module: str, modules: set[str], *, package: bool = False) -> set[str]:
    """The modules of ``modules`` that ``module`` (whose source is ``source``) imports when it runs: at its top or in a
    function, relative or by ``importlib.import_module`` of a literal name; not under ``if TYPE_CHECKING:``.

    ``from a import b`` names ``a.b`` when that is a module, else ``a``; ``import a.b.c`` names the longest of
    ``a.b.c``, ``a.b``, ``a`` that is one. A package's ``__init__`` is not counted when a submodule is named: it
    has run by then (importing the submodule from inside the package is no circle)."""
    here = module.split(".") if package else module.split(".")[:-1]
    found: set[str] = set()

    def module_of(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            names = [f"{name}.{alias.name}" if f"{name}.{alias.name}" in modules else name for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        found.update(m for m in map(module_of, names) if m is not None and m != module)
        visit(node)

    visit(ast.parse(source))
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Every module of the package and the modules of the package it imports when it runs (read once)."""
    paths = {_module_name(path): path for path in sorted(_SRC.rglob("*.py"))}
    return {module: run_time_imports(path.read_text(encoding="utf-8"), module, set(paths),
                                     package=path.name == "__init__.py")
            for module, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (each a set of modules that
    import one another around a circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


#: Modules that imported each other (one of the two at function level, to hide the circle) until the helpers both
#: needed moved below them: the first imports the second, which now imports nothing of the first.
_ONCE_CIRCLES = [
    ("swarmyard.machines.supervised", "swarmyard.machines.live"),  # both use swarmyard.machines.pids
    ("swarmyard.boxd._client", "swarmyard.boxd._spawn"),
    ("swarmyard.bench.swarm", "swarmyard.bench.swarm_sandboxed"),  # both use swarmyard.bench.swarm_plane
]


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


@pytest.mark.parametrize(("importer", "imported_one"), _ONCE_CIRCLES)
def test_the_modules_that_once_imported_each_other_no_longer_do(importer: str, imported_one: str) -> None:
    graph = import_graph()
    assert imported_one in graph[importer]  # the import that stays: the one way
    assert not _reaches(graph, imported_one, importer), f"{imported_one} imports {importer}, directly or not"


def test_the_package_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("def f() -> None:\n    from swarmyard.machines import live\n", {"swarmyard.machines.live"}),
    ("from . import live\n", {"swarmyard.machines.live"}),
    ("from swarmyard.machines.live import find\n", {"swarmyard.machines.live"}),
    ("import swarmyard.machines.live\n", {"swarmyard.machines.live"}),
    ("from swarmyard.machines import Machines\n", {"swarmyard.machines"}),
    ("import importlib\nimportlib.import_module('swarmyard.machines.live')\n", {"swarmyard.machines.live"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swarmyard.machines import live\n", set()),
    ("import typing\nif typing.TYPE_CHECKING:\n    import swarmyard.machines.live\nelse:\n    import swarmyard.machines\n",
     {"swarmyard.machines"}),
])
def test_the_import_graph_counts_run_time_imports_only(source: str, expected: set[str]) -> None:
    modules = {"swarmyard.machines", "swarmyard.machines.live", "swarmyard.machines.pids"}
    assert run_time_imports(source, "swarmyard.machines.pids", modules) == expected


def test_a_circle_is_found_through_a_third_module() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
