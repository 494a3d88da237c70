"""Agents that run in a worker's machine: the built-in loop and adapters for external agent CLIs.

The names below are imported when first asked for: ``python -m swarmyard.agents`` runs this file before its
``__main__``, which decides from the environment what the agent's start may leave out before the loop is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["AgentOutcome", "AgentSettings", "BuiltinAgent", "Ending", "Role"]

#: the module each public name is imported from, when first asked for
_HOMES = {"AgentOutcome": "builtin", "BuiltinAgent": "builtin", "Ending": "builtin", "AgentSettings": "settings",
          "Role": "settings"}

if TYPE_CHECKING:
    from swarmyard.agents.builtin import AgentOutcome, BuiltinAgent, Ending
    from swarmyard.agents.settings import AgentSettings, Role
else:
    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"swarmyard.agents.{home}"), name)
