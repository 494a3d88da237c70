"""``swarmyard bench broker``: latency the broker adds over a fast loopback upstream called directly.

Four processes: a fast upstream (a bare asyncio HTTP server answering fixed chat completions, on loopback TCP
and on a Unix socket), the broker served exactly as users run it (``swarmyard serve --providers FILE`` on a
fresh SQLite store, reached over its Unix socket like a worker's agent reaches it), a bare forwarding proxy
served and connected the same way (what the hop alone costs), and this process as the client. One client
(httpx over swarmyard's lean transports) times the upstream directly (over the TCP port the broker calls),
through the broker and through the proxy, in turn call by call so that noise from other work on the machine
falls on all alike; overhead = via - direct at each percentile. Then many streams run through the broker at
once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from swarmyard.bench.children import child_env, stop
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.plane.transport import LoopbackTcpTransport, UnixSocketTransport

_BASE = "http://bench"
_USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
_JSON = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "fast",
        "usage": _USAGE,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok ok ok ok ok"},
            }
        ],
    }
).encode()
_SSE = (
    b"".join(
        b"data: " + json.dumps(c).encode() + b"\n\n"
        for c in [
            *({"choices": [{"index": 0, "delta": {"content": "ok "}}]} for _ in range(5)),
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": _USAGE},
        ]
    )
    + b"data: [DONE]\n\n"
)


# -- the upstream (its own process) ---------------------------------------------------------------------------


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            stream = b'"stream":true' in body.replace(b" ", b"")
            kind, payload = (b"text/event-stream", _SSE) if stream else (b"application/json", _JSON)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _upstream_main(socket_path: str) -> None:
    """Serve on loopback TCP (port printed on stdout) and on ``socket_path`` until stdin closes."""
    tcp = await asyncio.start_server(_answer, "127.0.0.1", 0, backlog=4096)
    unix = await asyncio.start_unix_server(_answer, socket_path, backlog=4096)
    print(tcp.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    tcp.close()
    unix.close()


# -- a bare forwarding proxy (its own process): the floor under any broker on this machine ----------------


def _proxy_main(port: int, socket_path: str) -> None:
    """Forward each POST's body to the upstream and its answer back: no parsing, no token, no store.

    Served as ``swarmyard serve`` serves the broker (uvicorn, same loop and parser) and reaching the upstream
    with the broker's own upstream client, it is what one more hop costs, whatever the broker does.
    """
    from starlette.types import Receive, Scope, Send

    from swarmyard.broker.providers.upstream import Timeouts, UpstreamClient
    from swarmyard.plane.server import Listen, serve

    client: UpstreamClient | None = None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal client
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        status, kind, answer = 200, "application/json", b"{}"
        if scope["method"] == "POST":
            if client is None:
                client = UpstreamClient(f"http://127.0.0.1:{port}/v1", {}, Timeouts(), name="proxy")
            response = await client.post("/chat/completions", body)
            status, kind, answer = (response.status, response.headers.get("content-type", kind),
                                    await response.read())
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    serve(app, Listen(socket_path=Path(socket_path)))


# -- processes ------------------------------------------------------------------------------------------------


def _run_loop(coro: Awaitable[Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]



def _setup(folder: Path) -> str:
    """A goal, a task and a worker token holding a claim, in the store the broker will open."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.domain import GoalSpec, TaskSpec
    from swarmyard.store import open_store

    store = open_store(f"sqlite:///{folder / 'store.db'}")
    try:
        goal = store.create_goal(GoalSpec("bench", budget_micro_usd=10**12, call_cap=0))
        store.create_task(goal.id, TaskSpec("bench", budget_micro_usd=10**12))
        tokens = TokenAuthority(load_or_create_secret(folder / "token-secret"), store)
        token, identity = tokens.issue(goal.id, "main", ttl_s=86400)
        store.claim(goal.id, identity.worker_id, 86400)
        return token
    finally:
        store.close()


async def _ready(socket_path: Path, path: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        if socket_path.exists():
            try:
                async with httpx.AsyncClient(transport=UnixSocketTransport(str(socket_path)), base_url=_BASE) as c:
                    await c.get(path)
                return
            except httpx.TransportError:
                pass
        await asyncio.sleep(0.05)  # polling a child's start: there is no event to wait on
    raise RuntimeError("server did not start")


# -- measuring ------------------------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _interleaved(calls: dict[str, Callable[[], Awaitable[None]]], n: int) -> dict[str, list[float]]:
    """Time ``n`` calls of each, in turn, starting from a different one each round, after a warm-up of all."""
    for _ in range(min(50, n)):
        for call in calls.values():
            await call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    for i in range(n):
        for name, call in order[i % len(order):] + order[:i % len(order)]:
            start = time.perf_counter()
            await call()
            times[name].append((time.perf_counter() - start) * 1000)
    return times


async def _measure(upstream_sock: Path, upstream_port: int, broker_sock: Path, proxy_sock: Path, token: str,
                   n: int, streams: int) -> dict[str, Any]:
    body = {"model": "fast", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
    headers = {"authorization": f"Bearer {token}"}
    out: dict[str, Any] = {}
    async with (
        # the upstream exactly as the broker calls it (loopback TCP), and over its Unix socket for reference
        httpx.AsyncClient(transport=LoopbackTcpTransport("127.0.0.1", upstream_port), base_url=_BASE,
                          timeout=30) as up,
        httpx.AsyncClient(transport=UnixSocketTransport(str(upstream_sock)), base_url=_BASE, timeout=30) as up_unix,
        httpx.AsyncClient(transport=UnixSocketTransport(str(proxy_sock)), base_url=_BASE, timeout=30) as proxy,
        httpx.AsyncClient(transport=UnixSocketTransport(str(broker_sock)), base_url=_BASE, timeout=30,
                          headers=headers) as broker,
    ):
        clients = {"direct": up, "via": broker, "direct_unix": up_unix, "proxy": proxy}
        for label, stream in (("", False), ("stream_", True)):
            payload = json.dumps({**body, "stream": stream}).encode()
            # every call's answer is checked: a whole completion, or a stream to its end
            expect = b"[DONE]" if stream else b"choices"
            out[label] = await _interleaved({name: _caller(name, client, payload, expect)
                                             for name, client in clients.items()}, n)
    out["concurrent"] = await _concurrent(broker_sock, headers, body, streams)
    return out


def _caller(name: str, client: httpx.AsyncClient, payload: bytes,
            expect: bytes) -> Callable[[], Awaitable[None]]:
    """One timed call: POST ``payload``; anything but a 200 holding ``expect`` stops the bench."""

    async def call() -> None:
        r = await client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
        if r.status_code != 200 or expect not in r.content:
            raise RuntimeError(f"{name} answered {r.status_code}: {r.text[:200]}")

    return call


async def _concurrent(broker_sock: Path, headers: dict[str, str], body: dict[str, object],
                      count: int) -> tuple[float, int, list[float]]:
    transport = UnixSocketTransport(str(broker_sock), max_idle=count)
    async with httpx.AsyncClient(transport=transport, base_url=_BASE, headers=headers, timeout=120) as client:

        async def one() -> float | None:
            start = time.perf_counter()
            r = await client.post("/v1/chat/completions", json={**body, "stream": True})
            ok = r.status_code == 200 and b"[DONE]" in r.content
            return (time.perf_counter() - start) * 1000 if ok else None

        start = time.perf_counter()
        done = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        wall = time.perf_counter() - start
    latencies = [d for d in done if isinstance(d, float)]
    return wall, count - len(latencies), latencies or [0.0]


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure the broker's added latency and its behaviour under many concurrent streams."""
    n = 200 if quick else 2000
    streams = 100 if quick else 1000
    result = BenchResult("broker")
    folder = Path(tempfile.mkdtemp(prefix="sy-bench-broker-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        token = _setup(folder)
        upstream_sock, broker_sock = folder / "upstream.sock", folder / "plane.sock"
        upstream = subprocess.Popen([sys.executable, "-m", "swarmyard.bench.broker", "--upstream",
                                     str(upstream_sock)], env=child_env(), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(upstream)
        assert upstream.stdout is not None
        port = int(upstream.stdout.readline() or b"0")
        if not port:
            raise RuntimeError(f"bench upstream failed: {upstream.stderr.read().decode() if upstream.stderr else ''}")
        (folder / "providers.toml").write_text(
            f'[providers.fast]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            'models = ["fast"]\n[providers.fast.prices.fast]\ninput_usd_per_mtok = "0.000001"\n'
            'output_usd_per_mtok = "0.000001"\n', encoding="utf-8")
        broker = subprocess.Popen(
            [sys.executable, "-m", "swarmyard.cli", "serve", "--store", f"sqlite:///{folder / 'store.db'}",
             "--socket", str(broker_sock), "--secret-file", str(folder / "token-secret"),
             "--operator-token-file", str(folder / "operator-token"), "--providers", str(folder / "providers.toml"),
             "--cache-dir", str(folder / "models")],
            env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(broker)
        proxy_sock = folder / "proxy.sock"
        procs.append(subprocess.Popen([sys.executable, "-m", "swarmyard.bench.broker", "--proxy", str(port),
                                       str(proxy_sock)], env=child_env(), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

        async def main() -> dict[str, Any]:
            await _ready(upstream_sock, "/", upstream)
            await _ready(broker_sock, "/healthz", broker)
            await _ready(proxy_sock, "/healthz", procs[-1])
            return await _measure(upstream_sock, port, broker_sock, proxy_sock, token, n, streams)

        measured = _run_loop(main())
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(folder, ignore_errors=True)
    figures: dict[str, float] = {}
    for label, stream in (("", False), ("stream_", True)):
        times = measured[label]
        base, through, unix, proxied = times["direct"], times["via"], times["direct_unix"], times["proxy"]
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            figures[f"{label}overhead_ms_{name}"] = round(max(0.0, _p(through, q) - _p(base, q)), 3)
            figures[f"{label}overhead_vs_unix_ms_{name}"] = round(max(0.0, _p(through, q) - _p(unix, q)), 3)
            figures[f"{label}bare_proxy_overhead_ms_{name}"] = round(max(0.0, _p(proxied, q) - _p(base, q)), 3)
            kind = "streaming" if stream else "plain"
            result.add(BenchRow(f"{kind} latency {name} via broker", round(_p(through, q), 3), "ms",
                                baseline=round(_p(base, q), 3), baseline_name="upstream direct (loopback TCP)",
                                target="+0.5 ms" if name == "p50" else "+3 ms"))
            result.add(BenchRow(f"{kind} latency {name} upstream direct over its Unix socket",
                                round(_p(unix, q), 3), "ms"))
            result.add(BenchRow(f"{kind} latency {name} via a bare forwarding proxy", round(_p(proxied, q), 3), "ms",
                                baseline=round(_p(base, q), 3), baseline_name="upstream direct (loopback TCP)"))
    wall, errors, latencies = measured["concurrent"]
    result.add(BenchRow(f"{streams} concurrent streams, wall time", round(wall, 3), "s"))
    result.add(BenchRow(f"{streams} concurrent streams, p50 stream time", round(_p(latencies, 0.5), 1), "ms"))
    result.summary = {
        **figures,
        "concurrent_streams": streams,
        "concurrent_wall_s": round(wall, 3),
        "concurrent_errors": errors,
        "concurrent_p50_ms": round(_p(latencies, 0.5), 1),
        "requests_per_case": n,
    }
    result.notes.append("upstream, broker (`swarmyard serve --providers`, SQLite store, Unix socket), a bare "
                        "proxy and client in four processes; the calls take turns; overhead = via - direct, where "
                        "direct calls the upstream's loopback TCP port, as the broker does (overhead_vs_unix_*: "
                        "against the same upstream over a Unix socket)")
    result.notes.append("bare_proxy_overhead_*: a proxy served and connected upstream the same way that only "
                        "forwards bytes (no parsing, token, budget or store): what the extra hop alone costs")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--upstream"]:
        _run_loop(_upstream_main(sys.argv[2]))
    elif sys.argv[1:2] == ["--proxy"]:
        _proxy_main(int(sys.argv[2]), sys.argv[3])
