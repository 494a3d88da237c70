"""How much of a text an agent step keeps: the bound the plane validates a step with, and the cut the agent
makes before it reports one. Standard library only: the agent imports it in every machine, and the plane's
request models (pydantic) would cost each agent's process a few MiB and a tenth of a second to import."""

from __future__ import annotations

#: Characters of a reply's text, a tool call's arguments or a tool's result that a step keeps.
MAX_TEXT_CHARS = 8000


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` within ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: limit - 6] + " [...]"
