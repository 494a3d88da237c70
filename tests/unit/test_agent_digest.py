"""A digest lead (``[lead] synthesis = "digest"``) writes the synthesis in parts: per finding a verdict on the
objective's question (an enum: yes, no or unclear) and one sentence of its own, then the answer, whose decision is
the verdicts' tally (the model only gives its reason, refused where it says the opposite), composed into one
finding that cites each.

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
from rigs.chat import ScriptedChat
from swarmyard.agents import verdicts
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
REASON = "Paying demand is there for clinicians, and a fast launch beats the platforms' free feature."




def _verdict(said: str) -> ModelReply:
    """A verdict as a tool call, as the broker hands back a schema-constrained answer."""
    return ModelReply("", (("submit_finding", json.dumps({"verdict": said})),))


YES, NO = _verdict("yes"), _verdict("no")


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


def _run(tmp_path: Path, plane: LivePlane, token: str, replies: list[str | ModelReply | Exception],
         max_steps: int = 4) -> tuple[Any, ScriptedChat]:
    model = ScriptedChat(replies)
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path,
                                       max_steps=max_steps, role=Role.LEAD, synthesis="digest"))
    return asyncio.run(agent.run()), model


def test_a_digest_reads_one_finding_a_call_and_answers_from_the_verdicts(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, risks) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    outcome, model = _run(tmp_path, plane, token, [YES, POINT_1, YES, POINT_2, REASON])
    assert outcome.ending is Ending.SUBMITTED and outcome.steps == 3
    # a verdict is asked with submit_finding narrowed to the enum, every other part as plain text
    assert model.only == [frozenset({"submit_finding"}), frozenset()] * 2 + [frozenset()]
    verdict_spec = model.specs[0]["submit_finding"]  # type: ignore[index]
    assert verdict_spec.parameters["properties"]["verdict"]["enum"] == ["yes", "no", "unclear"]
    finding = plane.store.get_finding(outcome.finding_id)
    assert finding.body.startswith(f"Yes: all 2 findings say yes [{market}] [{risks}]. {REASON}")
    assert f"- Yes: {POINT_1} [{market}]" in finding.body and f"- Yes: {POINT_2} [{risks}]" in finding.body
    assert verdicts.check(finding.body) is None  # the opening is the one the stored points' verdicts make
    assert {c.ref for c in finding.citations if c.kind == "finding"} == {market, risks}
    first, point, second, _, last = (str(call[-1]["content"]) for call in model.seen)
    assert "own words" in point
    assert MARKET in first and RISKS not in first  # one finding at a time
    assert model.seen[1][:2] == model.seen[0][:2]  # the point follows the verdict in the same conversation
    assert RISKS in second and MARKET not in second
    assert POINT_1 in last and POINT_2 in last and MARKET not in last and RISKS not in last  # its own points only
    assert "answer: yes" in last


def test_scripted_verdicts_make_the_answer(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, risks) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    outcome, _ = _run(tmp_path, plane, token, [YES, POINT_1, NO, POINT_2, REASON])
    body = plane.store.get_finding(outcome.finding_id).body
    assert body.startswith(f"Mixed: 1 of 2 findings says yes [{market}]; 1 of 2 findings says no [{risks}]. ")
    assert f"- No: {POINT_2} [{risks}]" in body and verdicts.check(body) is None


def test_a_reason_that_contradicts_the_tally_is_refused_then_left_out(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, risks) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    against = "We should not build it: nobody would pay for offline dictation."
    outcome, model = _run(tmp_path, plane, token, [YES, POINT_1, YES, POINT_2, against, against, against])
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 3
    body = plane.store.get_finding(outcome.finding_id).body
    assert body.startswith(f"Yes: all 2 findings say yes [{market}] [{risks}].\n\nFrom the findings:")
    assert against not in body and verdicts.check(body) is None
    assert "opposite of the findings' answer (yes)" in str(model.seen[-1][-1]["content"])  # the re-ask says why


def test_a_reason_that_agrees_after_a_reask_is_kept(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market,) = _lead(live_plane, [("market", MARKET)])
    outcome, _ = _run(tmp_path, plane, token, [NO, POINT_1, "Yes, the market is there.", REASON])
    body = plane.store.get_finding(outcome.finding_id).body
    assert body.startswith(f"No: the one finding says no [{market}]. {REASON}")
    assert outcome.malformed == 1


def test_a_verdict_the_schema_does_not_allow_counts_as_unclear(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market,) = _lead(live_plane, [("market", MARKET)])
    outcome, _ = _run(tmp_path, plane, token, [_verdict("maybe"), POINT_1, REASON])
    assert outcome.malformed == 1
    body = plane.store.get_finding(outcome.finding_id).body
    assert body.startswith(f"Unclear: the one finding is unclear [{market}].")
    assert f"- Unclear: {POINT_1} [{market}]" in body and verdicts.check(body) is None


def test_the_check_refuses_an_opening_the_verdicts_do_not_make() -> None:
    body = "Yes: all 2 findings say yes [fnd_aaaaaaaa] [fnd_bbbbbbbb].\n\nFrom the findings:\n" \
           "- Yes: One. [fnd_aaaaaaaa]\n- No: Two. [fnd_bbbbbbbb]"
    assert "Mixed: 1 of 2" in str(verdicts.check(body))
    assert verdicts.check("We should not do it.") is not None
    assert verdicts.contradicts("We should not keep the key safe.", "yes")
    assert verdicts.contradicts("Yes, it is safe.", "no") and verdicts.contradicts("No.", "mixed")
    assert not verdicts.contradicts("The key never reaches an agent, so it is not exposed.", "yes")
    # one finding of three saying yes and two unclear is no yes (the demo's lead once opened so)
    tally = verdicts.Tally((("fnd_a", "unclear"), ("fnd_b", "unclear"), ("fnd_c", "yes")))
    assert verdicts.answer_sentence(tally) == ("Unclear: 1 of 3 findings says yes [fnd_c]; 2 of 3 findings are "
                                               "unclear [fnd_a] [fnd_b].")
    assert verdicts.Tally((("fnd_a", "no"), ("fnd_b", "no"), ("fnd_c", "unclear"))).overall == "no"


def test_a_point_that_copies_its_finding_is_asked_again(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market,) = _lead(live_plane, [("market", MARKET)])
    outcome, model = _run(tmp_path, plane, token, [YES, MARKET, POINT_1, REASON])
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 1
    body = plane.store.get_finding(outcome.finding_id).body
    assert MARKET not in body and f"- Yes: {POINT_1} [{market}]" in body
    assert "your own words" in str(model.seen[2][-1]["content"])  # the re-ask says why


def test_a_finding_whose_point_is_refused_keeps_its_verdict_and_is_named(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    # the demo's lead once copied one scout's finding at every ask: that finding vanished from the answer, which
    # then counted 2 of 3 findings; now its verdict counts and its id is named, with no words of the lead's
    plane, token, (market, risks) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    copies = [MARKET] * 3  # the first ask and both re-asks copy the finding
    outcome, model = _run(tmp_path, plane, token, [YES, *copies, YES, POINT_2, REASON])
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 3
    body = plane.store.get_finding(outcome.finding_id).body
    assert body.startswith(f"Yes: all 2 findings say yes [{market}] [{risks}]. {REASON}")
    assert MARKET not in body and "- Yes: (no sentence of the lead's own" in body
    assert verdicts.check(body) is None
    assert {c.ref for c in plane.store.get_finding(outcome.finding_id).citations if c.kind == "finding"} == {
        market, risks}
    assert "1. market (yes)\n2. risks (yes): " + POINT_2 in str(model.seen[-1][-1]["content"])


def test_the_step_cap_bounds_the_points(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, _) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    # a model that answers with a submission all the same: its body is the part
    outcome, model = _run(tmp_path, plane, token, [YES, _say(POINT_1), REASON], max_steps=2)
    assert outcome.ending is Ending.SUBMITTED and len(model.seen) == 3
    body = plane.store.get_finding(outcome.finding_id).body
    assert body == f"Yes: the one finding says yes [{market}]. {REASON}\n\nFrom the findings:\n- Yes: {POINT_1} [{market}]"


def test_a_model_error_keeps_the_points_already_written(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market, _) = _lead(live_plane, [("market", MARKET), ("risks", RISKS)])
    outcome, _ = _run(tmp_path, plane, token, [YES, POINT_1, ProviderError("upstream answered 500")])
    assert outcome.ending is Ending.MODEL_ERROR
    body = plane.store.get_finding(outcome.finding_id).body
    assert f"- Yes: {POINT_1} [{market}]" in body and "cut short by a model error" in body
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


def test_a_point_in_json_is_asked_again_as_a_sentence(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, (market,) = _lead(live_plane, [("market", MARKET)])
    outcome, model = _run(tmp_path, plane, token, [YES, '{"verdict": "yes"}', POINT_1, REASON])
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 1
    assert model.seen[1][2] == {"role": "assistant", "content": "My verdict: yes."}  # its verdict, said in words
    body = plane.store.get_finding(outcome.finding_id).body
    assert f"- Yes: {POINT_1} [{market}]" in body and '{"verdict"' not in body
