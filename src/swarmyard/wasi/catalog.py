"""What a WASI tool is (its arguments, caps and folder) and the tools swarmyard ships, built from ``csrc/``.

The shipped modules are compiled from C at install or CI time (``python -m swarmyard.wasi.build``, with clang, lld
and wasi-libc from the distribution's packages), never committed as binaries: what runs is what the source says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from swarmyard.errors import UserError

#: Where ``python -m swarmyard.wasi.build`` puts the shipped modules (``SWARMYARD_WASI_DIR`` overrides it).
BUILT_DIR = Path(__file__).parent / "bin"
#: What to run when a shipped module is missing.
BUILD_HINT = ("build the shipped WASI tools with: python -m swarmyard.wasi.build (it needs clang, lld, wasi-libc "
              "and libclang-rt-dev-wasm32: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32; and for "
              "sqlquery, npm or --sqlite with SQLite's amalgamation)")


class ParamType(StrEnum):
    """The types a tool argument may have; a ``path`` is a string checked to stay inside the tool's folder."""

    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    PATH = "path"


@dataclass(frozen=True, slots=True)
class WasiCaps:
    """What one call may use: wasm fuel (about one unit an instruction), linear memory, wall-clock time, stdout."""

    fuel: int = 1_000_000_000
    memory_bytes: int = 64 << 20
    wall_s: float = 10.0
    output_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class WasiToolSpec:
    """One tool an agent may call: its module, its folder (preopened as ``/data``) and its typed arguments."""

    name: str
    description: str
    wasm: Path
    folder: Path
    params: dict[str, ParamType] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    writer: bool = False
    caps: WasiCaps = WasiCaps()
    #: arguments the swarm file fixed: the model is not shown them and cannot give them; every call has them
    fixed: dict[str, Any] = field(default_factory=dict)
    #: the arguments the model is shown (``None``: every one not fixed); the rest keep the tool's defaults
    offered: tuple[str, ...] | None = None

    def shown(self) -> list[str]:
        """The arguments the model is shown and may give."""
        return [n for n in self.params if n not in self.fixed and (self.offered is None or n in self.offered)]

    def json_schema(self) -> dict[str, Any]:
        """The arguments as the JSON schema a model is shown (a path is a string relative to the folder), less
        the fixed ones."""
        kinds = {ParamType.STRING: "string", ParamType.PATH: "string", ParamType.INTEGER: "integer",
                 ParamType.BOOLEAN: "boolean"}
        shown = self.shown()
        return {"type": "object", "properties": {n: {"type": kinds[self.params[n]]} for n in shown},
                "required": [r for r in self.required if r in shown], "additionalProperties": False}

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON (how the launcher hands it to the agent in the machine)."""
        return {"name": self.name, "description": self.description, "wasm": str(self.wasm),
                "folder": str(self.folder), "params": {n: t.value for n, t in self.params.items()},
                "required": list(self.required), "writer": self.writer,
                "caps": {"fuel": self.caps.fuel, "memory_bytes": self.caps.memory_bytes,
                         "wall_s": self.caps.wall_s, "output_bytes": self.caps.output_bytes},
                "fixed": dict(self.fixed), "offered": None if self.offered is None else list(self.offered)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WasiToolSpec:
        """The mirror of :meth:`to_dict`."""
        caps, default = data.get("caps", {}), WasiCaps()
        return cls(str(data["name"]), str(data["description"]), Path(data["wasm"]), Path(data["folder"]),
                   {str(n): ParamType(t) for n, t in dict(data.get("params", {})).items()},
                   tuple(str(r) for r in data.get("required", ())), bool(data.get("writer", False)),
                   WasiCaps(int(caps.get("fuel", default.fuel)),
                            int(caps.get("memory_bytes", default.memory_bytes)),
                            float(caps.get("wall_s", default.wall_s)),
                            int(caps.get("output_bytes", default.output_bytes))),
                   dict(data.get("fixed") or {}),
                   None if data.get("offered") is None else tuple(str(n) for n in data["offered"]))


@dataclass(frozen=True, slots=True)
class ShippedTool:
    """A tool swarmyard ships: its description and arguments (the module comes from ``csrc/NAME.c``)."""

    description: str
    params: dict[str, ParamType]
    required: tuple[str, ...]


_P, _S, _I, _B = ParamType.PATH, ParamType.STRING, ParamType.INTEGER, ParamType.BOOLEAN

#: The tools a swarm file can name by ``wasm = "NAME"``.
SHIPPED: dict[str, ShippedTool] = {
    "jsonquery": ShippedTool(
        "Pick one value out of a JSON file by a path like .orders[2].total or .[\"a key\"] ('.' is the whole "
        "file). Answers found, type, length and the value.",
        {"path": _P, "query": _S}, ("path", "query")),
    "csvdiff": ShippedTool(
        "Compare two CSV files record by record on a key column (default: the first): rows added, removed "
        "and each changed cell, matched by header name. With keys=true only which records differ: differ (how "
        "many) and value (their keys, sorted, each once).",
        {"left": _P, "right": _P, "key": _S, "max": _I, "keys": _B}, ("left", "right")),
    "textsearch": ShippedTool(
        "Find lines holding a literal text in a file or a folder (path, default '.'): path, line number and "
        "text of each, at most max_matches.",
        {"pattern": _S, "path": _P, "ignore_case": _B, "max_matches": _I}, ("pattern",)),
    "sqlquery": ShippedTool(
        "Run one read-only SQL query (SQLite) over a database file (database) or a CSV file loaded as a table "
        "(csv; table, default 'data'; numbers stored as numbers, empty fields as NULL): columns, rows of typed "
        "values, row_count and truncated (at max_rows, default 100).",
        {"query": _S, "database": _P, "csv": _P, "table": _S, "max_rows": _I}, ("query",)),
}
#: Modules built beside the shipped tools for the benchmark and the tests: a trivial call and an endless loop.
BENCH_MODULES = ("echo", "spin")


def built_dir() -> Path:
    """The folder the shipped modules are read from."""
    given = os.environ.get("SWARMYARD_WASI_DIR")
    return Path(given) if given else BUILT_DIR


def shipped_wasm(name: str) -> Path:
    """The built module of a shipped tool (or a benchmark module); ``UserError`` says how to build it."""
    if name not in SHIPPED and name not in BENCH_MODULES:
        raise UserError(f"no shipped WASI tool is named {name!r}; shipped: {', '.join(sorted(SHIPPED))}")
    path = built_dir() / f"{name}.wasm"
    if not path.is_file():
        raise UserError(f"the shipped WASI tool {name!r} is not built ({path} is missing): {BUILD_HINT}")
    return path
