"""The plane's client against the plane itself: it covers every worker tool the plane mounts, and each answer the
real server sends (assembled as ``swarmyard serve`` assembles it, served on loopback TCP) reads into the client's
type field for field as the server's own pydantic model reads it. Both faces: the blocking one over httpx, the
async one over the built-in agent's lean client, and the agent's own reads (its board, findings and scores)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarmyard.agents.tools import PlaneTools
from swarmyard.auth.tokens import TokenAuthority
from swarmyard.domain import Citation, CitationKind, GoalSpec, PostKind, Task, TaskSpec, TaskState
from swarmyard.errors import StaleFencingTokenError
from swarmyard.plane import tool_results as r
from swarmyard.plane.assembly import assemble
from swarmyard.plane.client import (
    AsyncToolClient,
    Fence,
    ToolClient,
    board_post_call,
    board_read_call,
    read_findings_call,
    submit_artifact_call,
    tool_path,
)
from swarmyard.plane.lean_client import Connections, LeanClient, tcp_opener
from swarmyard.plane.server import Listen
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.tools import TOOL_NAMES, TOOLS
from swarmyard.store import open_store
from swarmyard.store.protocol import Store

RESPONSES = {spec.name: spec.response for spec in TOOLS}


class _Scripted:
    """An evaluator stand-in: an artifact ``score=N ...`` scores N."""

    async def score(self, goal: str, data: bytes, split: str) -> dict[str, Any]:
        found = re.match(rb"score=(-?\d+)", data)
        return {"goal": goal, "artifact_sha256": hashlib.sha256(data).hexdigest(), "split": split,
                "score": int(found[1]) if found else 0, "signature": "sig"}


@dataclass
class Served:
    port: int
    tokens: list[str]
    store: Store


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", blob_dir=tmp_path / "blobs")
    tokens = TokenAuthority(b"k" * 32, store)
    goal = store.create_goal(GoalSpec("find it", 1_000_000, 100, policy="explore")).id
    store.offer_directions(goal, "main", ("proof", "disproof"), patience=3, adopt_margin=10)
    for i in range(2):
        store.create_task(goal, TaskSpec(f"lens {i}", prompt=f"look at {i}", budget_micro_usd=100_000, call_cap=10))
    made = assemble(store, tokens, PlaneSettings(lease_s=60), evaluator=_Scripted())
    try:
        with made.background(Listen(socket_path=None, tcp_host="127.0.0.1", tcp_port=0)) as server:
            assert server.tcp_port is not None
            yield Served(server.tcp_port, [tokens.issue(goal, "main", ttl_s=3600)[0] for _ in range(3)], store)
    finally:
        store.close()


class Recorded:
    """Each tool's last raw answer, as the transport below saw it."""

    def __init__(self) -> None:
        self.raw: dict[str, bytes] = {}

    def keep(self, url: str, content: bytes) -> None:
        self.raw[url.removeprefix("/v1/tools/")] = content


class _SyncRecording:
    def __init__(self, http: httpx.Client, seen: Recorded) -> None:
        self._http, self._seen = http, seen

    def post(self, url: str, *, json: Any = None) -> httpx.Response:
        response = self._http.post(url, json=json)
        self._seen.keep(url, response.content)
        return response


class _AsyncRecording:
    def __init__(self, http: LeanClient, seen: Recorded) -> None:
        self._http, self._seen = http, seen

    async def post(self, url: str, *, json: Any = None) -> Any:
        response = await self._http.post(url, json=json)
        self._seen.keep(url, response.content)
        return response


def _every_tool(call: Callable[[str], Any]) -> dict[str, Any]:
    """Each tool called once through ``call(name)``, in an order in which each can succeed."""
    return {name: call(name) for name in ("claim_task", "heartbeat", "board_post", "board_read", "submit_finding",
                                          "read_findings", "claim_direction", "read_directions", "submit_artifact",
                                          "delegate")}


def _sync_call(tools: ToolClient) -> Callable[[str], Any]:
    calls: dict[str, Callable[[], Any]] = {
        "claim_task": lambda: tools.claim_task(model=None),
        "heartbeat": tools.heartbeat,
        "board_post": lambda: tools.board_post("halfway there", PostKind.PROGRESS),
        "board_read": lambda: tools.board_read(limit=20),
        "submit_finding": lambda: tools.submit_finding("found", "it is there",
                                                       [Citation(CitationKind.POST, "1")]),
        "read_findings": tools.read_findings,
        "claim_direction": lambda: tools.claim_direction("proof"),
        "read_directions": tools.read_directions,
        "submit_artifact": lambda: tools.submit_artifact(b"score=7 an attempt", "text/plain"),
        "delegate": lambda: tools.delegate("a part of it", "look closer", budget_micro_usd=1000, call_cap=1),
    }
    return lambda name: calls[name]()


def _async_call(tools: AsyncToolClient, loop: asyncio.AbstractEventLoop) -> Callable[[str], Any]:
    calls: dict[str, Callable[[], Any]] = {
        "claim_task": lambda: tools.claim_task(max_tokens=64),
        "heartbeat": tools.heartbeat,
        "board_post": lambda: tools.board_post("halfway there"),
        "board_read": lambda: tools.board_read(kinds=[PostKind.NOTE]),
        "submit_finding": lambda: tools.submit_finding("found", "it is there too"),
        "read_findings": lambda: tools.read_findings(limit=5),
        "claim_direction": tools.claim_direction,
        "read_directions": tools.read_directions,
        "submit_artifact": lambda: tools.submit_artifact(b"score=3 another attempt"),
        "delegate": lambda: tools.delegate("another part"),
    }
    return lambda name: loop.run_until_complete(calls[name]())


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(value)))


def _check(results: dict[str, Any], seen: Recorded) -> None:
    assert set(results) == TOOL_NAMES == set(seen.raw)
    for name, result in results.items():
        assert type(result) is r.RESULTS[name], name
        # the client's reading of the real answer is the server model's reading of it, field for field
        assert _as_json(result) == RESPONSES[name].model_validate_json(seen.raw[name]).model_dump(mode="json"), name
    claimed = results["claim_task"]
    assert isinstance(claimed.task, Task) and claimed.task.state is TaskState.CLAIMED
    assert claimed.fencing_token == results["heartbeat"].fencing_token
    assert results["board_read"].posts[-1].kind is PostKind(results["board_post"].post.kind)
    assert results["read_findings"].findings[-1] == results["submit_finding"].finding
    assert results["submit_artifact"].score["score"] in (3, 7)
    assert results["submit_artifact"].scored == results["submit_artifact"].score["score"]
    assert results["delegate"].task.parent_id == claimed.task.id


def test_the_client_reads_every_tool_the_plane_mounts() -> None:
    assert set(r.RESULTS) == TOOL_NAMES
    for name, kind in r.RESULTS.items():
        fields = {f.name: f.default is dataclasses.MISSING for f in dataclasses.fields(kind)}
        model = {n: f.is_required() for n, f in RESPONSES[name].model_fields.items()}
        assert fields == model, name
        assert tool_path(name) == f"/v1/tools/{name}"


def test_each_answer_of_the_real_plane_reads_as_the_server_model_reads_it(served: Served) -> None:
    seen = Recorded()
    with httpx.Client(base_url=f"http://127.0.0.1:{served.port}", timeout=30,
                      headers={"authorization": f"Bearer {served.tokens[0]}"}) as http:
        tools = ToolClient(_SyncRecording(http, seen))
        _check(_every_tool(_sync_call(tools)), seen)
        fence = tools.fence
        assert fence is not None
        # an older token for the same task is refused with the plane's typed error, its ids intact
        stale = ToolClient(_SyncRecording(http, seen), Fence(fence.task_id, fence.fencing_token - 1))
        with pytest.raises(StaleFencingTokenError) as refused:
            stale.heartbeat()
        assert refused.value.status == 409


def test_the_async_face_over_the_agents_lean_client(served: Served) -> None:
    seen = Recorded()
    lean = LeanClient(Connections(tcp_opener("127.0.0.1", served.port), "the plane"), host="plane",
                      headers={"Authorization": f"Bearer {served.tokens[1]}"}, timeout_s=30)
    tools = AsyncToolClient(_AsyncRecording(lean, seen))
    loop = asyncio.new_event_loop()
    try:
        _check(_every_tool(_async_call(tools, loop)), seen)
        loop.run_until_complete(lean.aclose())
    finally:
        loop.close()


def test_the_agents_reads_of_the_real_plane(served: Served) -> None:
    """What the built-in agent shows its model is the plane's answer as sent; what it reads of it (the posts it
    cites, the findings a lead reads, the score it keeps) is the server model's reading of the same answer."""
    seen = Recorded()
    lean = LeanClient(Connections(tcp_opener("127.0.0.1", served.port), "the plane"), host="plane",
                      headers={"Authorization": f"Bearer {served.tokens[2]}"}, timeout_s=30)
    tools = PlaneTools(_AsyncRecording(lean, seen))
    calls = {"board_post": board_post_call("halfway there", PostKind.PROGRESS), "board_read": board_read_call(limit=20),
             "submit_artifact": submit_artifact_call(b"score=5 an attempt", "text/plain"),
             "read_findings": read_findings_call(limit=200)}
    loop = asyncio.new_event_loop()
    try:
        claimed = loop.run_until_complete(tools.claim())
        assert claimed is not None
        for name, call in calls.items():
            data, read = loop.run_until_complete(tools.answer(call))
            assert data == json.loads(seen.raw[name]), name
            assert type(read) is r.RESULTS[name], name
            assert _as_json(read) == RESPONSES[name].model_validate_json(seen.raw[name]).model_dump(mode="json"), name
        loop.run_until_complete(lean.aclose())
    finally:
        loop.close()
    # the score the agent keeps is the one the plane recorded for its artifact
    scored = r.parse(r.ArtifactResult, json.loads(seen.raw["submit_artifact"])).scored
    goal = served.store.get_task(claimed.task_id).goal_id
    assert [s.score for s in served.store.list_scores(goal) if s.task_id == claimed.task_id] == [scored] == [5]
