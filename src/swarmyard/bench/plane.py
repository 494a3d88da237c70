"""``swarmyard bench plane``: worker tool calls per second over the Unix socket.

The plane runs as ``swarmyard serve`` in a child process on a fresh SQLite store; simulated workers (one
async httpx client each, like real workers) claim a task each, then alternate ``board_post`` and
``board_read``. The baseline is a bare Starlette echo endpoint served by the same uvicorn setup over the
same kind of socket, measured with the same clients in the same run. ``duplicates`` counts tasks that two
workers both hold (it must be 0).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from swarmyard.bench.result import BenchResult, BenchRow

_BASE = "http://plane"


def _child_env() -> dict[str, str]:
    # Only what a Python child needs; never the whole environment (it may hold provider keys).
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}


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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _drive(socket_path: Path, tokens: Sequence[str], total: int, *, echo: bool) -> dict[str, Any]:
    latencies: list[float] = []
    claimed: list[str] = []
    # One TLS context for all clients: httpx would otherwise load the CA bundle once per client (slow and
    # about a megabyte each), although nothing here speaks TLS.
    tls = ssl.create_default_context()
    errors = 0
    remaining = total

    async def worker(token: str) -> None:
        nonlocal remaining, errors
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path), verify=tls)
        async with httpx.AsyncClient(transport=transport, base_url=_BASE, timeout=120,
                                     headers={"authorization": f"Bearer {token}"}) as http:
            fence: dict[str, Any] = {}
            if not echo:
                remaining -= 1
                t0 = time.perf_counter()
                r = await http.post("/v1/tools/claim_task", json={})
                latencies.append(time.perf_counter() - t0)
                body = r.json()
                if r.status_code != 200 or body["task"] is None:
                    errors += 1
                    return
                claimed.append(body["task"]["id"])
                fence = {"task_id": body["task"]["id"], "fencing_token": body["fencing_token"]}
            i = 0
            while remaining > 0:
                remaining -= 1
                i += 1
                path = "/echo" if echo else ("/v1/tools/board_post" if i % 2 else "/v1/tools/board_read")
                payload = {**fence, "body": f"step {i}"} if i % 2 else {**fence, "limit": 20}
                t0 = time.perf_counter()
                r = await http.post(path, json=payload)
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(t) for t in tokens))
    elapsed = time.perf_counter() - started
    latencies.sort()
    n = len(latencies)
    return {"calls": n, "calls_per_s": n / elapsed, "errors": errors,
            "p50_ms": latencies[n // 2] * 1000 if n else 0.0,
            "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else 0.0,
            "duplicates": sum(c - 1 for c in Counter(claimed).values() if c > 1)}


def _run_loop(coro: Any) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: dict[str, Any] = uvloop.run(coro)
    return result


def _setup(folder: Path, workers: int) -> tuple[str, list[str]]:
    from swarmyard.domain import GoalSpec, TaskSpec
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret
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


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure tool calls/s with 100 and 1,000 concurrent workers (fewer calls with ``quick``)."""
    concurrencies = (10, 50) if quick else (100, 1000)
    total = 400 if quick else 20_000
    renew_s = float(str(options.get("renew_interval_s", 5.0)))
    result = BenchResult(area="plane")
    by: dict[str, Any] = {}
    for workers in concurrencies:
        folder = Path(tempfile.mkdtemp(prefix="sy-bench-"))
        try:
            _, tokens = _setup(folder, workers)
            echo_sock, plane_sock = folder / "echo.sock", folder / "plane.sock"
            echo = subprocess.Popen([sys.executable, "-m", "swarmyard.bench.plane", "--echo", str(echo_sock)],
                                    env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _wait_for(echo_sock, echo)
                base = _run_loop(_drive(echo_sock, tokens, total, echo=True))
            finally:
                _stop(echo)
            plane = subprocess.Popen(
                [sys.executable, "-m", "swarmyard.bench.plane", "--serve", str(folder), str(renew_s)],
                env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _wait_for(plane_sock, plane)
                got = _run_loop(_drive(plane_sock, tokens, total, echo=False))
            finally:
                _stop(plane)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        by[str(workers)] = {**got, "baseline_calls_per_s": base["calls_per_s"]}
        result.add(BenchRow(f"tool calls/s, {workers} workers", got["calls_per_s"], "calls/s",
                            baseline=base["calls_per_s"], baseline_name="bare Starlette echo", target=">= 3000"))
        result.add(BenchRow(f"p50 latency, {workers} workers", got["p50_ms"], "ms",
                            baseline=base["p50_ms"], baseline_name="bare Starlette echo"))
        result.add(BenchRow(f"p99 latency, {workers} workers", got["p99_ms"], "ms",
                            baseline=base["p99_ms"], baseline_name="bare Starlette echo"))
    result.summary = {
        "calls_per_s": min(v["calls_per_s"] for v in by.values()),
        "p99_ms": max(v["p99_ms"] for v in by.values()),
        "duplicates": sum(v["duplicates"] for v in by.values()),
        "errors": sum(v["errors"] for v in by.values()),
        "renew_interval_s": renew_s,
        "by_workers": by,
    }
    result.notes.append("clients are one async httpx client per worker in one process; the client side "
                        "shares the 2 cores with the server, so the echo baseline bounds what can be seen")
    return result


def _serve_echo(socket_path: str) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from swarmyard.plane.server import Listen, serve

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    serve(Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/healthz", healthz)]),
          Listen(socket_path=Path(socket_path)))


def _serve_plane(folder: str, renew_s: str) -> None:
    from swarmyard.plane.app import create_app
    from swarmyard.plane.server import Listen, serve
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.store import open_store

    base = Path(folder)
    store = open_store(f"sqlite:///{base / 'store.db'}")
    tokens = TokenAuthority(load_or_create_secret(base / "token-secret"), store)
    settings = PlaneSettings(lease_s=300, renew_min_interval_s=float(renew_s), rate_per_s=10**6, rate_burst=10**6)
    serve(create_app(store, tokens, settings), Listen(socket_path=base / "plane.sock"))


if __name__ == "__main__":
    if sys.argv[1] == "--echo":
        _serve_echo(sys.argv[2])
    elif sys.argv[1] == "--serve":
        _serve_plane(sys.argv[2], sys.argv[3])
