"""The no-result placeholder names the limit that ran out, and a synthesis's claims each name a real finding.

The agent runs on the real control plane (``live_plane``); its model is a scripted ``ChatModel`` that raises
the broker's typed refusals as ``BrokerChatModel`` rebuilds them (``tests/unit/test_agent_builtin.py`` shows the
real broker raising them, with these fields). ``grounding`` is pure: its checks are called directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import LivePlane
from rigs.chat import ScriptedChat
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending
from swarmyard.agents.model import ModelReply
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.errors import BudgetError, BudgetExceededError, CallCapExceededError, DeadlinePassedError
from swarmyard.rules import grounding, no_result

POST = ModelReply("", (("board_post", json.dumps({"body": "looking"})),))


@pytest.mark.parametrize(("refusal", "why"), [
    (None, "the step cap ran out (3 of 3 steps)"),
    (CallCapExceededError("task task_1", 9), "the task's call cap ran out at step 2 (all 9 of its model calls were made)"),
    (CallCapExceededError("goal goal_1", 60), "the goal's call cap ran out at step 2 (all 60 of its model calls were made)"),
    (BudgetExceededError("task task_1", 1_200, 30),
     "the budget ran out at step 2 (the task's envelope had $0.000030 left, the next call could cost up to $0.001200)"),
    (DeadlinePassedError("goal_1", 100.0), "the goal's deadline passed at step 2"),
], ids=["step cap", "task call cap", "goal call cap", "budget", "deadline"])
def test_the_placeholder_names_the_limit_that_ran_out(tmp_path: Path, live_plane: Callable[..., LivePlane],
                                                     refusal: BudgetError | None, why: str) -> None:
    plane = live_plane()
    goal = plane.store.create_goal(GoalSpec("speech app?", budget_micro_usd=200_000, call_cap=100))
    plane.store.create_task(goal.id, TaskSpec(title="price", prompt="find the price"))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    model = ScriptedChat([POST, refusal] if refusal is not None else [POST, POST, POST])
    agent = BuiltinAgent(model, PlaneTools(plane.client(token)), LocalTools(tmp_path, exec_timeout_s=5),
                         AgentSettings(plane_url="http://plane", token=token, model="m", workdir=tmp_path, max_steps=3))
    outcome = asyncio.run(agent.run())
    assert outcome.ending is (Ending.STEP_CAP if refusal is None else Ending.BUDGET)
    [finding] = [f for f in plane.store.read_findings(goal.id) if f.author == me.worker_id]
    assert finding.body == f"No result was reached for 'price': {why}."
    assert no_result.is_placeholder(finding.body) and no_result.reason(finding.body) == why
    assert "budget" not in finding.body or isinstance(refusal, BudgetExceededError)


REAL = {"fnd_aaaaaaaa": "market", "fnd_bbbbbbbb": "risks"}
EMPTY = ["fnd_cccccccc"]
NOTE = grounding.nothing_found([("market", None), ("risks", None), ("price", "the step cap ran out (6 of 6 steps)")])


def test_the_note_counts_the_tasks_that_reached_nothing_and_says_why() -> None:
    assert NOTE == ("1 of 3 tasks reached no result, so nothing of theirs is in this synthesis: 'price': the step "
                    "cap ran out (6 of 6 steps).")
    assert grounding.nothing_found([("market", None)]) == ""
    assert grounding.note_in(f"Objective: x\n\n{NOTE}\n\nFindings:\n[fnd_aaaaaaaa] market") == NOTE


def test_a_synthesis_whose_every_claim_names_a_real_finding_passes() -> None:
    body = (f"We should build it. [fnd_aaaaaaaa] [fnd_bbbbbbbb]\n\nFrom the findings:\n- Buyers pay. [fnd_aaaaaaaa]\n"
            f"- The risks are small. [fnd_bbbbbbbb]\n\n{NOTE}\n\n(cut short: the budget ran out at step 3)")
    assert grounding.problem(body, ["fnd_aaaaaaaa"], REAL, EMPTY, NOTE) is None


@pytest.mark.parametrize(("body", "cited", "ref", "words"), [
    (f"We should build it.\n\n{NOTE}", [], "(none)", "names no finding"),
    (f"We should build it. [fnd_aaaaaaaa]\n- and it is cheap\n\n{NOTE}", [], "(none)", "'and it is cheap' names no"),
    (f"Build it. [fnd_cccccccc]\n\n{NOTE}", [], "fnd_cccccccc", "no-result placeholder"),
    (f"Build it. [fnd_aaaaaaaa]\n\n{NOTE}", ["fnd_cccccccc"], "fnd_cccccccc", "no-result placeholder"),
    (f"Build it. [fnd_zzzzzzzz]\n\n{NOTE}", [], "fnd_zzzzzzzz", "not a finding of this goal"),
    ("Build it. [fnd_aaaaaaaa]", [], "(none)", "does not say which tasks reached no result"),
    ("Build it. [fnd_aaaaaaaa]\n\n2 of 3 tasks reached no result, so nothing of theirs is in this synthesis: x.",
     [], "(none)", "does not match the store"),
], ids=["bare claim", "bare list item", "placeholder named", "placeholder cited", "made-up id", "note left out",
        "note made up"])
def test_a_synthesis_claim_with_no_real_finding_behind_it_is_refused(body: str, cited: list[str], ref: str,
                                                                     words: str) -> None:
    found = grounding.problem(body, cited, REAL, EMPTY, NOTE)
    assert found is not None and found[0] == ref and words in found[1], found


def test_outside_a_grounded_run_only_the_ids_are_checked() -> None:
    assert grounding.problem("We should build it.", [], REAL, EMPTY, None) is None
    assert grounding.problem("Build it [fnd_zzzzzzzz].", [], REAL, EMPTY, None) is not None


def test_a_simulated_lead_reading_its_workers_reports_names_their_best_score_not_that_none_was_scored() -> None:
    from swarmyard.broker.chat import ChatRequest, Message, Role, Tool
    from swarmyard.broker.providers.attempts import attempt_answer

    # what the simulated workers submit, as the lead's prompt shows their findings: no "[score N]" line in it
    reports = [json.loads(attempt_answer(ChatRequest("sim", (Message(Role.USER, f"[score {s}] instance 4 code {c}"),),
                                                     (Tool("submit_finding", "", {}),))))["action"]["args"]["body"]
               for s, c in ((250_000, "11110000"), (750_000, "11111100"))]
    prompt = "Findings:\n" + "\n\n".join(f"[fnd_{i}aaaaaaa] attempt\n{body}" for i, body in enumerate(reports))
    lead = json.loads(attempt_answer(ChatRequest("sim", (Message(Role.USER, prompt),),
                                                 (Tool("submit_finding", "", {}),))))["action"]["args"]["body"]
    assert "No attempt was scored" not in lead
    assert "750000" in lead and "11111100" in lead
