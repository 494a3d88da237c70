"""Running the built-in agent from its environment: what ``python -m swarmyard.agents`` calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from swarmyard.agents import governed
from swarmyard.agents.actions import TOOLS, with_attached
from swarmyard.agents.builtin import AgentOutcome, BuiltinAgent
from swarmyard.agents.model import BrokerChatModel
from swarmyard.agents.plane_route import lean_route
from swarmyard.agents.settings import QUOTED, AgentSettings, Role
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.agents.trajectory import TrajectoryReporter
from swarmyard.errors import SwarmyardError
from swarmyard.plane.lean_client import (
    Connections,
    LeanClient,
    connect_errors,
    http_errors,
    tcp_opener,
    unix_opener,
)

if TYPE_CHECKING:
    import httpx

    from swarmyard.plane.lean_client import ClosingHttpClient


#: How long a request may wait to connect, and for its answer: model calls on a CPU model can take minutes; the
#: exec timeout outside bounds the whole run.
_TIMEOUT_S = 600.0


def _transport(plane_url: str, socket: str | None) -> httpx.AsyncBaseTransport | None:
    """The lean transport for the plane's socket or the machine's loopback relay, where the URL is one of those.

    httpx's own builds an SSL context at construction, TLS or not (about 7 MiB and 80 ms of CPU, in every
    machine), and spends about a millisecond of CPU a request; the relay and the socket speak plain HTTP/1.1.
    Any other URL keeps httpx's transport, with its TLS checks."""
    import httpx

    from swarmyard.plane.transport import LoopbackTcpTransport, UnixSocketTransport

    if socket:
        return UnixSocketTransport(socket)
    url = httpx.URL(plane_url)
    if url.scheme == "http" and url.host in ("127.0.0.1", "localhost") and url.port is not None:
        return LoopbackTcpTransport("127.0.0.1", url.port)
    return None


def _lean(plane_url: str, socket: str | None, headers: Mapping[str, str]) -> ClosingHttpClient | None:
    """A client without httpx (see :mod:`swarmyard.plane.lean_client`) for the plane's socket or the machine's
    loopback relay (:func:`~swarmyard.agents.plane_route.lean_route`); ``None`` for any other URL."""
    route = lean_route(plane_url, socket)
    if route is None:
        return None
    host, where = route
    connections = (Connections(unix_opener(where), where) if isinstance(where, str) else
                   Connections(tcp_opener("127.0.0.1", where), f"127.0.0.1:{where}"))
    return LeanClient(connections, host=host, headers=headers, timeout_s=_TIMEOUT_S)


def _client(settings: AgentSettings, env: Mapping[str, str]) -> ClosingHttpClient:
    base, socket = settings.plane_url, env.get("SWARMYARD_PLANE_SOCKET")
    headers = {"Authorization": f"Bearer {settings.token}"}
    lean = _lean(base, socket, headers)
    if lean is not None:
        return lean
    import httpx

    transport = _transport(base, socket) if socket or "," not in base else None
    if transport is None and not socket and "," in base:
        # several replicas: the one that answers, moving on only where nothing was sent (see plane.failover)
        from swarmyard.plane.failover import AsyncFailoverTransport, parse_urls

        urls = parse_urls(base)
        base = urls[0]
        transport = AsyncFailoverTransport(
            urls, lambda url: _transport(str(url), None) or httpx.AsyncHTTPTransport())
    return httpx.AsyncClient(base_url=base, transport=transport, timeout=httpx.Timeout(_TIMEOUT_S), headers=headers)


async def run_agent(settings: AgentSettings, env: Mapping[str, str]) -> AgentOutcome:
    """Run one agent to its end."""
    async with contextlib.aclosing(_client(settings, env)) as client:
        # submit_artifact only matters where scores steer the work; a smaller tool schema keeps small models fast
        scored = settings.policy == "explore" or (bool(settings.history) and settings.role is Role.WORKER)
        tools = TOOLS if scored else {k: v for k, v in TOOLS.items() if k != "submit_artifact"}
        wasi = governed.wasi_tools(settings.wasi_tools, settings.workdir)
        tools = governed.offered(tools, settings.profile, wasi)
        if settings.attach_result:
            tools = with_attached(tools)
        if settings.finding == QUOTED and settings.role is Role.WORKER:
            from swarmyard.agents.quoted import with_quoted  # a quoted run's alone

            tools = with_quoted(tools)
        model = BrokerChatModel(client, settings.model, mode=settings.mode, max_tokens=settings.max_tokens,
                                tools=tools)
        local = LocalTools(settings.workdir, exec_timeout_s=settings.exec_timeout_s)
        trajectory = TrajectoryReporter(client, settings.role.value)
        return await BuiltinAgent(model, PlaneTools(client), local, settings, trajectory, wasi=wasi).run()


async def run_planner(settings: AgentSettings, env: Mapping[str, str]) -> dict[str, object]:
    """Run the planner: one schema-constrained call (one re-ask), the plan submitted as a finding."""
    from swarmyard.agents.planner import PLAN_TOOL, PlannerAgent, plan_tool  # one agent of a run plans

    async with contextlib.aclosing(_client(settings, env)) as client:
        tools = {PLAN_TOOL: plan_tool(settings.plan_count)}
        model = BrokerChatModel(client, settings.model, max_tokens=settings.max_tokens, tools=tools)
        planner = PlannerAgent(model, PlaneTools(client), count=settings.plan_count, task_id=settings.task_id)
        return await planner.run()


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the outcome as one JSON line on stdout; exit 0 ok, 1 a swarmyard error."""
    del argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="agent %(levelname)s: %(message)s")
    env = dict(os.environ)
    try:
        settings = AgentSettings.from_env(env)
        governed.lock(settings.profile, "agent")  # before the first reply is read: from here on, no exec
        if settings.role is Role.PLANNER:
            sys.stdout.write(json.dumps(asyncio.run(run_planner(settings, env))) + "\n")
            return 0
        outcome = asyncio.run(run_agent(settings, env))
    except SwarmyardError as exc:
        sys.stderr.write(f"agent error ({exc.code}): {exc.message}\n")
        return 1
    except connect_errors() as exc:  # the plane's socket or relay is not there: nothing was sent
        sys.stderr.write(f"agent error (plane_unreachable): {exc}\n")
        return 1
    except http_errors() as exc:  # a tool call's answer was lost on its way back
        sys.stderr.write(f"agent error (plane_connection_lost): {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write(json.dumps({"ending": outcome.ending.value, "task_id": outcome.task_id,
                                 "finding_id": outcome.finding_id, "steps": outcome.steps,
                                 "malformed": outcome.malformed}) + "\n")
    return 0
