"""A finding must say something of its own: the built-in agent refuses, and asks its model again for, a body that
repeats itself, one that restates its task, and a lead's synthesis that copies a finding it read.

The measures are checked on the demo's own failures; the agent through the real plane over a Unix socket
(``live_plane``) with a scripted ``ChatModel``, reading back what the store holds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import LivePlane
from rigs.chat import ScriptedChat
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending, Role
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.rules.originality import copied_share, problem, repeated_share
from swarmyard.swarm.setup import LEAD_GROUP, lead_prompt

#: the demo's lead "synthesis": one scout's list, six lines over and over until the token limit
LOOP = "\n".join(f"{i}. {line}" for i, line in enumerate(
    ["Lack of technical expertise", "High development costs", "Limited market demand", "Privacy concerns",
     "Competition from big platforms", "Inadequate deployment infrastructure"] * 6, start=1))
SCOUT = ("Demand is real: 5M people in Europe dictate notes daily, and the two incumbents ignore offline use. "
         "A small team could ship an offline dictation app for clinicians within six months.")
PROMPT = "Objective: Should a small team build a speech app?\n\nSize the market for speech apps in Europe."


def test_the_measures_on_the_demos_failures() -> None:
    assert repeated_share(LOOP) > 0.8 and problem(LOOP) is not None
    assert repeated_share(SCOUT) == 0 and problem(SCOUT, prompt=PROMPT) is None
    assert problem("Size the market for speech apps in Europe.", prompt=PROMPT) is not None
    assert copied_share(SCOUT + " So: build it.", SCOUT) > 0.8
    assert problem(SCOUT + " So: build it.", read={"fnd_a": SCOUT}) is not None
    own = ("Build it, for clinicians first: demand exists [fnd_a] and offline use is the gap the incumbents "
           "leave open, so six months of work can reach paying users.")
    assert problem(own, read={"fnd_a": SCOUT}) is None
    assert problem("", prompt=PROMPT) is None  # empty bodies are refused elsewhere (says_something)




def _finish(body: str, title: str = "t") -> str:
    return json.dumps({"action": {"tool": "submit_finding", "args": {"title": title, "body": body}}})


def _run(tmp_path: Path, plane: LivePlane, token: str, replies: list[str], role: Role) -> tuple[str, ScriptedChat]:
    model = ScriptedChat(replies)
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path,
                                       max_steps=3, role=role))
    outcome = asyncio.run(agent.run())
    assert outcome.ending is Ending.SUBMITTED and outcome.finding_id is not None
    return plane.store.get_finding(outcome.finding_id).body, model


def _reasked(model: ScriptedChat) -> str:
    return str(model.seen[1][-1]["content"])


def _worker(live_plane: Callable[..., LivePlane]) -> tuple[LivePlane, str]:
    plane = live_plane()
    goal = plane.store.create_goal(GoalSpec("Should a small team build a speech app?", 1_000_000, 100))
    plane.store.create_task(goal.id, TaskSpec("market", PROMPT))
    token, _ = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    return plane, token


def test_a_self_repeating_finding_is_asked_again(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token = _worker(live_plane)
    body, model = _run(tmp_path, plane, token, [_finish(LOOP), _finish(SCOUT)], Role.WORKER)
    assert body == SCOUT
    assert "repeats itself" in _reasked(model)


def test_a_finding_that_restates_its_prompt_is_asked_again(tmp_path: Path,
                                                           live_plane: Callable[..., LivePlane]) -> None:
    plane, token = _worker(live_plane)
    body, model = _run(tmp_path, plane, token, [_finish("Size the market for speech apps in Europe."),
                                                _finish(SCOUT)], Role.WORKER)
    assert body == SCOUT
    assert "only restates what you were given" in _reasked(model)


def _lead(live_plane: Callable[..., LivePlane], body: str) -> tuple[LivePlane, str, str]:
    """A scout's finding in its group and the lead's task in the lead's, its prompt made as a run makes it: the
    lead reads the finding in its prompt, not through read_findings (its own group has none)."""
    plane = live_plane()
    store = plane.store
    goal = store.create_goal(GoalSpec("Should a small team build a speech app?", 1_000_000, 100))
    scout_task = store.create_task(goal.id, TaskSpec("market", PROMPT, group="team"))
    claim = store.claim(goal.id, "wrk_scout", 600, task_id=scout_task.id)
    assert claim is not None
    found = store.submit_finding(scout_task.id, claim.token, author="wrk_scout", title="market", body=body)
    store.complete(scout_task.id, claim.token)
    store.create_task(goal.id, TaskSpec("synthesis", lead_prompt(goal, "Write one recommendation.", [found]),
                                        group=LEAD_GROUP))
    token, _ = plane.tokens.issue(goal.id, LEAD_GROUP, ttl_s=3600)
    return plane, token, found.id


def test_a_lead_copying_a_finding_is_refused_and_writes_its_own(tmp_path: Path,
                                                                live_plane: Callable[..., LivePlane]) -> None:
    plane, token, found = _lead(live_plane, SCOUT)
    own = ("Build it, for clinicians first: demand exists and offline use is the gap the incumbents leave open, "
           f"so six months of work can reach paying users [{found}].")
    body, model = _run(tmp_path, plane, token, [_finish(SCOUT, "synthesis"), _finish(own, "synthesis")], Role.LEAD)
    assert body == own
    # the finding read from the lead's prompt ends where its instructions start: pasted whole, it is held whole
    assert "holds the finding" in _reasked(model) and found in _reasked(model)


def test_a_lead_rewording_a_finding_a_little_is_refused(tmp_path: Path,
                                                       live_plane: Callable[..., LivePlane]) -> None:
    # the demo's lead: a scout's sentence with its subject and one verb changed
    scout = ("The team is currently working on developing an on-device speech model product and has not yet "
             "submitted any findings.")
    plane, token, found = _lead(live_plane, scout)
    near = ("We are currently working on developing an on-device speech model product and have not yet submitted "
            "any findings.")
    own = f"No-go for now: nothing was found out yet about the market or the models [{found}]."
    body, model = _run(tmp_path, plane, token, [_finish(near, "synthesis"), _finish(own, "synthesis")], Role.LEAD)
    assert body == own and "copies the findings" in _reasked(model)


def test_a_lead_answering_with_a_findings_heading_is_asked_again(tmp_path: Path,
                                                                 live_plane: Callable[..., LivePlane]) -> None:
    plane, token, found = _lead(live_plane, SCOUT)
    heading = "market (by wrk_scout, group team)"  # the demo's lead: one finding's title line, as its prompt shows it
    own = f"Go, for clinicians first: the demand is there and offline use is left open [{found}]."
    body, model = _run(tmp_path, plane, token, [_finish(heading, "synthesis"), _finish(own, "synthesis")],
                       Role.LEAD)
    assert body == own and "only restates what you were given" in _reasked(model)


def test_a_lead_that_only_ever_copies_submits_no_copy(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, _ = _lead(live_plane, SCOUT)
    model = ScriptedChat([_finish(SCOUT)] * 9)
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path,
                                       max_steps=3, role=Role.LEAD))
    outcome = asyncio.run(agent.run())
    assert outcome.ending is Ending.STEP_CAP and outcome.finding_id is not None
    body = plane.store.get_finding(outcome.finding_id).body
    assert SCOUT not in body and "No result was reached" in body


#: filler as long as SCOUT: pasted beside it, the copy is half the body (under COPIED) but all of SCOUT
FILLER = ("Independent remark alpha concerns a separate consideration worth weighing carefully here, and "
          "independent remark beta another one, with remark gamma on pricing and remark delta on hiring.")


def test_a_copy_disguised_or_padded_is_still_a_copy() -> None:
    for disguised in (SCOUT.replace("e", "e\u200b"),  # zero-width space in every word with an 'e'
                      SCOUT.replace("e", "e\u00ad"),  # soft hyphens
                      SCOUT.replace("a", "\u0430").replace("e", "\u0435").replace("o", "\u043e"),  # Cyrillic
                      SCOUT + "\n" + FILLER):  # the whole finding plus as much text again
        assert problem(disguised, read={"fnd_a": SCOUT}) is not None, disguised
    assert copied_share(SCOUT + "\n" + FILLER, SCOUT) < 0.6
    # a short finding may be quoted whole inside a synthesis of one's own
    assert problem("Build it: [fnd_b] says the pilot worked, and the numbers in the market study agree with "
                   "what the clinicians told us about offline use.", read={"fnd_b": "The pilot worked."}) is None


def _post_synthesis(plane: LivePlane, token: str, body: str) -> tuple[int, dict[str, Any]]:
    """What the plane answers a lead that calls submit_finding itself (its shell can read the agent's token)."""
    async def post() -> tuple[int, dict[str, Any]]:
        async with plane.client(token) as http:
            claimed = (await http.post("/v1/tools/claim_task", json={})).json()
            answer = await http.post("/v1/tools/submit_finding", json={
                "task_id": claimed["task"]["id"], "fencing_token": claimed["fencing_token"], "title": "synthesis",
                "body": body})
            return answer.status_code, answer.json()
    return asyncio.run(post())


def test_the_plane_refuses_a_leads_copy_or_its_nudge_said_back(live_plane: Callable[..., LivePlane]) -> None:
    from swarmyard.rules.instructions import LAST_STEP

    for body in (SCOUT, SCOUT.replace("e", "e\u200b"), FILLER + "\n" + SCOUT, LAST_STEP, LOOP):
        plane, token, found = _lead(live_plane, SCOUT)
        status, answer = _post_synthesis(plane, token, body)
        assert status == 400 and answer["error"]["code"] == "unoriginal_finding", (body, answer)
        assert plane.store.read_findings(plane.store.get_task(answer["error"]["task_id"]).goal_id,
                                         group=LEAD_GROUP) == []
    plane, token, found = _lead(live_plane, SCOUT)
    status, answer = _post_synthesis(plane, token, f"Go, for clinicians first: the demand is there [{found}].")
    assert status == 200, answer


def test_a_lead_padding_a_copy_is_asked_again(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane, token, found = _lead(live_plane, SCOUT)
    own = f"Go, for clinicians first: the demand is there and offline use is left open [{found}]."
    body, model = _run(tmp_path, plane, token, [_finish(FILLER + "\n" + SCOUT, "synthesis"),
                                                _finish(own, "synthesis")], Role.LEAD)
    assert body == own and "could not be used" in _reasked(model)
