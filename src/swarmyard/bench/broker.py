"""``swarmyard bench broker``: latency the broker adds over a fast loopback upstream called directly.

The same upstream (a bare asyncio HTTP server answering fixed chat completions) is timed directly and
through the broker in one run, non-streaming and streaming; then many streams run through the broker at once.
Everything shares one process (and its GIL) on 2 cores, so the figures are an upper bound of the overhead.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from swarmyard.bench.result import BenchResult, BenchRow

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


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            if b'"stream":true' in body.replace(b" ", b""):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                    + str(len(_SSE)).encode()
                    + b"\r\n\r\n"
                    + _SSE
                )
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(_JSON)).encode()
                    + b"\r\n\r\n"
                    + _JSON
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@contextmanager
def _upstream() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(_serve, "127.0.0.1", 0, backlog=4096))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, name="bench-upstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _times(call: Callable[[], None], n: int) -> list[float]:
    for _ in range(min(20, n)):
        call()  # warm connections and caches
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure the broker's added latency and its behaviour under many concurrent streams."""
    from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
    from swarmyard.broker.loopback import serve_in_thread
    from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
    from swarmyard.domain import GoalSpec, TaskSpec
    from swarmyard.plane.tokens import TokenAuthority
    from swarmyard.store import open_store

    n = 100 if quick else 1000
    streams = 100 if quick else 1000
    result = BenchResult("broker")
    body = {"model": "fast", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
    with tempfile.TemporaryDirectory() as tmp, _upstream() as upstream:
        store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        goal = store.create_goal(GoalSpec("bench", budget_micro_usd=10**12, call_cap=0))
        store.create_task(goal.id, TaskSpec("bench", budget_micro_usd=10**12))
        tokens = TokenAuthority(b"b" * 32, store)
        token, identity = tokens.issue(goal.id, "main", ttl_s=86400)
        store.claim(goal.id, identity.worker_id, 86400)
        provider = OpenAICompatProvider(f"{upstream}/v1", None, name="fast")
        settings = BrokerSettings(routes=(ModelRoute("fast", "fast", input_per_mtok=1, output_per_mtok=1),))
        app = create_broker_app(store, tokens, {"fast": provider}, settings)
        headers = {"authorization": f"Bearer {token}"}
        with serve_in_thread(app) as broker, httpx.Client(headers=headers, timeout=30) as client:
            figures: dict[str, float] = {}
            for label, stream in (("", False), ("stream_", True)):
                payload = {**body, "stream": stream}

                def direct(payload: dict[str, object] = payload) -> None:
                    client.post(f"{upstream}/v1/chat/completions", json=payload).read()

                def via(payload: dict[str, object] = payload) -> None:
                    response = client.post(f"{broker}/v1/chat/completions", json=payload)
                    response.read()
                    if response.status_code != 200:
                        raise RuntimeError(f"broker answered {response.status_code}: {response.text[:200]}")

                base, through = _times(direct, n), _times(via, n)
                for name, q in (("p50", 0.5), ("p99", 0.99)):
                    overhead = max(0.0, _p(through, q) - _p(base, q))
                    figures[f"{label}overhead_ms_{name}"] = round(overhead, 3)
                    result.add(
                        BenchRow(
                            f"{'streaming' if stream else 'plain'} latency {name} via broker",
                            round(_p(through, q), 3),
                            "ms",
                            baseline=round(_p(base, q), 3),
                            baseline_name="upstream direct",
                            target="+0.5 ms" if name == "p50" else "+3 ms",
                        )
                    )
            wall, errors, latencies = asyncio.run(_concurrent(broker, headers, body, streams))
            result.add(BenchRow(f"{streams} concurrent streams, wall time", round(wall, 3), "s"))
            result.add(
                BenchRow(f"{streams} concurrent streams, p50 stream time", round(_p(latencies, 0.5), 1), "ms")
            )
        store.close()
    result.summary = {
        **figures,
        "concurrent_streams": streams,
        "concurrent_wall_s": round(wall, 3),
        "concurrent_errors": errors,
        "concurrent_p50_ms": round(_p(latencies, 0.5), 1),
        "requests_per_case": n,
    }
    result.notes.append("upstream, broker and client share one process and its GIL; overhead = via - direct")
    return result


async def _concurrent(
    broker: str, headers: dict[str, str], body: dict[str, object], count: int
) -> tuple[float, int, list[float]]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(headers=headers, timeout=120, limits=limits) as client:

        async def one() -> float | None:
            start = time.perf_counter()
            async with client.stream(
                "POST", f"{broker}/v1/chat/completions", json={**body, "stream": True}
            ) as r:
                data = await r.aread()
            return (
                (time.perf_counter() - start) * 1000 if r.status_code == 200 and b"[DONE]" in data else None
            )

        start = time.perf_counter()
        done = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        wall = time.perf_counter() - start
    latencies = [d for d in done if isinstance(d, float)]
    return wall, count - len(latencies), latencies or [0.0]
