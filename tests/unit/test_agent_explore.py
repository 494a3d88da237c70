"""The ``explore`` policy in the built-in agent: post a direction, read peers', switch, adopt only when better.

The plane is an in-memory board behind ``httpx.MockTransport`` that scores artifacts from a table (standing in
for the evaluator); the model is the scripted ``ChatModel`` of the agent's unit tests.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx

from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending
from swarmyard.agents.explore import BoardView, direction_post, score_of, score_post
from swarmyard.agents.model import ModelReply
from swarmyard.agents.tools import LocalTools, PlaneTools


class ScriptedModel:
    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None) -> ModelReply:
        self.seen.append(messages)
        return ModelReply(self.replies.pop(0))


class Board:
    """The plane's board and an artifact scorer keyed by the artifact's text."""

    def __init__(self, posts: list[tuple[str, str]], scores: dict[str, int | None]) -> None:
        self.posts = [{"seq": i + 1, "author": a, "body": b} for i, (a, b) in enumerate(posts)]
        self.scores = scores

    def handler(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        body = json.loads(request.content or b"{}")
        if name == "claim_task":
            return httpx.Response(200, json={"task": {"id": "task_1", "title": "slot 1", "prompt": "p",
                                                      "group": "explore"}, "fencing_token": 3})
        if name == "board_read":
            return httpx.Response(200, json={"posts": self.posts})
        if name == "board_post":
            post = {"seq": len(self.posts) + 1, "author": "wrk_me", "body": body["body"], "kind": body["kind"]}
            self.posts.append(post)
            return httpx.Response(200, json={"post": post})
        if name == "submit_artifact":
            score = self.scores[base64.b64decode(body["data_base64"]).decode()]
            return httpx.Response(200, json={"artifact": {"sha256": "00"},
                                             "score": None if score is None else {"score": score}})
        return httpx.Response(200, json={"finding": {"id": "fnd_1"}})

    def mine(self) -> list[str]:
        return [str(p["body"]) for p in self.posts if p["author"] == "wrk_me"]


def _attempt(text: str) -> str:
    return json.dumps({"action": {"tool": "submit_artifact", "args": {"content": text}}})


FINISH = json.dumps({"action": {"tool": "submit_finding", "args": {"title": "t", "body": "b"}}})


def _run(tmp_path: Path, board: Board, replies: list[str], **settings: Any) -> BuiltinAgent:
    client = httpx.AsyncClient(base_url="http://plane", transport=httpx.MockTransport(board.handler))
    agent = BuiltinAgent(
        ScriptedModel(replies), PlaneTools(client), LocalTools(tmp_path, exec_timeout_s=5),
        AgentSettings(plane_url="http://plane", token="t", model="m", workdir=tmp_path, max_steps=10,
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


def test_takes_a_free_direction_and_switches_after_k_attempts_without_improvement(tmp_path: Path) -> None:
    board = Board([("wrk_peer", direction_post("greedy"))], {"a1": 10, "a2": 10, "a3": 9, "a4": 9, "b1": 12})
    replies = [_attempt("a1"), _attempt("a2"), _attempt("a3"), _attempt("a4"), _attempt("b1"), FINISH]
    agent = _run(tmp_path, board, replies, directions=("greedy", "beam", "random"), patience=3)
    # "greedy" is held by a peer, so the worker took "beam"; a2, a3, a4 did not beat 10: three stale attempts
    assert board.mine() == [
        direction_post("beam"), score_post(10, "beam"), score_post(10, "beam"), score_post(9, "beam"),
        score_post(9, "beam"), direction_post("random"), score_post(12, "random"),
    ]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "random"


def test_adopts_a_peer_direction_only_when_clearly_better(tmp_path: Path) -> None:
    peers = [("wrk_p1", direction_post("greedy")), ("wrk_p1", score_post(55, "greedy")),
             ("wrk_p2", direction_post("random")), ("wrk_p2", score_post(75, "random"))]
    board = Board(peers, {"a1": 50, "a2": 60})
    agent = _run(tmp_path, board, [_attempt("a1"), _attempt("a2"), FINISH],
                 directions=("greedy", "beam", "random"), adopt_margin=10)
    # after 50: random (75) is 25 better -> adopt; greedy (55) alone would not have been clearly better
    assert board.mine()[:3] == [direction_post("beam"), score_post(50, "beam"), direction_post("random")]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "random"


def test_no_evaluator_means_unscored_attempts_that_still_count(tmp_path: Path) -> None:
    board = Board([], {"a": None})
    agent = _run(tmp_path, board, [_attempt("a")] * 3 + [FINISH], directions=("one", "two"), patience=3)
    assert board.mine() == [direction_post("one"), direction_post("two")]
    assert agent.explorer is not None and agent.explorer.tracker.direction == "two"
