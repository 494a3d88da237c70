"""The explore policy through the worker tools (real HTTP on a Unix socket, SQLite and PostgreSQL): directions are
claimed in the store, scored attempts move a worker (stay, switch after K without a better score, adopt a clearly
better free direction), and no move ever lands on a direction a live peer holds."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from test_plane_tools import Plane, start_plane

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.plane.mcp_server import tool_definitions

DIRECTIONS = ("proof", "disproof", "counterexample")


class _Scripted:
    """An evaluator stand-in: an artifact ``score=N ...`` scores N (the real evaluator is another process)."""

    async def score(self, goal: str, data: bytes, split: str) -> dict[str, Any]:
        found = re.match(rb"score=(-?\d+)", data)
        return {"goal": goal, "artifact_sha256": hashlib.sha256(data).hexdigest(), "split": split,
                "score": int(found[1]) if found else 0, "signature": "sig"}


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock, evaluator=_Scripted())


class Worker:
    def __init__(self, plane: Plane, goal: str) -> None:
        self.plane = plane
        self.token, self.who = plane.tokens.issue(goal, "explore", ttl_s=3600)
        claimed = plane.ok("claim_task", self.token)
        self.fence = {"task_id": claimed["task"]["id"], "fencing_token": claimed["fencing_token"]}
        self.n = 0

    def take(self, name: str | None = None) -> str | None:
        body = {} if name is None else {"direction": name}
        got = self.plane.ok("claim_direction", self.token, **self.fence, **body)["direction"]
        return None if got is None else str(got["name"])

    def attempt(self, score: int) -> dict[str, Any]:
        self.n += 1
        data = base64.b64encode(f"score={score} attempt {self.n} of {self.who.worker_id}".encode()).decode()
        result = self.plane.ok("submit_artifact", self.token, **self.fence, data_base64=data, media_type="text/plain")
        assert result["score"]["score"] == score
        move: dict[str, Any] = result["direction"]
        return move


def _goal(plane: Plane, slots: int, *, patience: int = 3, margin: int = 10) -> str:
    goal = plane.store.create_goal(GoalSpec("prove or disprove it", 1_000_000, 100, policy="explore")).id
    plane.store.offer_directions(goal, "explore", DIRECTIONS, patience=patience, adopt_margin=margin)
    for i in range(slots):
        plane.store.create_task(goal, TaskSpec(f"slot {i}", group="explore"))
    return goal


def _holders(plane: Plane, worker: Worker) -> dict[str, str | None]:
    found = plane.ok("read_directions", worker.token, **worker.fence)["directions"]
    return {d["name"]: d["holder"] for d in found}


def test_a_worker_switches_after_k_attempts_without_a_better_score(plane: Plane) -> None:
    goal = _goal(plane, 2)
    a, b = Worker(plane, goal), Worker(plane, goal)
    assert a.take() == "proof"
    assert b.take() == "disproof"  # the first free one: proof is a's
    assert b.take("proof") is None  # named, and held by a live peer
    moves = [a.attempt(s) for s in (500, 400, 450)]
    assert [(m["reason"], m["stale"]) for m in moves] == [("stay", 0), ("stay", 1), ("stay", 2)]
    assert all(m["direction"] == "proof" for m in moves)
    fourth = a.attempt(300)  # the third in a row without beating 500
    assert fourth["reason"] == "switch" and fourth["previous"] == "proof"
    assert fourth["direction"] == "counterexample", "disproof is b's: the free one, never a held one"
    assert _holders(plane, a) == {"proof": None, "disproof": b.who.worker_id, "counterexample": a.who.worker_id}
    # a better score resets the count: three more on counterexample, one of them better, do not move it
    assert [a.attempt(s)["reason"] for s in (100, 90, 120, 110)] == ["stay"] * 4
    assert plane.store.best_scores(goal, by="direction") == {"proof": 500, "counterexample": 120}


def test_patience_is_the_goals_setting(plane: Plane) -> None:
    goal = _goal(plane, 1, patience=1)
    a = Worker(plane, goal)
    assert a.take() == "proof"
    assert a.attempt(10)["reason"] == "stay"
    moved = a.attempt(10)
    assert (moved["reason"], moved["direction"], moved["patience"]) == ("switch", "disproof", 1)


def test_a_worker_adopts_a_free_direction_whose_score_is_clearly_better(plane: Plane) -> None:
    goal = _goal(plane, 3, margin=10)
    a, b, c = Worker(plane, goal), Worker(plane, goal), Worker(plane, goal)
    assert (a.take(), b.take(), c.take()) == ("proof", "disproof", "counterexample")
    assert a.attempt(900)["reason"] == "stay"
    # proof is better, but a still holds it: nobody is moved onto a live peer's direction
    assert b.attempt(100) == {"direction": "disproof", "previous": "disproof", "reason": "stay", "best": 100,
                              "stale": 0, "patience": 3}
    plane.store.complete(a.fence["task_id"], a.fence["fencing_token"])  # a's slot is done: proof is free
    assert c.attempt(895)["reason"] == "stay", "895 against 900 is not better by the margin of 10"
    adopted = b.attempt(100)
    assert (adopted["reason"], adopted["direction"], adopted["previous"]) == ("adopt", "proof", "disproof")
    assert _holders(plane, c) == {"proof": b.who.worker_id, "disproof": None, "counterexample": c.who.worker_id}
    after = b.attempt(950)  # on its new direction, counted afresh
    assert (after["direction"], after["best"], after["stale"]) == ("proof", 950, 0)


def test_outside_explore_an_attempt_moves_nobody(plane: Plane) -> None:
    goal = plane.store.create_goal(GoalSpec("g", 1_000_000, 100)).id
    plane.store.create_task(goal, TaskSpec("t", group="explore"))
    a = Worker(plane, goal)
    data = base64.b64encode(b"score=5").decode()
    result = plane.ok("submit_artifact", a.token, **a.fence, data_base64=data)
    assert result["direction"] is None and result["score"]["score"] == 5
    assert plane.store.best_scores(goal, by="worker") == {a.who.worker_id: 5}


def test_the_mcp_server_offers_the_direction_tools() -> None:
    names = {t.name for t in tool_definitions()}
    assert {"claim_direction", "read_directions"} <= names


def test_eight_workers_claiming_at_once_through_the_tools_get_three_distinct_directions(plane: Plane) -> None:
    goal = _goal(plane, 8)
    workers = [Worker(plane, goal) for _ in range(8)]
    gate = threading.Barrier(len(workers))

    def take(worker: Worker) -> str | None:
        gate.wait()
        return worker.take()

    with ThreadPoolExecutor(len(workers)) as pool:
        got = list(pool.map(take, workers))
    assert sorted(name for name in got if name) == sorted(DIRECTIONS), got
    holders = _holders(plane, workers[0])
    assert {name: holders[name] for name in DIRECTIONS} == {
        name: w.who.worker_id for w, name in zip(workers, got, strict=True) if name}


def test_an_mcp_agent_takes_a_direction_and_is_moved_by_its_scores(plane: Plane) -> None:
    """``swarmyard mcp`` as a real subprocess driven by the MCP SDK's stdio client, relaying to the plane."""
    goal = _goal(plane, 2, patience=1)
    peer = Worker(plane, goal)
    assert peer.take() == "proof"
    token, who = plane.tokens.issue(goal, "explore", ttl_s=3600)
    here = Path(sys.executable).parent / "swarmyard"
    exe = str(here) if here.exists() else shutil.which("swarmyard") or str(here)
    params = StdioServerParameters(command=exe, args=["mcp"],
                                   env={"SWARMYARD_TOKEN": token, "SWARMYARD_PLANE_SOCKET": plane.socket})

    async def session() -> list[Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            out = []
            for name, args in [("claim_task", {}), ("claim_direction", {}),
                               ("submit_artifact", {"data_base64": base64.b64encode(b"score=7 a").decode()}),
                               ("submit_artifact", {"data_base64": base64.b64encode(b"score=6 b").decode()}),
                               ("read_directions", {})]:
                result = await client.call_tool(name, args)
                assert not result.is_error, result.content
                out.append(json.loads(result.content[0].text))  # type: ignore[union-attr]
            return out

    _, taken, first, second, listed = anyio.run(session)
    assert taken["direction"]["name"] == "disproof"  # proof is the peer's
    assert first["direction"]["reason"] == "stay"
    assert (second["direction"]["reason"], second["direction"]["direction"]) == ("switch", "counterexample")
    assert {d["name"]: d["holder"] for d in listed["directions"]} == {
        "proof": peer.who.worker_id, "disproof": None, "counterexample": who.worker_id}
