"""Replies for the scripted provider (``kind = "scripted"``), which reads one list of replies per model from JSON."""

from __future__ import annotations

from typing import Any


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """One scripted reply: a single call of the tool ``name`` with ``arguments``."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}
