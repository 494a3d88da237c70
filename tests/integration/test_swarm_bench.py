"""``swarmyard bench swarm --quick`` runs end to end and reports the keys the issue names (no timing asserted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swarmyard.bench.swarm import measure, run
from swarmyard.bench.swarm_plane import WorkerClient


@pytest.mark.slow
def test_quick_bench_has_the_summary_keys() -> None:
    result = run(quick=True)
    assert {"workers", "wall_s", "ideal_s", "overhead_ratio"} <= set(result.summary)
    assert result.summary["workers"] == 20 and result.summary["errors"] == 0
    assert result.summary["ideal_s"] == 1.0 and result.summary["overhead_ratio"] > 0
    # where the time went is reported next to the ratio (values are not asserted: they are measurements)
    assert {"server_cpu_ms_per_request_20", "client_cpu_ms_per_request_20"} <= set(result.summary)
    names = [row.name for row in result.rows]
    assert any("last claim answered" in n for n in names) and any("beyond latency" in n for n in names)


@pytest.mark.slow
def test_two_plane_replicas_serve_every_worker() -> None:
    got = measure(10, calls=1, latency_s=0.1, replicas=2)
    assert (got.errors, got.findings) == (0, 10)
    assert got.requests == 10 * 4  # a claim, a model call, a board post and a finding each
    # the server's CPU is counted over both replica processes, not just the one that started them
    assert got.server_cpu_s > 0 and got.client_cpu_s > 0


def test_worker_client_sends_the_bytes_httpx_sends(tmp_path: Path) -> None:
    """The bench's lean worker client is httpx minus its client-side layers: the server sees the same request."""
    import httpx

    from swarmyard.plane.transport import UnixSocketTransport

    seen: list[bytes] = []
    body = '{"ok": "é"}'.encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def scenario() -> list[object]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client closed its connection
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                seen.append(head + await reader.readexactly(length))
                writer.write(answer)
                await writer.drain()
            writer.close()

        sock = str(tmp_path / "s.sock")
        server = await asyncio.start_unix_server(serve, sock)
        payload = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 16}
        async with server:
            async with httpx.AsyncClient(base_url="http://plane", transport=UnixSocketTransport(sock),
                                         headers={"Authorization": "Bearer sy1.t"}) as real:
                first = await real.post("/v1/chat/completions", json=payload)
            lean = WorkerClient(sock, "sy1.t")
            second = await lean.post("/v1/chat/completions", json=payload)
            await lean.aclose()
        return [first.json(), second.json(), first.status_code, second.status_code]

    got = asyncio.run(scenario())
    assert got == [{"ok": "é"}, {"ok": "é"}, 200, 200]
    assert len(seen) == 2 and seen[0] == seen[1]
