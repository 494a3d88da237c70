"""``swarmyard mcp``: the worker tools as a stdio MCP server; token and plane address come from the env."""

from __future__ import annotations

import os


def command() -> None:
    """Serve the worker tools over MCP on stdio (needs SWARMYARD_TOKEN and SWARMYARD_PLANE_SOCKET or _URL)."""
    import anyio

    from swarmyard.agents import governed
    from swarmyard.plane.mcp_server import run_stdio

    env = {k: v for k, v in os.environ.items() if k.startswith("SWARMYARD_")}  # only what the relay needs
    # a governed worker's relay: exec locked before the first message is read (what the agent CLI sends it)
    governed.lock(env.get("SWARMYARD_PROFILE", governed.FULL), "MCP server")
    anyio.run(run_stdio, env)
