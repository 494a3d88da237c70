"""Performance measurements behind ``swarmyard bench <area>``; each area module has ``run(quick) -> BenchResult``.

Areas are looked up in a table of import paths and imported only when asked for, so a missing optional
dependency of one area never breaks another.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.errors import UserError

AREAS: dict[str, str] = {
    "store": "swarmyard.bench.store",
    "plane": "swarmyard.bench.plane",
    "broker": "swarmyard.bench.broker",
    "machines": "swarmyard.bench.machines",
    "audit": "swarmyard.bench.audit",
    "swarm": "swarmyard.bench.swarm",
    "wasi": "swarmyard.bench.wasi",
    "faults": "swarmyard.bench.faults",
    "agents": "swarmyard.bench.agents",
}


class _Area(Protocol):
    def run(self, quick: bool = False, **options: object) -> BenchResult: ...


def run_area(area: str, *, quick: bool = False, **options: object) -> BenchResult:
    """Run one benchmark area by name."""
    try:
        path = AREAS[area]
    except KeyError:
        raise UserError(f"unknown benchmark area {area!r}; choose from {', '.join(sorted(AREAS))}") from None
    module: _Area = importlib.import_module(path)
    return module.run(quick=quick, **options)


__all__ = ["AREAS", "BenchResult", "BenchRow", "run_area"]
