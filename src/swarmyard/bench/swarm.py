"""``swarmyard bench swarm --workers N``: how close N workers get to the ideal wall time on one host.

Each worker does what a built-in agent does with a model that always takes the same time: claim its task,
then ``calls`` rounds of one model call through the broker (the simulated provider, fixed latency) and one
board post, then submit a finding. The ideal wall time is ``calls x latency`` (every worker in parallel,
nothing else costs anything); the ratio ``wall / ideal`` is what the control plane, the broker and the store
add when N workers share them.

The workers here are asyncio tasks in one process, speaking HTTP over the plane's Unix socket with the same
client code the built-in agent uses (``PlaneTools``, ``BrokerChatModel``). They are not sandboxed: 1,000
sandboxed Python agents cannot even start on 2 cores within an ideal of a few latencies. The control plane
and broker run in their own process, as they do in a run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.domain import GoalSpec, TaskSpec

MODEL = "simulated-model"


def _serve(url: str, socket_path: str, secret_path: str, latency_s: float) -> None:
    """The control plane with the broker mounted, on the simulated provider. Runs in its own process."""
    import uvicorn

    from swarmyard.broker.app import broker_routes
    from swarmyard.broker.providers.simulated import SimulatedProvider
    from swarmyard.broker.settings import BrokerSettings, ModelRoute
    from swarmyard.plane.app import create_app
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.store import open_store

    store = open_store(url)
    tokens = TokenAuthority(load_or_create_secret(Path(secret_path)), store)
    provider = SimulatedProvider(name="sim", latency_s=latency_s, output_tokens=16)
    routes = broker_routes(store, tokens, {"sim": provider},
                           BrokerSettings(routes=(ModelRoute(MODEL, "sim", max_output_tokens=64),)))
    app = create_app(store, tokens, PlaneSettings(rate_per_s=1000.0, rate_burst=1000), extra_routes=routes)
    uvicorn.run(app, uds=socket_path, log_level="warning", loop="uvloop", http="httptools")


@dataclass(frozen=True, slots=True)
class SwarmRun:
    """One measured run."""

    workers: int
    calls: int
    latency_s: float
    wall_s: float
    errors: int
    findings: int

    @property
    def ideal_s(self) -> float:
        """Every worker in parallel, nothing but the model's latency."""
        return self.calls * self.latency_s

    @property
    def overhead_ratio(self) -> float:
        """``wall / ideal``."""
        return self.wall_s / self.ideal_s


async def _worker(socket_path: str, token: str, calls: int) -> bool:
    import httpx

    from swarmyard.agents.model import BrokerChatModel, OutputMode
    from swarmyard.agents.tools import PlaneTools
    from swarmyard.plane.transport import UnixSocketTransport

    # httpx's API (as the agent uses it) over the lean Unix-socket transport: httpx's default stack costs
    # about 1 ms of CPU a request, which 1,000 clients in one process cannot afford
    transport = UnixSocketTransport(socket_path)
    async with httpx.AsyncClient(base_url="http://plane", transport=transport, timeout=httpx.Timeout(600.0),
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        tools = PlaneTools(client)
        model = BrokerChatModel(client, MODEL, mode=OutputMode.TEXT, max_tokens=16)
        if await tools.claim() is None:
            return False
        for step in range(calls):
            await model.reply([{"role": "user", "content": f"step {step}: go on"}])
            await tools.call("board_post", {"kind": "progress", "body": f"step {step} done"})
        await tools.call("submit_finding", {"title": "done", "body": "simulated work", "citations": []})
        return True


async def _drive(socket_path: str, tokens: list[str], calls: int) -> tuple[float, int]:
    began = time.perf_counter()
    results = await asyncio.gather(*(_worker(socket_path, t, calls) for t in tokens), return_exceptions=True)
    wall = time.perf_counter() - began
    return wall, sum(1 for r in results if r is not True)


def measure(workers: int, *, calls: int, latency_s: float) -> SwarmRun:
    """Start a plane + broker process, run ``workers`` simulated workers against it, time them."""
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.store import open_store

    folder = Path(tempfile.mkdtemp(prefix="sy-bench-swarm-", dir="/tmp"))  # short: socket paths are limited
    url, sock, secret = f"sqlite:///{folder / 'store.db'}", folder / "plane.sock", folder / "secret"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("bench swarm", 10**12, workers * (calls + 1))).id
    for i in range(workers):
        store.create_task(goal, TaskSpec(f"task {i}", budget_micro_usd=10**6))
    authority = TokenAuthority(load_or_create_secret(secret), store)
    tokens = [authority.issue(goal, "main", ttl_s=3600)[0] for _ in range(workers)]
    server = mp.get_context("spawn").Process(target=_serve, args=(url, str(sock), str(secret), latency_s),
                                             daemon=True)
    server.start()
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():  # readiness, bounded
            if not server.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's control plane did not start")
            time.sleep(0.05)
        wall, errors = asyncio.run(_drive(str(sock), tokens, calls))
        findings = len(store.read_findings(goal, limit=workers + 10))
    finally:
        server.terminate()
        server.join(timeout=10)
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    return SwarmRun(workers, calls, latency_s, wall, errors, findings)


def run(quick: bool = False, **options: Any) -> BenchResult:
    """Measure ``--workers N`` (default: 100 and 1,000; quick: 20)."""
    result = BenchResult(area="swarm")
    asked = int(options.get("workers") or 0)
    sizes = [asked] if asked else ([20] if quick else [100, 1000])
    calls, latency = (2, 0.5) if quick else (4, 5.0)
    targets = {100: "<= 1.1", 1000: "<= 1.2"}
    last: SwarmRun | None = None
    for n in sizes:
        got = measure(n, calls=calls, latency_s=latency)
        last = got
        result.add(BenchRow(f"{n} workers, {calls} calls of {latency:g} s: wall", got.wall_s, "s", got.ideal_s,
                            "ideal (calls x latency)", targets.get(n)))
        result.summary[f"overhead_ratio_{n}"] = round(got.overhead_ratio, 3)
        if got.errors or got.findings != n:
            result.notes.append(f"{n} workers: {got.errors} failed, {got.findings} findings")
    assert last is not None
    result.summary.update(workers=last.workers, wall_s=round(last.wall_s, 3), ideal_s=last.ideal_s,
                          overhead_ratio=round(last.overhead_ratio, 3), errors=last.errors)
    result.notes.append("workers are in-process asyncio clients of the real plane and broker (not sandboxed); "
                        "see the module docstring")
    return result
