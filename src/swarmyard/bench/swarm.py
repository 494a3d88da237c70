"""``swarmyard bench swarm --workers N``: how close N workers get to the ideal wall time on one host.

Each worker does what a built-in agent does with a model that always takes the same time: claim its task,
then ``calls`` rounds of one model call through the broker (the simulated provider, fixed latency) and one
board post, then submit a finding. The ideal wall time is ``calls x latency`` (every worker in parallel,
nothing else costs anything); the ratio ``wall / ideal`` is what the control plane, the broker and the store
add when N workers share them.

The workers here are asyncio tasks in one process (on uvloop, as the server is), speaking HTTP over the plane's
Unix socket with the same client code the built-in agent uses (``PlaneTools``, ``BrokerChatModel``). They are not
sandboxed: 1,000 sandboxed Python agents cannot even start on 2 cores within an ideal of a few latencies. The
control plane and broker run in their own process, as they do in a run.

Where the overhead comes from: every worker starts at once and every model call takes the same time, so the
requests arrive in waves of N (the claims, then each round's settle + board post + next admission) and the last
worker of each wave waits for the whole wave to be served. The overhead is then close to the server's serial
work for all N workers, which is why the result also reports the server's and the clients' CPU per request,
the claim ramp (when the last claim was answered) and how much longer than the latency a model call took.
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


def app_from_env() -> Any:
    """The control plane with the broker mounted, on the simulated provider (one per server process)."""
    import os

    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.broker.app import broker_routes
    from swarmyard.broker.providers.simulated import SimulatedProvider
    from swarmyard.broker.settings import BrokerSettings, ModelRoute
    from swarmyard.plane.app import create_app
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.store import open_store

    store = open_store(os.environ["SWARMYARD_BENCH_STORE"], serving=True)  # as swarmyard serve opens it
    tokens = TokenAuthority(load_or_create_secret(Path(os.environ["SWARMYARD_BENCH_SECRET"])), store)
    provider = SimulatedProvider(name="sim", latency_s=float(os.environ["SWARMYARD_BENCH_LATENCY_S"]),
                                 output_tokens=16)
    routes = broker_routes(store, tokens, {"sim": provider},
                           BrokerSettings(routes=(ModelRoute(MODEL, "sim", max_output_tokens=64),)))
    return create_app(store, tokens, PlaneSettings(rate_per_s=1000.0, rate_burst=1000), extra_routes=routes)


def _serve(url: str, socket_path: str, secret_path: str, latency_s: float, replicas: int) -> None:
    """Serve as ``swarmyard serve`` does: one process, or ``replicas`` stateless ones on one socket (the plane's
    scale-out), with the same server settings (no proxy-header parsing, no access log)."""
    import os

    from swarmyard.plane.server import Listen, serve, serve_processes

    os.environ.update(SWARMYARD_BENCH_STORE=url, SWARMYARD_BENCH_SECRET=secret_path,
                      SWARMYARD_BENCH_LATENCY_S=str(latency_s))
    listen = Listen(Path(socket_path))
    if replicas == 1:
        serve(app_from_env(), listen)
    else:
        serve_processes(app_from_env, listen, replicas)


@dataclass(frozen=True, slots=True)
class SwarmRun:
    """One measured run."""

    workers: int
    calls: int
    latency_s: float
    wall_s: float
    errors: int
    findings: int
    claim_ramp_s: float = 0.0  # from the start until the last worker held its claim
    call_excess_s: float = 0.0  # mean time a model call took beyond the provider's latency
    server_cpu_s: float = 0.0  # CPU of the plane + broker process(es) while the workers ran
    client_cpu_s: float = 0.0  # CPU of this process (the N workers' clients) while they ran

    @property
    def requests(self) -> int:
        """HTTP requests the workers made: a claim, ``calls`` x (model call + board post), a finding each."""
        return self.workers * (2 + 2 * self.calls)

    @property
    def ideal_s(self) -> float:
        """Every worker in parallel, nothing but the model's latency."""
        return self.calls * self.latency_s

    @property
    def overhead_ratio(self) -> float:
        """``wall / ideal``."""
        return self.wall_s / self.ideal_s


@dataclass(slots=True)
class _Timing:
    """What one worker saw (measured with ``perf_counter``, a few calls per request)."""

    claimed_at: float = 0.0
    call_s: float = 0.0  # the model calls' total wall time


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


async def _worker(socket_path: str, token: str, calls: int, timing: _Timing) -> bool:
    from typing import cast

    import httpx

    from swarmyard.agents.model import BrokerChatModel, OutputMode
    from swarmyard.agents.tools import PlaneTools

    # the agent's own tool and model clients (they only ever call ``post``), over the worker's own connection
    lean = WorkerClient(socket_path, token)
    client = cast(httpx.AsyncClient, lean)
    try:
        tools = PlaneTools(client)
        model = BrokerChatModel(client, MODEL, mode=OutputMode.TEXT, max_tokens=16)
        if await tools.claim() is None:
            return False
        timing.claimed_at = time.perf_counter()
        for step in range(calls):
            asked = time.perf_counter()
            await model.reply([{"role": "user", "content": f"step {step}: go on"}])
            timing.call_s += time.perf_counter() - asked
            await tools.call("board_post", {"kind": "progress", "body": f"step {step} done"})
        await tools.call("submit_finding", {"title": "done", "body": "simulated work", "citations": []})
        return True
    finally:
        await lean.aclose()


@dataclass(frozen=True, slots=True)
class _Driven:
    wall_s: float
    errors: int
    claim_ramp_s: float
    call_s_mean: float


async def _drive(socket_path: str, tokens: list[str], calls: int) -> _Driven:
    timings = [_Timing() for _ in tokens]
    began = time.perf_counter()
    workers = (_worker(socket_path, t, calls, tm) for t, tm in zip(tokens, timings, strict=True))
    results = await asyncio.gather(*workers, return_exceptions=True)
    wall = time.perf_counter() - began
    done = [tm for tm, r in zip(timings, results, strict=True) if r is True]
    return _Driven(wall, sum(1 for r in results if r is not True),
                   max((tm.claimed_at - began for tm in done), default=0.0),
                   sum(tm.call_s for tm in done) / max(1, len(done) * calls))


def _tree_cpu_s(root: int) -> float:
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


def _run_on_uvloop(coro: Any) -> Any:
    """Run the clients on uvloop, as the server runs: asyncio's own loop costs them about a tenth more CPU."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _wait_ready(sock: Path, server: Any, replicas: int) -> None:
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


def measure(workers: int, *, calls: int, latency_s: float, replicas: int = 1) -> SwarmRun:
    """Start ``replicas`` plane + broker processes, run ``workers`` simulated workers against them, time them."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.store import open_store

    folder = Path(tempfile.mkdtemp(prefix="sy-bench-swarm-", dir="/tmp"))  # short: socket paths are limited
    url, sock, secret = f"sqlite:///{folder / 'store.db'}", folder / "plane.sock", folder / "secret"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("bench swarm", 10**12, workers * (calls + 1))).id
    for i in range(workers):
        store.create_task(goal, TaskSpec(f"task {i}", budget_micro_usd=10**6))
    authority = TokenAuthority(load_or_create_secret(secret), store)
    tokens = [authority.issue(goal, "main", ttl_s=3600)[0] for _ in range(workers)]
    server = mp.get_context("spawn").Process(target=_serve, args=(url, str(sock), str(secret), latency_s, replicas))
    server.start()
    assert server.pid is not None  # started
    try:
        _wait_ready(sock, server, replicas)
        server_cpu, client_cpu = _tree_cpu_s(server.pid), time.process_time()
        driven: _Driven = _run_on_uvloop(_drive(str(sock), tokens, calls))
        server_cpu, client_cpu = _tree_cpu_s(server.pid) - server_cpu, time.process_time() - client_cpu
        findings = len(store.read_findings(goal, limit=workers + 10))
    finally:
        server.terminate()
        server.join(timeout=10)
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    return SwarmRun(workers, calls, latency_s, driven.wall_s, driven.errors, findings, driven.claim_ramp_s,
                    max(0.0, driven.call_s_mean - latency_s), server_cpu, client_cpu)


def run(quick: bool = False, **options: Any) -> BenchResult:
    """Measure ``--workers N`` (default: 100 and 1,000; quick: 20); 500 or more also with two plane replicas.
    With ``sandboxed``, real machines with the real agent in each (:mod:`swarmyard.bench.swarm_sandboxed`); with
    ``compare`` (worker counts) and ``upstream_latency``, real ``swarmyard run`` processes side by side
    (:mod:`swarmyard.bench.swarm_run`); with ``replicas`` (and ``store``), one size on one goal of that store
    served by that many processes (:mod:`swarmyard.bench.swarm_scale`)."""
    asked = int(options.get("workers") or 0)
    if options.get("replicas"):
        from swarmyard.bench import swarm_scale

        return swarm_scale.run(asked, str(options.get("store") or "") or None, int(str(options["replicas"])))
    if options.get("compare"):
        from swarmyard.bench import swarm_run

        return swarm_run.run(list(options["compare"]), float(options.get("upstream_latency") or 2.0))
    if options.get("sandboxed"):
        from swarmyard.bench import swarm_sandboxed

        return swarm_sandboxed.run(quick, asked)
    result = BenchResult(area="swarm")
    sizes = [asked] if asked else ([20] if quick else [100, 1000])
    calls, latency = (2, 0.5) if quick else (4, 5.0)
    targets = {100: "<= 1.1", 1000: "<= 1.2"}
    best: tuple[SwarmRun, int] | None = None
    for n in sizes:
        for replicas in (1, 2) if n >= 500 else (1,):
            got = measure(n, calls=calls, latency_s=latency, replicas=replicas)
            label = f"{n} workers, {calls} calls of {latency:g} s, {replicas} plane process{'es' if replicas > 1 else ''}"
            result.add(BenchRow(f"{label}: wall", got.wall_s, "s", got.ideal_s, "ideal (calls x latency)",
                                targets.get(n)))
            # where the time went: the server's and the clients' CPU per request, the start-up ramp, the calls
            result.add(BenchRow(f"{label}: server CPU per request", got.server_cpu_s * 1e3 / got.requests, "ms"))
            result.add(BenchRow(f"{label}: clients' CPU per request", got.client_cpu_s * 1e3 / got.requests, "ms"))
            result.add(BenchRow(f"{label}: last claim answered", got.claim_ramp_s, "s"))
            result.add(BenchRow(f"{label}: model call beyond latency (mean)", got.call_excess_s * 1e3, "ms"))
            suffix = "" if replicas == 1 else f"_replicas{replicas}"
            result.summary[f"overhead_ratio_{n}{suffix}"] = round(got.overhead_ratio, 3)
            result.summary[f"server_cpu_ms_per_request_{n}{suffix}"] = round(got.server_cpu_s * 1e3 / got.requests, 3)
            result.summary[f"client_cpu_ms_per_request_{n}{suffix}"] = round(got.client_cpu_s * 1e3 / got.requests, 3)
            if got.errors or got.findings != n:
                result.notes.append(f"{label}: {got.errors} failed, {got.findings} findings")
            if n == sizes[-1] and (best is None or got.overhead_ratio < best[0].overhead_ratio):
                best = (got, replicas)
    assert best is not None
    last, replicas = best
    result.summary.update(workers=last.workers, wall_s=round(last.wall_s, 3), ideal_s=last.ideal_s,
                          overhead_ratio=round(last.overhead_ratio, 3), replicas=replicas, errors=last.errors)
    result.notes.append("workers are in-process asyncio clients of the real plane and broker (not sandboxed); "
                        "replicas are stateless plane processes on one socket over one store")
    return result
