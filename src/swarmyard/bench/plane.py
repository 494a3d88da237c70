"""``swarmyard bench plane``: worker tool calls per second over the Unix socket.

The plane runs as ``swarmyard serve`` would, in a child process on a fresh SQLite store; simulated workers
(one async httpx client each, like real workers, over swarmyard's lean Unix-socket transport) claim a task
each, then alternate ``board_post`` and ``board_read``. The workers are spread over several client
processes, each with its own event loop, so the client side is not one Python thread. The baseline is a
bare Starlette echo endpoint served by the same uvicorn setup over the same kind of socket, driven by the
very same client processes in the same run. Both are measured served by one process and by two (as
``swarmyard serve --workers 2`` serves), the baseline always by as many processes as the plane.
``duplicates`` counts tasks that two workers both hold (it must be 0).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from swarmyard.bench.children import child_env, stop
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.errors import SwarmyardError
from swarmyard.plane.client import AsyncToolClient
from swarmyard.plane.transport import UnixSocketTransport

_BASE = "http://plane"



def _wait_for(socket_path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        if socket_path.exists():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url=_BASE) as c:
                    c.get("/healthz")
                return
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    raise RuntimeError("server did not start")



async def _drive(socket_path: Path, tokens: Sequence[str], total: int, *, echo: bool) -> dict[str, Any]:
    """Run ``tokens``' workers in this process until ``total`` calls are made; raw figures for merging."""
    latencies: list[float] = []
    claimed: list[str] = []
    errors = 0
    remaining = total

    async def worker(token: str) -> None:
        nonlocal remaining, errors
        # httpx's own client API over swarmyard's lean Unix-socket transport (the default httpcore stack
        # costs about 1 ms of CPU per request, more than the plane spends answering it).
        async with httpx.AsyncClient(transport=UnixSocketTransport(str(socket_path)), base_url=_BASE,
                                     timeout=120, headers={"authorization": f"Bearer {token}"}) as http:
            tools = AsyncToolClient(http)  # the plane's own client: its paths, and the claim filled in
            if not echo:
                remaining -= 1
                t0 = time.perf_counter()
                try:
                    task = (await tools.claim_task()).task
                except SwarmyardError:
                    task = None
                latencies.append(time.perf_counter() - t0)
                if task is None:
                    errors += 1
                    return
                claimed.append(task.id)
            i = 0
            while remaining > 0:
                remaining -= 1
                i += 1
                payload = {"body": f"step {i}"} if i % 2 else {"limit": 20}
                t0 = time.perf_counter()
                if echo:
                    status = (await http.post("/echo", json=payload)).status_code
                else:  # the answer's JSON is decoded (not read into its type: the bench measures the plane)
                    status, _ = await tools.send("board_post" if i % 2 else "board_read", payload)
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    errors += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(t) for t in tokens))
    return {"latencies": latencies, "claimed": claimed, "errors": errors, "started": started,
            "ended": time.monotonic()}


def _summarise(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge the client processes' figures: calls/s over the span from the first start to the last end."""
    latencies = sorted(x for p in parts for x in p["latencies"])
    claimed = Counter(t for p in parts for t in p["claimed"])
    elapsed = max(p["ended"] for p in parts) - min(p["started"] for p in parts)
    n = len(latencies)
    return {"calls": n, "calls_per_s": n / elapsed if elapsed > 0 else 0.0,
            "errors": sum(p["errors"] for p in parts),
            "p50_ms": latencies[n // 2] * 1000 if n else 0.0,
            "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else 0.0,
            "duplicates": sum(c - 1 for c in claimed.values() if c > 1)}


def _drive_processes(socket_path: Path, tokens: Sequence[str], total: int, *, echo: bool,
                     processes: int) -> dict[str, Any]:
    """Spread the workers over ``processes`` client processes (each its own event loop) and merge."""
    procs = []
    shares = [list(tokens[i::processes]) for i in range(processes)]
    try:
        for i, share in enumerate(shares):
            calls = total // processes + (1 if i < total % processes else 0)
            proc = subprocess.Popen([sys.executable, "-m", "swarmyard.bench.plane", "--drive", str(socket_path),
                                     str(calls), "echo" if echo else "plane"], env=child_env(),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(share).encode() + b"\n")
            proc.stdin.flush()
        for proc in procs:  # every client has imported and opened its clients before any starts
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"bench client failed: {proc.stderr.read().decode() if proc.stderr else ''}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.close()
        parts = []
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            out = proc.stdout.read()
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"bench client failed: {proc.stderr.read().decode()}")
            parts.append(json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return _summarise(parts)


def _client_main(socket_path: str, calls: str, mode: str) -> None:
    tokens = json.loads(sys.stdin.readline())
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    print(json.dumps(_run_loop(_drive(Path(socket_path), tokens, int(calls), echo=mode == "echo"))))


def _run_loop(coro: Any) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: dict[str, Any] = uvloop.run(coro)
    return result


def _setup(folder: Path, workers: int) -> tuple[str, list[str]]:
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.domain import GoalSpec, TaskSpec
    from swarmyard.store import open_store

    store = open_store(f"sqlite:///{folder / 'store.db'}")
    try:
        tokens = TokenAuthority(load_or_create_secret(folder / "token-secret"), store)
        goal = store.create_goal(GoalSpec(objective="bench", budget_micro_usd=10**9, call_cap=10**6))
        for i in range(workers):
            store.create_task(goal.id, TaskSpec(title=f"t{i}"))
        return goal.id, [tokens.issue(goal.id, "main", ttl_s=3600)[0] for _ in range(workers)]
    finally:
        store.close()


def _measure(folder: Path, tokens: Sequence[str], total: int, *, clients: int, servers: int,
             renew_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(echo, plane) figures, each served by ``servers`` processes and driven by the same client processes."""
    base = _drive_server(["--echo", str(folder / "echo.sock"), str(servers)], folder / "echo.sock", tokens, total,
                         echo=True, clients=clients)
    got = _drive_server(["--serve", str(folder), str(renew_s), str(servers)], folder / "plane.sock", tokens, total,
                        echo=False, clients=clients)
    return base, got


def _drive_server(args: list[str], socket_path: Path, tokens: Sequence[str], total: int, *, echo: bool,
                  clients: int) -> dict[str, Any]:
    """Start this module as a server with ``args``, drive it once it listens on ``socket_path``, stop it."""
    server = subprocess.Popen([sys.executable, "-m", "swarmyard.bench.plane", *args], env=child_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(socket_path, server)
        return _drive_processes(socket_path, tokens, total, echo=echo, processes=clients)
    finally:
        stop(server)


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure tool calls/s with 100 and 1,000 concurrent workers (fewer calls with ``quick``), served by one
    process and by two (``swarmyard serve --workers 2``); each echo baseline is served by as many processes."""
    concurrencies = (10, 50) if quick else (100, 1000)
    total = 400 if quick else 20_000
    renew_s = float(str(options.get("renew_interval_s", 5.0)))
    clients = int(str(options.get("clients", 2)))
    server_counts = (1, 2)
    result = BenchResult(area="plane")
    by: dict[str, dict[str, Any]] = {str(n): {} for n in server_counts}
    for workers in concurrencies:
        for servers in server_counts:
            folder = Path(tempfile.mkdtemp(prefix="sy-bench-"))
            try:
                _, tokens = _setup(folder, workers)
                base, got = _measure(folder, tokens, total, clients=clients, servers=servers, renew_s=renew_s)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            by[str(servers)][str(workers)] = {**got, "baseline_calls_per_s": base["calls_per_s"]}
            served = f"{workers} workers, {servers} server process{'es' if servers > 1 else ''}"
            echo_name = f"bare Starlette echo, {servers} process{'es' if servers > 1 else ''}"
            result.add(BenchRow(f"tool calls/s, {served}", got["calls_per_s"], "calls/s",
                                baseline=base["calls_per_s"], baseline_name=echo_name, target=">= 3000"))
            result.add(BenchRow(f"p50 latency, {served}", got["p50_ms"], "ms", baseline=base["p50_ms"],
                                baseline_name=echo_name))
            result.add(BenchRow(f"p99 latency, {served}", got["p99_ms"], "ms", baseline=base["p99_ms"],
                                baseline_name=echo_name))
    # The headline is the serving setup a user would pick (the better worst case), with every figure kept.
    best = max(by, key=lambda n: min(v["calls_per_s"] for v in by[n].values()))
    runs = [v for per in by.values() for v in per.values()]
    result.summary = {
        "calls_per_s": min(v["calls_per_s"] for v in by[best].values()),
        "p99_ms": max(v["p99_ms"] for v in by[best].values()),
        "duplicates": sum(v["duplicates"] for v in runs),
        "errors": sum(v["errors"] for v in runs),
        "server_processes": int(best),
        "calls_per_s_1_process": min(v["calls_per_s"] for v in by["1"].values()),
        "renew_interval_s": renew_s,
        "client_processes": clients,
        "by_server_processes": by,
    }
    result.notes.append(f"clients: one async httpx client per worker (swarmyard's Unix-socket transport), spread "
                        f"over {clients} client processes that share the machine's cores with the server; the "
                        "echo baseline, driven the same way and served by as many processes, bounds what can be "
                        "seen; calls_per_s is the worst worker count of the better serving setup "
                        f"({best} process{'es' if best != '1' else ''})")
    result.notes.append(f"plane settings: swarmyard serve's lease renewal interval ({renew_s:g} s: a call within "
                        "it of the last renewal checks the claim without renewing it); the per-worker rate limit "
                        "is lifted so that it does not cap the measurement")
    return result


def _serve_echo(socket_path: str, processes: str) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from swarmyard.plane.server import Listen, serve_processes

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    # Served exactly as `swarmyard serve --workers N` serves the plane (forked processes, one shared socket).
    serve_processes(lambda: Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/healthz", healthz)]),
                    Listen(socket_path=Path(socket_path)), int(processes))


def _serve_plane(folder: str, renew_s: str, processes: str) -> None:
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.plane.assembly import Assembled, assemble, serve_assembled
    from swarmyard.plane.server import Listen
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.store import open_store

    base = Path(folder)
    url = f"sqlite:///{base / 'store.db'}"
    secret = load_or_create_secret(base / "token-secret")
    settings = PlaneSettings(lease_s=300, renew_min_interval_s=float(renew_s), rate_per_s=10**6, rate_burst=10**6)

    def make() -> Assembled:
        store = open_store(url)  # after the fork: each serving process has its own connections
        return assemble(store, TokenAuthority(secret, store), settings)

    # assembled and served as `swarmyard serve --workers N` serves the plane (no providers: no broker)
    serve_assembled(make, Listen(socket_path=base / "plane.sock"), processes=int(processes))


if __name__ == "__main__":
    if sys.argv[1] == "--echo":
        _serve_echo(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--drive":
        _client_main(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "--serve":
        _serve_plane(sys.argv[2], sys.argv[3], sys.argv[4])
