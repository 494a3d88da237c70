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

from swarmyard.bench import swarm_run, swarm_sandboxed, swarm_scale
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.bench.swarm_plane import (
    MODEL,
    WorkerClient,
    run_on_uvloop,
    serve_plane,
    tree_cpu_s,
    wait_ready,
)
from swarmyard.domain import GoalSpec, TaskSpec


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
    server = mp.get_context("spawn").Process(target=serve_plane,
                                             args=(url, str(sock), str(secret), latency_s, replicas))
    server.start()
    assert server.pid is not None  # started
    try:
        wait_ready(sock, server, replicas)
        server_cpu, client_cpu = tree_cpu_s(server.pid), time.process_time()
        driven: _Driven = run_on_uvloop(_drive(str(sock), tokens, calls))
        server_cpu, client_cpu = tree_cpu_s(server.pid) - server_cpu, time.process_time() - client_cpu
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
        return swarm_scale.run(asked, str(options.get("store") or "") or None, int(str(options["replicas"])))
    if options.get("compare"):
        return swarm_run.run(list(options["compare"]), float(options.get("upstream_latency") or 2.0))
    if options.get("sandboxed"):
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
