"""A digest lead (``[lead] synthesis = "digest"``) writes the synthesis in parts: one sentence of its own per
finding, then its answer from those sentences, composed into one finding that cites each.

Through the real plane over a Unix socket (``live_plane``) with a scripted ``ChatModel``, reading back what the
store holds and what the model was shown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from conftest import LivePlane
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending, Role
from swarmyard.agents.model import BrokerChatModel, ModelReply
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.config import LeadConfig
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.errors import ConfigError, ProviderError
from swarmyard.swarm.setup import LEAD_GROUP, lead_prompt

MARKET = ("Demand is real: 5M people in Europe dictate notes daily, and the two incumbents ignore offline use. "
          "Clinicians are the buyers who pay first.")
RISKS = ("The platforms may ship offline dictation for free within a year; the early warning sign is a beta of it "
         "in a developer release.")
POINT_1 = "Buyers exist and pay, which favours building, though the count is rough."
POINT_2 = "A free platform feature could erase the market, so speed matters more than polish."
ANSWER = "Go, for clinicians first: paying demand is there, and a fast launch beats the platforms' free feature."


class ScriptedModel:
    def __init__(self, replies: list[str | Exception]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []
        self.only: list[frozenset[str] | None] = []

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None) -> ModelReply:
        self.seen.append([dict(m) for m in messages])
        self.only.append(only)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return ModelReply(reply)


def _say(body: str) -> str:
    return json.dumps({"action": {"tool": "submit_finding", "args": {"title": "t", "body": body}}})


def _lead(live_plane: Callable[..., LivePlane], bodies: list[tuple[str, str]]) -> tuple[LivePlane, str, list[str]]:
    """Scouts' findings in their group and the lead's task made as a run makes it."""
    plane = live_plane()
    store = plane.store
    goal = store.create_goal(GoalSpec("Should a small team build a speech app?", 1_000_000, 100))
    found = []
    for title, body in bodies:
        task = store.create_task(goal.id, TaskSpec(title, "look", group="team"))
        claim = store.claim(goal.id, f"wrk_{title}", 600, task_id=task.id)
        assert claim is not None
        found.append(store.submit_finding(task.id, claim.token, author=f"wrk_{title}", title=title, body=body))
        store.complete(task.id, claim.token)
    store.create_task(goal.id, TaskSpec("synthesis", lead_prompt(goal, "Write one recommendation.", found),
                                        group=LEAD_GROUP))
    token, _ = plane.tokens.issue(goal.id, LEAD_GROUP, ttl_s=3600)
    return plane, token, [f.id for f in found]


def _run(tmp_path: Path, plane: LivePlane, token: str, replies: list[str | Exception],
         max_steps: int = 4) -> tuple[Any, ScriptedModel]:
    model = ScriptedModel(replies)
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path,
                                       max_steps=max_steps, role=Role.LEAD, synthesis="digest"))
    return asyncio.run(agent.run()), model


def test_a_digest_reads_one_finding_a_call_and_composes_its_own_answer(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, risks) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    outcome, model = _run(tmp_path, plane, token, [POINT_1, POINT_2, ANSWER])
    assert outcome.ending is Ending.SUBMITTED and outcome.steps == 3
    assert model.only == [frozenset()] * 3  # every part asked as plain text: no tool offered
    finding = plane.store.get_finding(outcome.finding_id)
    assert finding.body.startswith(ANSWER)
    assert f"- {POINT_1} [{market}]" in finding.body and f"- {POINT_2} [{risks}]" in finding.body
    assert {c.ref for c in finding.citations if c.kind == "finding"} == {market, risks}
    first, second, last = (str(call[-1]["content"]) for call in model.seen)
    assert MARKET in first and RISKS not in first  # one finding a call
    assert RISKS in second and MARKET not in second
    assert POINT_1 in last and POINT_2 in last and MARKET not in last and RISKS not in last  # its own points only


def test_a_point_that_copies_its_finding_is_asked_again(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market,) = _lead(live_plane, [("market", MARKET)])
    outcome, model = _run(tmp_path, plane, token, [MARKET, POINT_1, ANSWER])
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 1
    body = plane.store.get_finding(outcome.finding_id).body
    assert MARKET not in body and f"- {POINT_1} [{market}]" in body
    assert "your own words" in str(model.seen[1][-1]["content"])  # the re-ask says why


def test_the_step_cap_bounds_the_points(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, _) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    # a model that answers with a submission all the same: its body is the part
    outcome, model = _run(tmp_path, plane, token, [_say(POINT_1), ANSWER], max_steps=2)
    assert outcome.ending is Ending.SUBMITTED and len(model.seen) == 2
    body = plane.store.get_finding(outcome.finding_id).body
    assert body == f"{ANSWER} [{market}]\n\nFrom the findings:\n- {POINT_1} [{market}]"


def test_a_model_error_keeps_the_points_already_written(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, _) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    outcome, _ = _run(tmp_path, plane, token, [POINT_1, ProviderError("upstream answered 500")])
    assert outcome.ending is Ending.MODEL_ERROR
    body = plane.store.get_finding(outcome.finding_id).body
    assert f"- {POINT_1} [{market}]" in body and "cut short by a model error" in body
    assert body.startswith("No overall answer was reached")


def test_a_model_error_before_any_point_raises(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, _ = _lead(live_plane, [("market", MARKET)])
    with pytest.raises(ProviderError):
        _run(tmp_path, plane, token, [ProviderError("upstream answered 500")])


def test_an_empty_only_asks_the_broker_for_plain_text() -> None:
    model = BrokerChatModel(httpx.AsyncClient(base_url="http://broker"), "m")
    plain = model._body([{"role": "user", "content": "hi"}], frozenset())
    assert "tools" not in plain and "tool_choice" not in plain and "response_format" not in plain
    assert model._body([{"role": "user", "content": "hi"}])["tool_choice"] == "required"


def test_the_setting_is_checked_where_it_is_read() -> None:
    with pytest.raises(ValidationError, match="max_steps >= 2"):
        LeadConfig(synthesis="digest", max_steps=1)
    with pytest.raises(ValidationError, match="built-in lead"):
        LeadConfig(synthesis="digest", agent="claude")
    with pytest.raises(ValidationError):
        LeadConfig(synthesis="summary")
    assert LeadConfig(synthesis="digest").synthesis.value == "digest"
    base = {"SWARMYARD_PLANE_URL": "http://plane", "SWARMYARD_TOKEN": "t"}
    assert AgentSettings.from_env(base).synthesis == "free"
    with pytest.raises(ConfigError, match="SWARMYARD_SYNTHESIS"):
        AgentSettings.from_env({**base, "SWARMYARD_SYNTHESIS": "all"})
