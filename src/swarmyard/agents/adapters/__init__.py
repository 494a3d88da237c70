"""Adapters that run external agent CLIs in a machine, pointed at the broker through the in-sandbox relay.

Adapters are looked up by name in a table of import paths and imported only when used.
"""

from __future__ import annotations

import importlib

from swarmyard.agents.adapters.base import Adapter, AdapterContext, AgentLaunch
from swarmyard.errors import ConfigError

ADAPTERS: dict[str, str] = {
    "claude": "swarmyard.agents.adapters.claude:ClaudeAdapter",
    "codex": "swarmyard.agents.adapters.codex:CodexAdapter",
    "opencode": "swarmyard.agents.adapters.opencode:OpencodeAdapter",
    "aider": "swarmyard.agents.adapters.aider:AiderAdapter",
    "pi": "swarmyard.agents.adapters.pi:PiAdapter",
}


def get_adapter(name: str) -> Adapter:
    """The adapter for an agent kind, or ``ConfigError``."""
    try:
        module_path, cls = ADAPTERS[name].split(":")
    except KeyError:
        raise ConfigError(
            f"no adapter for agent {name!r}; choose from {', '.join(ADAPTERS)}", field="workers.agent"
        ) from None
    adapter: Adapter = getattr(importlib.import_module(module_path), cls)()
    return adapter


__all__ = ["ADAPTERS", "Adapter", "AdapterContext", "AgentLaunch", "get_adapter"]
