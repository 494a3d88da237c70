"""``swarmyard mcp`` as a real subprocess, driven by the MCP SDK's own stdio client, relaying to a real plane."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from test_plane_tools import Plane, _goal, start_plane

from swarmyard.clock import FakeClock
from swarmyard.plane.tools import TOOL_NAMES


@pytest.fixture
def plane(tmp_path: Path, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(f"sqlite:///{tmp_path / 'store.db'}", clock)


def test_mcp_lists_the_tools_and_a_call_lands_in_the_store(plane: Plane) -> None:
    goal_id, tasks = _goal(plane, "main")
    token, who = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    # this environment's own console script (a virtual environment's, say), not whichever is first on PATH
    here = Path(sys.executable).parent / "swarmyard"
    exe = str(here) if here.exists() else shutil.which("swarmyard") or str(here)
    params = StdioServerParameters(command=exe, args=["mcp"],
                                   env={"SWARMYARD_TOKEN": token, "SWARMYARD_PLANE_SOCKET": plane.socket})

    async def session() -> tuple[set[str], dict[str, object], dict[str, object], bool, str]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            listed = {tool.name for tool in (await client.list_tools()).tools}
            claimed = await client.call_tool("claim_task", {})
            posted = await client.call_tool("board_post", {"kind": "progress", "body": "via mcp"})
            refused = await client.call_tool("board_post", {"body": "x" * 20_000})
            text = refused.content[0].text  # type: ignore[union-attr]
            return (listed, json.loads(claimed.content[0].text),  # type: ignore[union-attr]
                    json.loads(posted.content[0].text), refused.is_error, text)  # type: ignore[union-attr]

    listed, claimed, posted, refused_is_error, refused_text = anyio.run(session)
    assert listed == set(TOOL_NAMES)
    assert claimed["task"]["id"] == tasks["main"]  # type: ignore[index]
    assert posted["post"]["body"] == "via mcp"  # type: ignore[index]
    board = plane.store.read_board(goal_id)
    assert [(p.body, p.author, p.task_id) for p in board] == [("via mcp", who.worker_id, tasks["main"])]
    assert refused_is_error and json.loads(refused_text)["error"]["code"] == "payload_too_large"
