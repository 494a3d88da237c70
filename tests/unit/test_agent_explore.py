"""The ``explore`` policy in the built-in agent: post a direction, read peers', switch, adopt only when better.

The plane is the real one over a Unix socket (the ``live_plane`` fixture), with an evaluator stand-in that
scores artifacts from a table; the model is the scripted ``ChatModel`` of the agent's unit tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import LivePlane
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending
from swarmyard.agents.explore import BoardView, direction_post, score_of, score_post
from swarmyard.agents.model import ModelReply
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.domain import GoalSpec, PostKind, TaskSpec


class ScriptedModel:
    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None) -> ModelReply:
        self.seen.append(messages)
        return ModelReply(self.replies.pop(0))


class TableScorer:
    """An evaluator stand-in (the real one is its own process with hidden data): scores an artifact by its text."""

    def __init__(self, scores: dict[str, int]) -> None:
        self.scores = scores

    async def score(self, goal: str, data: bytes, split: str) -> dict[str, Any]:
        return {"goal": goal, "split": split, "score": self.scores[data.decode()], "signature": b"sig"}


@dataclass
class Board:
    """A goal on a live plane with peers' posts already on its board, and the explorer's token."""

    plane: LivePlane
    goal_id: str
    token: str
    me: str

    def mine(self) -> list[str]:
        return [p.body for p in self.plane.store.read_board(self.goal_id) if p.author == self.me]


def _board(live_plane: Callable[..., LivePlane], posts: list[tuple[str, str]],
           scores: dict[str, int] | None) -> Board:
    plane = live_plane(TableScorer(scores) if scores is not None else None)
    store = plane.store
    goal = store.create_goal(GoalSpec(objective="o", budget_micro_usd=1_000_000, call_cap=100))
    fences: dict[str, tuple[str, int]] = {}
    for author, body in posts:
        if author not in fences:
            task = store.create_task(goal.id, TaskSpec(title=f"{author}'s slot"))
            claim = store.claim(goal.id, author, 600, task_id=task.id)
            assert claim is not None
            fences[author] = (task.id, claim.token)
        store.post(*fences[author], PostKind.DIRECTION, body, author=author)
    store.create_task(goal.id, TaskSpec(title="slot 1", prompt="p"))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    return Board(plane, goal.id, token, me.worker_id)


def _attempt(text: str) -> str:
    return json.dumps({"action": {"tool": "submit_artifact", "args": {"content": text}}})


FINISH = json.dumps({"action": {"tool": "submit_finding", "args": {"title": "t", "body": "b"}}})


def _run(tmp_path: Path, board: Board, replies: list[str], **settings: Any) -> BuiltinAgent:
    agent = BuiltinAgent(
        ScriptedModel(replies), PlaneTools(board.plane.client(board.token)), LocalTools(tmp_path, exec_timeout_s=5),
        AgentSettings(plane_url="http://plane", token=board.token, model="m", workdir=tmp_path, max_steps=10,
                      policy="explore", **settings),
    )
    outcome = asyncio.run(agent.run())
    assert outcome.ending is Ending.SUBMITTED
    return agent


def test_board_view_and_score_parsing() -> None:
    view = BoardView.read([{"author": "a", "body": direction_post("x")}, {"author": "a", "body": direction_post("y")},
                           {"author": "b", "body": score_post(5, "y")}, {"author": "b", "body": score_post(3, "y")}])
    assert view.held == {"a": "y"} and view.best == {"y": 5}
    assert score_of({"score": {"score": 7}}) == 7 and score_of({"score": None}) is None


def test_takes_a_free_direction_and_switches_after_k_attempts_without_improvement(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    board = _board(live_plane, [("wrk_peer", direction_post("greedy"))],
                   {"a1": 10, "a2": 10, "a3": 9, "a4": 9, "b1": 12})
    replies = [_attempt("a1"), _attempt("a2"), _attempt("a3"), _attempt("a4"), _attempt("b1"), FINISH]
    agent = _run(tmp_path, board, replies, directions=("greedy", "beam", "random"), patience=3)
    # "greedy" is held by a peer, so the worker took "beam"; a2, a3, a4 did not beat 10: three stale attempts
    assert board.mine() == [
        direction_post("beam"), score_post(10, "beam"), score_post(10, "beam"), score_post(9, "beam"),
        score_post(9, "beam"), direction_post("random"), score_post(12, "random"),
    ]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "random"


def test_adopts_a_peer_direction_only_when_clearly_better(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    peers = [("wrk_p1", direction_post("greedy")), ("wrk_p1", score_post(55, "greedy")),
             ("wrk_p2", direction_post("random")), ("wrk_p2", score_post(75, "random"))]
    board = _board(live_plane, peers, {"a1": 50, "a2": 60})
    agent = _run(tmp_path, board, [_attempt("a1"), _attempt("a2"), FINISH],
                 directions=("greedy", "beam", "random"), adopt_margin=10)
    # after 50: random (75) is 25 better -> adopt; greedy (55) alone would not have been clearly better
    assert board.mine()[:3] == [direction_post("beam"), score_post(50, "beam"), direction_post("random")]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "random"


def test_no_evaluator_means_unscored_attempts_that_still_count(tmp_path: Path,
                                                              live_plane: Callable[..., LivePlane]) -> None:
    board = _board(live_plane, [], None)
    agent = _run(tmp_path, board, [_attempt("a")] * 3 + [FINISH], directions=("one", "two"), patience=3)
    assert board.mine() == [direction_post("one"), direction_post("two")]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "two"
