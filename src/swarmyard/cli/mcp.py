"""``swarmyard mcp``: the worker tools as a stdio MCP server; token and plane address come from the env."""

from __future__ import annotations

import os


def command() -> None:
    """Serve the worker tools over MCP on stdio (needs SWARMYARD_TOKEN and SWARMYARD_PLANE_SOCKET or _URL)."""
    import anyio

    from swarmyard.plane.mcp_server import run_stdio

    env = {k: v for k, v in os.environ.items() if k.startswith("SWARMYARD_")}  # only what the relay needs
    anyio.run(run_stdio, env)
