"""A call still in flight at its goal's deadline is cut there, whole or streamed, before or after the stream began.

The upstream is a bare asyncio server on loopback that reads each request and never answers; it notes when the
broker hangs up on it. Each call is answered ``deadline_passed`` (a 403 with ``x-should-retry: false``, or the
stream's last event once keep-alives had started it), reached the upstream once, and its hold is ``unknown`` at
its worst case: the request had left, so what it cost is not known, and it is never sent again.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from rigs.broker import loopback_broker
from rigs.network import stream_server
from swarmyard.broker import ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.domain import ReservationState
from swarmyard.store import SqlStore

#: seconds from a call's start to its goal's deadline (the broker's clock is a fake one that does not move, so
#: every call gets the whole of it)
DEADLINE_S = 1.0


@dataclass
class Silent:
    """Reads each request whole, answers nothing, and counts the connections the caller closed."""

    posts: list[str] = field(default_factory=list)
    hung_up: int = 0
    port: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            with self.changed:
                self.posts.append(body["model"])
            gone = await reader.read(1) == b""  # no answer is ever written: only the caller ends this
        except (asyncio.IncompleteReadError, ConnectionError):
            gone = True
        finally:
            writer.close()
        with self.changed:
            self.hung_up += gone
            self.changed.notify_all()


@pytest.fixture
def upstream() -> Iterator[Silent]:
    up = Silent()
    with stream_server(up.handle) as up.port:
        yield up


@dataclass
class Rig:
    url: str
    store: SqlStore
    token: str
    goal_id: str
    broker: Broker


@pytest.fixture
def rig(store_url: str, upstream: Silent) -> Iterator[Rig]:
    # the upstream's read timeout is far past the deadline: only the deadline can end these calls
    provider = OpenAICompatProvider(f"http://127.0.0.1:{upstream.port}/v1", None, name="oa",
                                    timeouts=Timeouts(connect_s=2, read_s=600))
    routes = (ModelRoute("slow", "oa", upstream_model="up-slow", input_per_mtok=1_000_000,
                         output_per_mtok=1_000_000),)
    with loopback_broker(store_url, {"oa": provider}, routes, secret=b"d" * 32, deadline_in_s=DEADLINE_S) as on:
        yield Rig(on.url, on.store, on.worker.token, on.worker.goal_id, on.broker)


def _ask(rig: Rig, text: str, *, stream: bool) -> httpx.Response:
    # each its own body: the very body of a call whose hold is unknown is refused before it is held or sent
    body = {"model": "slow", "max_tokens": 50, "stream": stream, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{rig.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {rig.token}"})


def test_a_call_in_flight_at_the_deadline_is_cut_and_its_hold_kept(rig: Rig, upstream: Silent) -> None:
    whole = _ask(rig, "one", stream=False)
    before_stream = _ask(rig, "two", stream=True)  # cut before its first event: answered with a status
    rig.broker.keep_alive_s = 0.2  # the stream begins with keep-alives before the cut: its end says why
    begun = _ask(rig, "three", stream=True)

    for answered in (whole, before_stream):
        assert answered.status_code == 403, answered.text
        assert answered.json()["error"]["code"] == "deadline_passed"
        assert answered.headers["x-should-retry"] == "false"
    assert begun.status_code == 200, begun.text
    assert ": keep-alive" in begun.text and "deadline_passed" in begun.text.splitlines()[-2], begun.text

    # each reached the upstream once, and the broker closed each connection itself
    with upstream.changed:
        assert upstream.changed.wait_for(lambda: upstream.hung_up == 3, timeout=30), upstream.hung_up
    assert upstream.posts == ["up-slow"] * 3
    assert rig.broker.wait_settled(10)
    holds = rig.store.list_reservations(rig.goal_id)
    assert [r.state for r in holds] == [ReservationState.UNKNOWN] * 3
    assert all(r.actual is None and r.amount > 0 for r in holds)
    assert rig.store.get_goal(rig.goal_id).envelope.reserved == sum(r.amount for r in holds)
