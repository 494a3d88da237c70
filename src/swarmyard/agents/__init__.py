"""Agents that run in a worker's machine: the built-in loop and adapters for external agent CLIs."""

from swarmyard.agents.builtin import AgentOutcome, BuiltinAgent, Ending
from swarmyard.agents.settings import AgentSettings, Role

__all__ = ["AgentOutcome", "AgentSettings", "BuiltinAgent", "Ending", "Role"]
