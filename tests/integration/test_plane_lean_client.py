"""The agent's lean plane client (no httpx) against a real uvicorn server on a Unix socket and on loopback TCP,
and against servers that refuse, drop or never answer: what it sends, what it reads, how it fails."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swarmyard.agents.builtin import AgentSettings
from swarmyard.agents.entry import _client
from swarmyard.agents.model import BrokerChatModel
from swarmyard.agents.trajectory import StepDraft, TrajectoryReporter
from swarmyard.errors import ProviderError
from swarmyard.plane.lean_client import (
    AnswerLost,
    ConnectFailed,
    Connections,
    LeanClient,
    connect_errors,
    http_errors,
    tcp_opener,
    unix_opener,
)
from swarmyard.plane.server import BackgroundServer, Listen


async def _echo(request: Request) -> Response:
    """Answers what it was sent: the request's headers and its body, decoded."""
    body = await request.body()
    return JSONResponse({"headers": dict(request.headers), "body": json.loads(body), "raw": body.decode()},
                        status_code=201, headers={"X-Should-Retry": "true", "Set-Cookie": "a=1"})


async def _refuse(request: Request) -> Response:
    return Response("no such task", status_code=404)


_APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/refuse", _refuse, methods=["POST"]),
                         Route("/v1/trajectory/steps", _refuse, methods=["POST"])])


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # short: Unix socket paths are limited to 108 bytes
    return short_tmp


@pytest.fixture
def sock(folder: Path) -> Iterator[Path]:
    with BackgroundServer(_APP, Listen(socket_path=folder / "p.sock")):
        yield folder / "p.sock"


@pytest.fixture
def port(folder: Path) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = int(s.getsockname()[1])
    with BackgroundServer(_APP, Listen(socket_path=None, tcp_host="127.0.0.1", tcp_port=free)):
        yield free


def _lean_unix(path: Path) -> LeanClient:
    return LeanClient(Connections(unix_opener(str(path)), str(path)), host="127.0.0.1:9",
                      headers={"Authorization": "Bearer tok"}, timeout_s=30.0)


def test_a_post_sends_compact_json_with_the_token_and_reads_the_whole_answer(sock: Path) -> None:
    async def go() -> list[Any]:
        async with _lean_unix(sock) as http:
            got = []
            for i in range(3):
                answer = await http.post("/echo", json={"i": i, "text": "é", "nested": [1, None]})
                got.append((answer.status_code, answer.headers["x-should-retry"], answer.json()))
            refused = await http.post("/refuse", json={})
            got.append((refused.status_code, refused.text))
            got.append(len(http._connections._idle))
            return got

    *answers, (status, text), idle = asyncio.run(go())
    for i, (code, retry, echoed) in enumerate(answers):
        assert code == 201 and retry == "true"
        assert echoed["body"] == {"i": i, "text": "é", "nested": [1, None]}
        # as httpx encodes it: compact, UTF-8 as is
        assert echoed["raw"] == json.dumps(echoed["body"], ensure_ascii=False, separators=(",", ":"))
        headers = echoed["headers"]
        assert headers["authorization"] == "Bearer tok" and headers["host"] == "127.0.0.1:9"
        assert headers["content-type"] == "application/json"
        assert "accept-encoding" not in headers  # answers come uncompressed
    assert (status, text) == (404, "no such task")
    assert idle == 1  # every request went over the one kept-alive connection


def test_a_body_nan_is_refused_before_sending(sock: Path) -> None:
    async def go() -> None:
        async with _lean_unix(sock) as http:
            await http.post("/echo", json={"x": float("nan")})

    with pytest.raises(ValueError):
        asyncio.run(go())


def test_nothing_listening_is_a_connect_error(folder: Path) -> None:
    async def go() -> None:
        async with _lean_unix(folder / "none.sock") as http:
            await http.post("/echo", json={})

    with pytest.raises(ConnectFailed) as caught:
        asyncio.run(go())
    assert isinstance(caught.value, connect_errors()) and not caught.value.timed_out


class _Mute:
    """A loopback TCP server that reads each request and then closes without an answer (``close``) or never
    answers at all."""

    def __init__(self, close: bool) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.close = close
        self.requests: list[bytes] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.requests.append(conn.recv(65536).split(b"\r\n", 1)[0])
            if self.close:
                conn.close()
            else:
                self.held.append(conn)

    def stop(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("close", [True, False], ids=["dropped", "silent"])
def test_a_request_without_an_answer_is_an_answer_lost_never_a_connect_error(close: bool) -> None:
    mute = _Mute(close)

    async def go() -> None:
        http = LeanClient(Connections(tcp_opener("127.0.0.1", mute.port), "relay"), host="x", headers={},
                          timeout_s=0.5 if not close else 30.0)
        async with http:
            await http.post("/v1/tools/submit_finding", json={"task_id": "t"})

    try:
        with pytest.raises(AnswerLost) as caught:
            asyncio.run(go())
    finally:
        mute.stop()
    assert not isinstance(caught.value, connect_errors()) and isinstance(caught.value, http_errors())
    assert caught.value.timed_out is (not close)
    assert mute.requests == [b"POST /v1/tools/submit_finding HTTP/1.1"]  # sent once, never again


def test_the_model_says_whether_asking_again_is_safe_over_the_lean_client(folder: Path) -> None:
    mute = _Mute(True)

    async def ask(http: LeanClient) -> ProviderError:
        async with http:
            try:
                await BrokerChatModel(http, "m").reply([{"role": "user", "content": "hi"}])
            except ProviderError as exc:
                return exc
        raise AssertionError("no error")

    try:
        unreachable = asyncio.run(ask(_lean_unix(folder / "none.sock")))
        lost = asyncio.run(ask(LeanClient(Connections(tcp_opener("127.0.0.1", mute.port), "relay"), host="x",
                                          headers={}, timeout_s=30.0)))
    finally:
        mute.stop()
    assert unreachable.retryable and "unreachable" in unreachable.message
    assert not lost.retryable and "AnswerLost" in lost.message


def test_a_refused_trajectory_step_is_logged_once_and_not_raised(sock: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with _lean_unix(sock) as http:
            reporter = TrajectoryReporter(http, "worker")
            for step in (1, 2):
                await reporter.report(StepDraft(step, 0), task_id="t", fencing_token=1, action=None)

    with caplog.at_level(logging.INFO, logger="swarmyard.agents.trajectory"):
        asyncio.run(go())
    kept = [r.getMessage() for r in caplog.records if "did not keep" in r.getMessage()]
    assert kept == ["the plane did not keep step 1 of the trajectory: no such task"]


def _agent_client(url: str, socket_path: str | None = None) -> object:
    env = {"SWARMYARD_PLANE_URL": url, "SWARMYARD_TOKEN": "tok", "SWARMYARD_MODEL": "m"}
    if socket_path:
        env["SWARMYARD_PLANE_SOCKET"] = socket_path
    return _client(AgentSettings.from_env(env), env)


def test_the_agent_takes_the_lean_client_for_its_relay_or_socket_and_httpx_for_anything_else(port: int,
                                                                                                sock: Path) -> None:
    relay = _agent_client(f"http://127.0.0.1:{port}")
    on_socket = _agent_client("http://plane", str(sock))
    assert isinstance(relay, LeanClient) and isinstance(on_socket, LeanClient)

    async def go(http: Any) -> Any:
        async with http:
            return (await http.post("/echo", json={"a": 1})).json()

    for http in (relay, on_socket):
        echoed = asyncio.run(go(http))
        assert echoed["body"] == {"a": 1} and echoed["headers"]["authorization"] == "Bearer tok"
    for other in ("https://plane.example:8443", f"http://127.0.0.1:{port}/prefix", "http://10.0.0.1:80"):
        assert isinstance(_agent_client(other), httpx.AsyncClient), other
