"""Sandboxed machines: one per worker, with its own disk, process tree, limits and no network but the plane.

Public names load lazily, so a caller that imports one submodule does not load the backends. What runs inside a
machine (its init and what the init imports) is the package ``swarmyard.guest``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmyard.machines.api import BACKENDS, AsyncMachines, Machines
    from swarmyard.machines.protocol import (
        Backend,
        ExecEvent,
        ExecResult,
        Isolation,
        Limits,
        MachineInfo,
        MachineState,
        OutputCap,
    )

_EXPORTS = {
    "BACKENDS": "swarmyard.machines.api",
    "AsyncMachines": "swarmyard.machines.api",
    "Machines": "swarmyard.machines.api",
    "Backend": "swarmyard.machines.protocol",
    "ExecEvent": "swarmyard.machines.protocol",
    "ExecResult": "swarmyard.machines.protocol",
    "Isolation": "swarmyard.machines.protocol",
    "Limits": "swarmyard.machines.protocol",
    "MachineInfo": "swarmyard.machines.protocol",
    "MachineState": "swarmyard.machines.protocol",
    "OutputCap": "swarmyard.machines.protocol",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'swarmyard.machines' has no attribute {name!r}")


__all__ = [  # noqa: RUF022 - grouped as in _EXPORTS
    "BACKENDS", "AsyncMachines", "Machines", "Backend", "ExecEvent", "ExecResult", "Isolation", "Limits",
    "MachineInfo", "MachineState", "OutputCap",
]
