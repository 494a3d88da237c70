"""``[workers] history``: a worker's context built from its group's prior scored attempts, and the simulated
provider's ``attempts`` behaviour that improves from them.

The plane is the real one over a Unix socket with an evaluator stand-in that scores from a table; the model is
a scripted ``ChatModel`` that records what it was shown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import LivePlane
from rigs.chat import ScriptedChat, TableScorer
from swarmyard.agents import history
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.broker.chat import ChatRequest, Message, Role, Tool
from swarmyard.broker.providers.attempts import attempt_answer, propose
from swarmyard.domain import GoalSpec, PostKind, TaskSpec
from swarmyard.errors import ConfigError


def _attempt(text: str) -> str:
    return json.dumps({"action": {"tool": "submit_artifact", "args": {"content": text}}})


FINISH = json.dumps({"action": {"tool": "submit_finding", "args": {"title": "t", "body": "the best one"}}})
SCORES = {"aaaa": 10, "bbbb": 30, "cccc": 20}


def _run(tmp_path: Path, live_plane: Callable[..., LivePlane], replies: list[str], *,
         peer_attempts: tuple[tuple[int, str], ...] = (), **settings: Any) -> tuple[ScriptedChat, LivePlane, str]:
    plane = live_plane(TableScorer({**SCORES, **{c: s for s, c in peer_attempts}}))
    store = plane.store
    goal = store.create_goal(GoalSpec(objective="o", budget_micro_usd=1_000_000, call_cap=100))
    if peer_attempts:
        peer = store.create_task(goal.id, TaskSpec(title="peer"))
        claim = store.claim(goal.id, "wrk_peer", 600, task_id=peer.id)
        assert claim is not None
        for score, content in peer_attempts:
            store.post(peer.id, claim.token, PostKind.PROGRESS, history.attempt_post(score, content), author="wrk_peer")
    store.create_task(goal.id, TaskSpec(title="guess", prompt="guess the code"))
    token, _ = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    model = ScriptedChat(replies)
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path,
                                       max_steps=10, **settings))
    outcome = asyncio.run(agent.run())
    assert outcome.ending is Ending.SUBMITTED
    return model, plane, goal.id


def test_scored_history_restarts_each_attempt_from_the_top_k(tmp_path: Path,
                                                              live_plane: Callable[..., LivePlane]) -> None:
    replies = [_attempt("aaaa"), _attempt("bbbb"), _attempt("cccc"), FINISH]
    model, plane, goal = _run(tmp_path, live_plane, replies, history="scored_history", history_top_k=2)
    assert history.HISTORY_HEAD not in model.seen[0][1]["content"]  # nothing scored yet
    after_one = model.seen[1]
    assert len(after_one) == 2 and "[score 10] aaaa" in after_one[1]["content"]
    last = model.seen[3][1]["content"]
    assert len(model.seen[3]) == 2  # the earlier turns are gone: the context is the brief and the block
    assert last.index("[score 30] bbbb") < last.index("[score 20] cccc")
    assert "aaaa" not in last  # the top 2 only
    posts = [p.body for p in plane.store.read_board(goal)]
    assert posts == [history.attempt_post(10, "aaaa"), history.attempt_post(30, "bbbb"),
                     history.attempt_post(20, "cccc")]


def test_single_draft_refinement_keeps_only_the_best(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    replies = [_attempt("aaaa"), _attempt("bbbb"), _attempt("cccc"), FINISH]
    model, _, _ = _run(tmp_path, live_plane, replies, history="single_draft_refinement", history_top_k=3)
    last = model.seen[3][1]["content"]
    assert history.DRAFT_HEAD in last and "[score 30] bbbb" in last
    assert "cccc" not in last and "aaaa" not in last


def test_a_peers_scored_attempts_on_the_board_start_the_history(tmp_path: Path,
                                                                 live_plane: Callable[..., LivePlane]) -> None:
    model, _, _ = _run(tmp_path, live_plane, [FINISH], peer_attempts=((70, "peer-best"), (5, "peer-worst")),
                       history="scored_history", history_top_k=1)
    first = model.seen[0][1]["content"]
    assert "[score 70] peer-best" in first and "peer-worst" not in first


def test_without_history_the_conversation_grows_as_before(tmp_path: Path,
                                                          live_plane: Callable[..., LivePlane]) -> None:
    model, plane, goal = _run(tmp_path, live_plane, [_attempt("aaaa"), _attempt("bbbb"), FINISH])
    assert len(model.seen[2]) == 6  # system, brief, and two turns of each attempt
    assert not any(p.body.startswith("attempt score") for p in plane.store.read_board(goal))


def test_a_bad_history_setting_is_refused() -> None:
    env = {"SWARMYARD_PLANE_URL": "http://p", "SWARMYARD_TOKEN": "t"}
    assert AgentSettings.from_env({**env, "SWARMYARD_HISTORY": "none"}).history == ""
    assert AgentSettings.from_env({**env, "SWARMYARD_HISTORY": "scored_history"}).history == "scored_history"
    with pytest.raises(ConfigError, match="SWARMYARD_HISTORY"):
        AgentSettings.from_env({**env, "SWARMYARD_HISTORY": "everything"})


def test_context_block_and_posts_round_trip() -> None:
    posts = [{"body": history.attempt_post(s, c)} for s, c in ((3, "x"), (9, "y"), (9, "y"), (5, "z"))]
    posts.append({"body": "a note that is no attempt"})
    attempts = history.attempts_on(p["body"] for p in posts)
    assert [a.score for a in attempts] == [3, 9, 9, 5]
    assert history.context_block("scored_history", attempts, 2).splitlines() == [
        f"4 attempts have been scored. {history.HISTORY_HEAD}", "[score 9] y", "[score 5] z"]
    assert history.context_block("single_draft_refinement", attempts, 2).splitlines()[1:] == ["[score 9] y"]
    assert history.context_block("scored_history", [], 2) == ""


def _request(text: str, tools: tuple[str, ...] = ("submit_artifact", "submit_finding")) -> ChatRequest:
    return ChatRequest("sim", (Message(Role.USER, text),), tuple(Tool(t, "", {}) for t in tools))


def test_the_simulated_attempt_maker_is_seeded_by_its_conversation() -> None:
    brief = "Find the hidden 8-digit code of instance 4."
    first = json.loads(attempt_answer(_request(brief)))["action"]
    assert first["tool"] == "submit_artifact"
    content = first["args"]["content"]
    assert content.startswith("instance 4 code ") and len(content.split()[-1]) == 8
    assert attempt_answer(_request(brief)) == attempt_answer(_request(brief))
    assert attempt_answer(_request(brief), seed=1) != attempt_answer(_request(brief), seed=2)


def test_the_simulated_attempt_maker_refines_what_it_is_shown() -> None:
    import random

    # a single draft: one or two digits change
    draft = propose([(500, "12345678")], 8, random.Random(1))
    assert 1 <= sum(a != b for a, b in zip(draft, "12345678", strict=True)) <= 2
    # a history: every digit but one comes from one of the attempts shown
    mixed = propose([(900, "11111111"), (100, "22222222")], 8, random.Random(1))
    assert sum(d not in "12" for d in mixed) <= 1
    # offered no submit_artifact, it reports the best it was shown
    text = "[score 250000] instance 4 code 11110000\n[score 750000] instance 4 code 11111100"
    finding = json.loads(attempt_answer(_request(text, ("submit_finding",))))["action"]
    body = finding["args"]["body"]
    assert finding["tool"] == "submit_finding" and "750000" in body and "code 11111100" in body


def test_simulate_is_a_setting_of_the_simulated_provider_only() -> None:
    from swarmyard.config import ProviderConfig, ProviderKind, loads_config

    assert ProviderConfig(kind=ProviderKind.SIMULATED, models=("sim",), simulate="attempts").simulate == "attempts"
    with pytest.raises(ValueError, match="simulate is for a simulated provider"):
        ProviderConfig(kind=ProviderKind.SCRIPTED, models=("sim",), simulate="attempts")
    with pytest.raises(ConfigError, match=r"workers\.history"):
        loads_config('[goal]\nobjective = "x"\nbudget_usd = "1"\n[tasks]\nplan = 1\n[workers]\nhistory = "all"\n')
