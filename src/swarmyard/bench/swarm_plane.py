"""The control plane the swarm benches serve (:mod:`swarmyard.bench.swarm`, :mod:`swarmyard.bench.swarm_sandboxed`)
and what their drivers share: the plane with the broker on the simulated provider, served in a process of its own
as ``swarmyard serve`` serves it; a wait until it answers; the CPU of a process tree; uvloop for the clients; and
the lean HTTP client the in-process workers (of :mod:`swarmyard.bench.swarm` and
:mod:`swarmyard.bench.swarm_scale`) post through.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmyard.plane.assembly import Assembled

#: The simulated model every swarm bench's workers call.
MODEL = "simulated-model"


def plane_from_env() -> Assembled:
    """The control plane with the broker mounted, on the simulated provider (one per server process), assembled
    as ``swarmyard serve`` assembles its plane (:func:`swarmyard.plane.assembly.assemble`)."""
    import os

    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.broker.providers.simulated import SimulatedProvider
    from swarmyard.config import ModelPrice, ProviderConfig, ProviderKind
    from swarmyard.plane.assembly import assemble
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.store import open_store

    store = open_store(os.environ["SWARMYARD_BENCH_STORE"], serving=True)  # as swarmyard serve opens it
    tokens = TokenAuthority(load_or_create_secret(Path(os.environ["SWARMYARD_BENCH_SECRET"])), store)
    latency_s = float(os.environ["SWARMYARD_BENCH_LATENCY_S"])
    # the table's entry makes the route (free, answers of at most 64 tokens); the object given for it answers
    # in 16 tokens after the fixed latency
    table = {"sim": ProviderConfig(kind=ProviderKind.SIMULATED, models=(MODEL,), latency_s=latency_s,
                                   prices={MODEL: ModelPrice(max_output_tokens=64)})}
    provider = SimulatedProvider(name="sim", latency_s=latency_s, output_tokens=16)
    return assemble(store, tokens, PlaneSettings(rate_per_s=1000.0, rate_burst=1000), providers=table,
                    given={"sim": provider})


def serve_plane(url: str, socket_path: str, secret_path: str, latency_s: float, replicas: int) -> None:
    """Serve as ``swarmyard serve`` does (:func:`swarmyard.plane.assembly.serve_assembled`): one process, or
    ``replicas`` stateless ones on one socket (the plane's scale-out), with the same server settings (the
    connection limits, no proxy-header parsing, no access log)."""
    import os

    from swarmyard.plane.assembly import serve_assembled
    from swarmyard.plane.server import Listen

    os.environ.update(SWARMYARD_BENCH_STORE=url, SWARMYARD_BENCH_SECRET=secret_path,
                      SWARMYARD_BENCH_LATENCY_S=str(latency_s))
    serve_assembled(plane_from_env, Listen(Path(socket_path)), processes=replicas)


class WorkerClient:
    """The one call the agent's tool and model clients make, ``post(path, json=...)``, without httpx's client layers.

    It sends what ``httpx.AsyncClient(base_url=..., headers=...).post(path, json=...)`` sends, byte for byte
    (the headers come from a request httpx built; a test compares the bytes), as an ``httpx.Request`` through
    the same lean Unix-socket transport, and answers with the ``httpx.Response`` the transport parsed. What it
    leaves out is client-side only: URL merging, the cookie jar, the auth and redirect hooks, the response
    stream wrappers. Those cost the 1,000 in-process workers about 0.3 ms of CPU a request, half as much as
    the server spends answering it; in a run each agent pays them in its own process, not the control plane.
    """

    def __init__(self, socket_path: str, token: str, *, base_url: str = "http://plane",
                 timeout_s: float = 600.0) -> None:
        import httpx

        from swarmyard.plane.transport import UnixSocketTransport

        self._transport = UnixSocketTransport(socket_path)
        # a client that never sends (a default one would load the system's CA certificates: 20 ms each)
        template = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"},
                                transport=httpx.BaseTransport()).build_request("POST", "/", json={})
        # every header httpx sends, in its order; the length is the only one that changes from call to call
        self._headers = [(k, v) for k, v in template.headers.raw if k.lower() != b"content-length"]
        self._length_at = next(i for i, (k, _) in enumerate(template.headers.raw) if k.lower() == b"content-length")
        self._base = base_url
        self._urls: dict[str, httpx.URL] = {}
        self._timeout = {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s}

    async def post(self, path: str, *, json: Any) -> Any:
        """``POST`` ``json`` (encoded as httpx encodes it) to ``path``; the buffered ``httpx.Response``."""
        import json as jsonlib

        import httpx

        body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self._base + path)
        headers = list(self._headers)
        headers.insert(self._length_at, (b"Content-Length", str(len(body)).encode()))
        request = httpx.Request("POST", url, headers=headers, content=body, extensions={"timeout": self._timeout})
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the connection."""
        await self._transport.aclose()


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of process ``root`` and its descendants (uvicorn's replica processes)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for pid, seconds in cpu.items():
        walk = pid
        while walk > 1 and walk != root:
            walk = parent.get(walk, 0)
        if walk == root:
            total += seconds
    return total


def run_on_uvloop(coro: Any) -> Any:
    """Run the clients on uvloop, as the server runs: asyncio's own loop costs them about a tenth more CPU."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def wait_ready(sock: Path, server: Any, replicas: int) -> None:
    """Bounded wait until the plane answers /healthz (the socket file exists before it accepts)."""
    import httpx

    deadline = time.monotonic() + 60
    answered = 0
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://plane", timeout=5) as http:
        while answered < 3 * replicas:  # a few answers: every replica has had time to start accepting
            if not server.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's control plane did not start")
            try:
                answered += http.get("/healthz").status_code == 200
            except httpx.TransportError:
                time.sleep(0.05)


__all__ = ["MODEL", "WorkerClient", "plane_from_env", "run_on_uvloop", "serve_plane", "tree_cpu_s", "wait_ready"]
