"""The ``explore`` policy in the built-in agent: its direction is claimed in the store through the tools, and the
moves the plane answers a scored attempt with (switch after K without a better score, adopt a clearly better free
direction) reach the model and the board.

The plane is the real one over a Unix socket (the ``live_plane`` fixture), with an evaluator stand-in that
scores artifacts from a table; the model is a scripted ``ChatModel``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conftest import LivePlane
from rigs.chat import ScriptedChat, TableScorer
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending
from swarmyard.agents.explore import direction_post
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.domain import GoalSpec, TaskSpec


@dataclass
class Goal:
    plane: LivePlane
    goal_id: str
    token: str
    me: str

    def mine(self) -> list[str]:
        return [p.body for p in self.plane.store.read_board(self.goal_id) if p.author == self.me]

    def holders(self) -> dict[str, str | None]:
        return {d.name: d.holder for d in self.plane.store.list_directions(self.goal_id)}


def _goal(live_plane: Callable[..., LivePlane], directions: Sequence[str], scores: dict[str, int], *,
          peers: Sequence[tuple[str, str, int | None, bool]] = (), patience: int = 3, margin: int = 10) -> Goal:
    """``peers``: (worker, direction it holds, a score it reached there or None, whether its slot is done)."""
    plane = live_plane(TableScorer(scores))
    store = plane.store
    goal = store.create_goal(GoalSpec(objective="o", budget_micro_usd=1_000_000, call_cap=100, policy="explore"))
    store.offer_directions(goal.id, "main", directions, patience=patience, adopt_margin=margin)
    for worker, direction, score, done in peers:
        task = store.create_task(goal.id, TaskSpec(title=f"{worker}'s slot"))
        claim = store.claim(goal.id, worker, 600, task_id=task.id)
        assert claim is not None
        assert store.claim_direction(task.id, claim.token, [direction], author=worker) is not None
        if score is not None:
            art = store.put_artifact(task.id, claim.token, f"{worker} {score}".encode(), author=worker)
            store.record_score(goal.id, art.sha256, score)
        if done:
            store.complete(task.id, claim.token)
    store.create_task(goal.id, TaskSpec(title="slot 1", prompt="p"))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    return Goal(plane, goal.id, token, me.worker_id)


def _attempt(text: str) -> str:
    return json.dumps({"action": {"tool": "submit_artifact", "args": {"content": text}}})


FINISH = json.dumps({"action": {"tool": "submit_finding", "args": {"title": "t", "body": "what was found"}}})


def _run(tmp_path: Path, goal: Goal, replies: list[str]) -> tuple[BuiltinAgent, ScriptedChat]:
    model = ScriptedChat(replies)
    agent = BuiltinAgent(
        model, PlaneTools(goal.plane.client(goal.token)), LocalTools(tmp_path, exec_timeout_s=5),
        AgentSettings(plane_url="http://plane", token=goal.token, model="m", workdir=tmp_path, max_steps=10,
                      policy="explore"),
    )
    outcome = asyncio.run(agent.run())
    assert outcome.ending is Ending.SUBMITTED
    return agent, model


def _told(model: ScriptedChat) -> str:
    return "\n".join(str(m.get("content")) for m in model.seen[-1])


def test_takes_a_free_direction_and_switches_after_k_attempts_without_improvement(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    goal = _goal(live_plane, ("greedy", "beam", "random"), {"a1": 10, "a2": 10, "a3": 9, "a4": 9, "b1": 12},
                 peers=[("wrk_peer", "greedy", None, False)])
    agent, model = _run(tmp_path, goal, [_attempt(a) for a in ("a1", "a2", "a3", "a4", "b1")] + [FINISH])
    # greedy is a live peer's, so the worker took beam; a2, a3, a4 did not beat 10: the third moves it to random
    assert goal.mine() == [direction_post("beam"), direction_post("random")]
    assert goal.holders() == {"greedy": "wrk_peer", "beam": None, "random": goal.me}
    assert agent.explorer is not None and agent.explorer.direction == "random"
    assert "Your direction: beam" in str(model.seen[0][1]["content"])
    assert "Change of direction: work on 'random' from now on (was 'beam')" in _told(model)


def test_adopts_a_free_direction_only_when_clearly_better(tmp_path: Path,
                                                          live_plane: Callable[..., LivePlane]) -> None:
    goal = _goal(live_plane, ("beam", "greedy", "random"), {"a1": 50, "a2": 60},
                 peers=[("wrk_p1", "greedy", 55, True), ("wrk_p2", "random", 75, True)], margin=10)
    agent, model = _run(tmp_path, goal, [_attempt("a1"), _attempt("a2"), FINISH])
    # after 50: random (75) is 25 better -> adopt; greedy (55) alone would not have been clearly better
    assert goal.mine()[:2] == [direction_post("beam"), direction_post("random")]
    assert agent.explorer is not None and agent.explorer.direction == "random"
    assert "a free direction scored clearly better" in _told(model)
    assert goal.plane.store.best_scores(goal.goal_id, by="direction") == {"greedy": 55, "random": 75, "beam": 50}


def test_a_worker_with_every_direction_held_holds_none(tmp_path: Path,
                                                       live_plane: Callable[..., LivePlane]) -> None:
    goal = _goal(live_plane, ("one", "two"), {"x": 1},
                 peers=[("wrk_a", "one", None, False), ("wrk_b", "two", None, False)])
    agent, model = _run(tmp_path, goal, [_attempt("x"), FINISH])
    assert goal.mine() == [] and goal.holders() == {"one": "wrk_a", "two": "wrk_b"}
    assert agent.explorer is not None and agent.explorer.direction is None
    assert "Every direction is held by a live peer" in str(model.seen[0][1]["content"])


def test_without_offered_directions_the_task_title_is_claimed(tmp_path: Path,
                                                              live_plane: Callable[..., LivePlane]) -> None:
    goal = _goal(live_plane, (), {"x": 1})
    agent, _ = _run(tmp_path, goal, [_attempt("x"), FINISH])
    assert goal.holders() == {"slot 1": goal.me}  # held as long as its claim (the coordinator completes it)
    assert goal.mine() == [direction_post("slot 1")]
    assert agent.explorer is not None and agent.explorer.direction == "slot 1"
