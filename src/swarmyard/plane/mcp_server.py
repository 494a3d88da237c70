"""``swarmyard mcp``: the worker tools as a stdio MCP server, relaying each call to the control plane.

It runs inside the worker's machine with only its capability token (``SWARMYARD_TOKEN``) and the plane's
address; it holds no state of its own but the current claim, which it fills into later calls so an agent
need not copy ``task_id`` and ``fencing_token`` around (an agent may still pass them explicitly).
Tool errors come back as results with ``is_error`` and the plane's typed error JSON, so the agent sees them; a
message that is not readable JSON-RPC (malformed, nested past the parser's limit) gets a JSON-RPC parse error.
So does a line longer than ``MAX_MESSAGE_BYTES`` (the plane's largest body and room for the envelope): it is
read and dropped in bounded pieces, never held whole, where the SDK's own stdin reader buffers any line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import IO, Any, cast

import anyio
import httpx
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from swarmyard import __version__
from swarmyard.errors import SwarmyardError, UserError
from swarmyard.plane.client import CLAIM, AsyncToolClient, Fence, PlaneAddress
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.tools import TOOL_NAMES, TOOLS

_FENCE = ("task_id", "fencing_token")
#: the longest message line read: the plane's largest body (a ``submit_artifact``) and room for JSON-RPC
MAX_MESSAGE_BYTES = PlaneSettings().max_body_bytes + 64 * 1024
#: what stands in for a line over the limit: not JSON, so the parser refuses it and it is answered as such
_OVERSIZED = "(a message over the size limit was dropped)\n"
_SKIP_BYTES = 64 * 1024


class CappedLines:
    """Lines of a binary stream as UTF-8 text (errors replaced, as the SDK reads them), each at most
    ``limit`` bytes: a longer line is skipped in small pieces and read as ``_OVERSIZED``."""

    def __init__(self, raw: IO[bytes], limit: int = MAX_MESSAGE_BYTES) -> None:
        self._raw = raw
        self._limit = limit

    def readline(self) -> str:
        """The next line, ``_OVERSIZED`` for one over the limit, ``""`` at the end of the stream."""
        line = self._raw.readline(self._limit + 1)
        if len(line) <= self._limit or line.endswith(b"\n"):
            return line.decode("utf-8", errors="replace")
        del line  # not held while the rest is skipped
        while (rest := self._raw.readline(_SKIP_BYTES)) and not rest.endswith(b"\n"):
            pass  # drop the rest of the line a small piece at a time
        return _OVERSIZED


def tool_definitions() -> list[types.Tool]:
    """The MCP tool list: the plane's request schemas, with the claim fields optional (filled in for you)."""
    out = []
    for spec in TOOLS:
        schema = spec.request.model_json_schema()
        schema["required"] = [f for f in schema.get("required", []) if f not in _FENCE]
        out.append(types.Tool(name=spec.name, description=spec.summary, input_schema=schema))
    return out


class Relay:
    """Forwards tool calls to the plane and remembers the claim (the tool client's fence)."""

    def __init__(self, http: httpx.AsyncClient, claim: Fence | None = None) -> None:
        #: ``claim``: the one the launcher may already have made for this worker (external agents start with one)
        self._tools = AsyncToolClient(http, claim)

    @property
    def claim(self) -> Fence | None:
        """The claim filled into every call but ``claim_task``."""
        return self._tools.fence

    async def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[bool, Any]:
        """``(ok, json)`` of one tool call."""
        if name not in TOOL_NAMES:
            return False, {"error": {"code": "unknown_tool", "message": f"no tool named {name!r}",
                                     "retryable": False}}
        body = dict(arguments)
        held = self._tools.fence
        if name == CLAIM and held is not None and not body.get("task_id"):
            # One task at a time: an agent that claims again while it holds a claim is told what it holds
            # (a heartbeat checks the claim is still live) instead of taking a second task.
            ok, lease = await self.call("heartbeat", {})
            if ok:
                return True, {"task": {"id": held.task_id}, "fencing_token": held.fencing_token, "held": True,
                              "lease": lease}
            self._tools.fence = None
        try:
            status, result = await self._tools.send(name, body)
        except httpx.HTTPError as exc:
            return False, {"error": {"code": "plane_unreachable", "message": str(exc) or type(exc).__name__,
                                     "retryable": True}}
        except SwarmyardError as exc:  # a claim answered with what is no ClaimResult
            return False, exc.to_dict()
        return status == 200, result


def build_server(relay: Relay) -> Server[Any]:
    """An MCP server whose tools are the plane's."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ok, result = await relay.call(params.name, params.arguments or {})
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result))],
                                    structured_content=result if isinstance(result, dict) else None,
                                    is_error=not ok)

    return Server("swarmyard", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


async def run_stdio(env: Mapping[str, str]) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    token = env.get("SWARMYARD_TOKEN")
    if not token:
        raise UserError("SWARMYARD_TOKEN is not set: the MCP server needs the worker's capability token")
    address = PlaneAddress.from_env(env)
    async with address.async_client(token) as http:
        claim = None
        if env.get("SWARMYARD_TASK_ID") and env.get("SWARMYARD_FENCING_TOKEN", "").isdigit():
            claim = Fence(env["SWARMYARD_TASK_ID"], int(env["SWARMYARD_FENCING_TOKEN"]))
        server = build_server(Relay(http, claim))
        # the SDK iterates an ``anyio.AsyncFile``, which only calls ``readline`` (in a thread): the one method
        # this has. Given its stdin, the SDK leaves fd 0 alone (nothing here starts a child that could read it).
        stdin = anyio.AsyncFile(cast(IO[str], CappedLines(sys.stdin.buffer)))
        async with stdio_server(stdin=stdin) as (read, write), anyio.create_task_group() as tasks:
            passed, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            tasks.start_soon(answer_unreadable, read, write, passed)
            await server.run(received, write, server.create_initialization_options())
            tasks.cancel_scope.cancel()


async def answer_unreadable(read: Any, write: Any, into: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    """Pass each message from ``read`` on ``into``; answer one the JSON-RPC parser refused (not JSON, nested past
    its limit, a lone surrogate) with a parse error on ``write`` (JSON-RPC 2.0: ``id`` null), where the library
    would drop it without a word and leave the agent waiting."""
    async with into:
        async for item in read:
            if isinstance(item, Exception):
                refusal = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
                    code=types.PARSE_ERROR, message="the message is not JSON-RPC this server can read (malformed, "
                                                    f"nested too deep, or over {MAX_MESSAGE_BYTES} bytes)"))
                await write.send(SessionMessage(refusal))
            else:
                await into.send(item)
