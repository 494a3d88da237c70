"""Model providers behind one Protocol, loaded by name: a missing extra breaks only its own provider."""

from __future__ import annotations

from swarmyard.broker.providers.protocol import CallState, Provider

#: provider kind (a swarm file's ``kind``) -> import path of its class; ``configured`` imports only those used.
KINDS: dict[str, str] = {
    "openai": "swarmyard.broker.providers.openai_compat:OpenAICompatProvider",
    "openai_compatible": "swarmyard.broker.providers.openai_compat:OpenAICompatProvider",
    "anthropic": "swarmyard.broker.providers.anthropic:AnthropicProvider",
    "local": "swarmyard.broker.providers.local:LocalProvider",
    "scripted": "swarmyard.broker.providers.scripted:ScriptedProvider",
    "simulated": "swarmyard.broker.providers.simulated:SimulatedProvider",
}

__all__ = ["KINDS", "CallState", "Provider"]
