"""One address for several replicas (``swarmyard.plane.failover``): a request moves to the next replica only
when nothing was sent, or when it is safe to repeat; a model call whose connection died after it was sent is
never sent again, by the plane client or by the built-in agent.

Two real loopback servers stand in for replicas: one answers every request, one reads each request whole and
then closes the connection without answering (a replica killed mid-call); a third address is a closed port.
"""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from swarmyard.agents.builtin import AgentSettings
from swarmyard.agents.entry import _client
from swarmyard.agents.model import BrokerChatModel
from swarmyard.errors import ProviderError, UserError
from swarmyard.plane.client import PlaneAddress
from swarmyard.plane.failover import parse_urls

_ANSWER = (b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 1, '
           b'"completion_tokens": 1}, "ok": true}')


class _Replica(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answers: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.requests: list[bytes] = []  # request lines received
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Replica)
        while True:
            line = self.rfile.readline()
            if not line:
                return
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            with server.lock:
                server.requests.append(line.strip())
            if not server.answers:
                return  # the whole request arrived; the replica dies before it answers
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(_ANSWER)).encode() + b"\r\n\r\n" + _ANSWER)


@contextmanager
def _replica(answers: bool) -> Iterator[_Replica]:
    server = _Replica(answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def live() -> Iterator[_Replica]:
    with _replica(True) as server:
        yield server


@pytest.fixture
def dying() -> Iterator[_Replica]:
    with _replica(False) as server:
        yield server


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once this closes


def test_an_address_is_one_url_or_a_list_of_them() -> None:
    assert PlaneAddress.parse("http://a:1/").urls == ("http://a:1",)
    assert PlaneAddress.parse("https://a:1, https://b:2").urls == ("https://a:1", "https://b:2")
    assert PlaneAddress.parse("/run/plane.sock").socket_path == "/run/plane.sock"
    for bad in ("http://a:1,/run/plane.sock", "http://a:1,ftp://b", ","):
        with pytest.raises(UserError):
            parse_urls(bad)


def test_an_unreachable_replica_is_passed_over_for_any_request(closed_port: str, live: _Replica) -> None:
    with PlaneAddress.parse(f"{closed_port},{live.url}").client("tok") as http:
        for _ in range(3):
            answer = http.post("/v1/chat/completions", json={"model": "m"})
            assert answer.status_code == 200
    assert live.requests == [b"POST /v1/chat/completions HTTP/1.1"] * 3


def test_a_call_whose_answer_was_lost_is_not_sent_again(dying: _Replica, live: _Replica) -> None:
    with PlaneAddress.parse(f"{dying.url},{live.url}").client("tok") as http:
        with pytest.raises(httpx.TransportError):
            http.post("/v1/chat/completions", json={"model": "m"})
        with pytest.raises(httpx.TransportError):
            http.post("/v1/tools/submit_finding", json={"task_id": "t", "fencing_token": 1})
    assert dying.requests == [b"POST /v1/chat/completions HTTP/1.1", b"POST /v1/tools/submit_finding HTTP/1.1"]
    assert live.requests == []


def test_a_request_safe_to_repeat_moves_on_after_a_lost_answer(dying: _Replica, live: _Replica) -> None:
    with PlaneAddress.parse(f"{dying.url},{live.url}").client("tok") as http:
        assert http.get("/healthz").status_code == 200
        assert http.post("/v1/tools/board_read", json={}).status_code == 200
        assert http.post("/v1/tools/heartbeat", json={}).status_code == 200
    assert dying.requests == [b"GET /healthz HTTP/1.1"]  # then the live one answers first
    assert live.requests == [b"GET /healthz HTTP/1.1", b"POST /v1/tools/board_read HTTP/1.1",
                             b"POST /v1/tools/heartbeat HTTP/1.1"]


def test_no_replica_reachable_is_a_connect_error(closed_port: str) -> None:
    with PlaneAddress.parse(f"{closed_port},{closed_port}").client("tok") as http, \
            pytest.raises(httpx.ConnectError):
        http.get("/healthz")


def _agent_model(address: str) -> tuple[httpx.AsyncClient, BrokerChatModel]:
    env = {"SWARMYARD_PLANE_URL": address, "SWARMYARD_TOKEN": "tok", "SWARMYARD_MODEL": "m"}
    client = _client(AgentSettings.from_env(env), env)
    return client, BrokerChatModel(client, "m")


def test_the_agent_fails_over_where_nothing_was_sent(closed_port: str, live: _Replica) -> None:
    async def ask() -> str:
        client, model = _agent_model(f"{closed_port},{live.url}")
        async with client:
            return (await model.reply([{"role": "user", "content": "hi"}])).text

    assert asyncio.run(ask()) == "ok"
    assert live.requests == [b"POST /v1/chat/completions HTTP/1.1"]


def test_the_agent_never_sends_a_lost_model_call_twice(dying: _Replica, live: _Replica) -> None:
    async def ask() -> ProviderError:
        client, model = _agent_model(f"{dying.url},{live.url}")
        async with client:
            with pytest.raises(ProviderError) as caught:
                await model.reply([{"role": "user", "content": "hi"}])
            return caught.value

    error = asyncio.run(ask())
    assert not error.retryable  # the agent does not ask again: the call may have been admitted and sent
    assert dying.requests == [b"POST /v1/chat/completions HTTP/1.1"]
    assert live.requests == []


def test_the_async_plane_client_of_the_mcp_relay_fails_over(closed_port: str, dying: _Replica,
                                                             live: _Replica) -> None:
    address = PlaneAddress.from_env({"SWARMYARD_PLANE_URL": f"{closed_port},{dying.url},{live.url}"})

    async def calls() -> tuple[int, type[BaseException] | None]:
        async with address.async_client("tok") as http:
            read = await http.post("/v1/tools/read_findings", json={})  # closed, then lost: repeated on the live
            try:
                await http.post("/v1/tools/board_post", json={"body": "x"})
            except httpx.TransportError as exc:
                return read.status_code, type(exc)
            return read.status_code, None

    status, lost = asyncio.run(calls())
    assert status == 200 and lost is None  # the live replica answers, and is asked first from then on
    assert dying.requests == [b"POST /v1/tools/read_findings HTTP/1.1"]
    assert live.requests == [b"POST /v1/tools/read_findings HTTP/1.1", b"POST /v1/tools/board_post HTTP/1.1"]
