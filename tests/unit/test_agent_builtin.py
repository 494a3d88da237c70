"""The built-in agent's loop, parsing, re-asks, step cap and its own machine's tools.

The control plane is the real one on a SQLite store, served over a Unix socket (the ``live_plane`` fixture);
tests check what landed in its store. The model is a scripted ``ChatModel`` (a paid external service in real runs).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import LivePlane
from rigs.broker import loopback_broker
from rigs.chat import ScriptedChat
from swarmyard.agents.actions import (
    TOOLS,
    action_schema,
    parse_reply,
    parse_tool_call,
    response_format,
    salvage_submission,
)
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending, Role
from swarmyard.agents.model import BrokerChatModel, ModelReply, OutputMode
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.auth.tokens import TokenAuthority
from swarmyard.broker import ModelRoute
from swarmyard.broker.providers.scripted import CallTools, Fail, FailKind, Say, ScriptedProvider
from swarmyard.clock import FakeClock
from swarmyard.domain import (
    Citation,
    CitationKind,
    Finding,
    GoalSpec,
    Post,
    PostKind,
    Price,
    ReservationState,
    TaskSpec,
)
from swarmyard.errors import (
    BudgetError,
    BudgetExceededError,
    CallCapExceededError,
    ConfigError,
    ContextLengthError,
    InvalidInputError,
    ProviderError,
    UpstreamUnknownError,
)
from swarmyard.store import SqlStore


@dataclass
class Setup:
    """A goal on a live plane, a task for the agent, and (optionally) a peer who posted and found things."""

    plane: LivePlane
    goal_id: str
    task_id: str
    token: str
    worker_id: str
    peer_post_seq: int | None = None
    peer_findings: tuple[str, ...] = ()

    def posts_by(self, author: str) -> list[Post]:
        return [p for p in self.plane.store.read_board(self.goal_id) if p.author == author]

    def findings_by(self, author: str) -> list[Finding]:
        return [f for f in self.plane.store.read_findings(self.goal_id) if f.author == author]


def _setup(live_plane: Callable[..., LivePlane], *, claimable: bool = True, peer_posts: bool = False,
           peer_findings: tuple[str, ...] = ()) -> Setup:
    plane = live_plane()
    store = plane.store
    goal = store.create_goal(GoalSpec(objective="on-device speech", budget_micro_usd=1_000_000, call_cap=100))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    setup = Setup(plane, goal.id, "", token, me.worker_id)
    if peer_posts or peer_findings:
        peer = store.create_task(goal.id, TaskSpec(title="peer lens", priority=10))
        claim = store.claim(goal.id, "wrk_peer", 60, task_id=peer.id)
        assert claim is not None
        if peer_posts:
            setup.peer_post_seq = store.post(peer.id, claim.token, PostKind.NOTE, "checked licences",
                                             author="wrk_peer").seq
        setup.peer_findings = tuple(
            store.submit_finding(peer.id, claim.token, author="wrk_peer", title=title,
                                 body=f"{title} body").id
            for title in peer_findings
        )
    if claimable:
        setup.task_id = store.create_task(goal.id, TaskSpec(title="risks", prompt="list risks")).id
    return setup


def _agent(tmp_path: Path, model: ScriptedChat, setup: Setup, **overrides: Any) -> BuiltinAgent:
    settings = AgentSettings(
        plane_url="http://plane", token=setup.token, model="m", workdir=tmp_path, **overrides
    )
    return BuiltinAgent(model, PlaneTools(setup.plane.client(setup.token)),
                        LocalTools(tmp_path, exec_timeout_s=5), settings)


def _action(tool: str, **args: Any) -> str:
    return json.dumps({"action": {"tool": tool, "args": args}})


def test_parse_reply_shapes() -> None:
    assert parse_reply(_action("board_post", body="hi")).args == {"body": "hi"}
    assert parse_reply('```json\n{"tool": "board_read", "args": {}}\n```').tool == "board_read"
    assert parse_reply('Sure! {"name": "shell", "arguments": {"command": "ls"}}').args == {"command": "ls"}
    assert parse_reply('{"tool": "shell", "args": "{\\"command\\": \\"ls\\"}"}').args == {"command": "ls"}
    assert parse_tool_call("read_file", '{"path": "a.txt", "junk": 1}').args == {"path": "a.txt"}
    # the local model's own tool shape, when it comes back as text
    assert parse_reply('{"tool": "board_post", "arguments": {"body": "x"}}').args == {"body": "x"}


@pytest.mark.parametrize(("text", "salvaged"), [
    ('{"tool": "submit_finding", "arguments": {"title": "Go", "body": "Market \\"large\\",\\nrisks hi',
     {"title": "Go", "body": 'Market "large",\nrisks hi'}),
    ('{"action": {"tool": "submit_finding", "args": {"body": "only a body"}}}', {"title": "finding",
                                                                                "body": "only a body"}),
    ('{"tool": "submit_finding", "arguments": {"title": "Go", "body": "cut at \\u00', {"title": "Go",
                                                                                      "body": "cut at \\u00"}),
    ('{"tool": "submit_finding", "arguments": {"title": "Go"', None),
    ('{"tool": "board_post", "args": {"text": "no body"}}', None),
    ("plain words", None),
])
def test_a_submission_cut_off_mid_json_is_salvaged(text: str, salvaged: dict[str, str] | None) -> None:
    assert salvage_submission(text) == salvaged


@pytest.mark.parametrize(
    "text",
    [
        "no json here",
        '{"tool": "rm_rf", "args": {}}',
        '{"tool": "shell", "args": {}}',
        '{"tool": "shell", "args": [1]}',
        "[1, 2]",
        '{"action": "x"}',
        '{"tool": "sh',
        '{"tool": "submit_finding", "args": {"title": "synthesis", "body": "[fnd_01m8rnjbzeh872wfwhntadp8bt]"}}',
        '{"tool": "submit_finding", "args": {"title": "t", "body": " [a] [b], 42 "}}',
    ],
)
def test_parse_reply_refuses_malformed(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_reply(text)


def test_citations_alone_are_not_salvaged_as_a_finding() -> None:
    assert salvage_submission('{"tool": "submit_finding", "args": {"title": "s", "body": "[fnd_1, group team]"') is None
    assert salvage_submission('{"tool": "submit_finding", "args": {"body": "Ship it [fnd_1]')["body"] == "Ship it [fnd_1]"


def test_a_finding_in_words_with_citations_is_accepted() -> None:
    action = parse_reply('{"tool": "submit_finding", "args": {"title": "t", "body": "Ship it [fnd_1]."}}')
    assert action.args["body"] == "Ship it [fnd_1]."


def test_action_schema_has_one_branch_per_tool() -> None:
    schema = action_schema()
    assert schema["type"] == "object"
    branches = schema["properties"]["action"]["anyOf"]
    assert [b["properties"]["tool"]["const"] for b in branches] == list(TOOLS)
    assert response_format()["json_schema"]["schema"] == schema


def test_loop_survives_malformed_output_and_submits(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_posts=True)
    submit = json.dumps({"title": "Risks", "body": "Three risks.", "cite": [str(setup.peer_post_seq), "fnd_unknown"]})
    model = ScriptedChat(
        ["garbage", '{"tool": "nope"}', _action("board_post", body="looking at licences"),
         ModelReply("", (("submit_finding", submit),))]
    )
    outcome = asyncio.run(_agent(tmp_path, model, setup).run())
    assert outcome.ending is Ending.SUBMITTED
    assert (outcome.task_id, outcome.malformed, outcome.steps) == (setup.task_id, 2, 2)
    [post] = setup.posts_by(setup.worker_id)
    assert (post.task_id, post.body) == (setup.task_id, "looking at licences")
    [finding] = setup.findings_by(setup.worker_id)
    assert (finding.id, finding.task_id, finding.body) == (outcome.finding_id, setup.task_id, "Three risks.")
    # the unknown id is dropped, not sent (the plane would refuse a citation that does not resolve)
    assert finding.citations == (Citation(CitationKind.POST, str(setup.peer_post_seq)),)
    assert "checked licences" in model.seen[0][1]["content"]  # the board was in the brief


def test_reasks_are_bounded_and_the_step_cap_still_submits(tmp_path: Path,
                                                           live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    model = ScriptedChat([], then="not json at all")  # malformed, every time
    outcome = asyncio.run(_agent(tmp_path, model, setup, max_steps=3, max_reasks=2).run())
    assert outcome.ending is Ending.STEP_CAP
    assert len(model.seen) == 3 * 3
    [finding] = setup.findings_by(setup.worker_id)
    assert finding.title == "risks (partial)" and finding.id == outcome.finding_id


def test_the_last_step_may_only_submit(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    submit = ModelReply("", (("submit_finding", json.dumps({"title": "Risks", "body": "Licences, cost."})),))
    model = ScriptedChat([_action("board_post", body="a"), _action("board_post", body="b"), submit])
    outcome = asyncio.run(_agent(tmp_path, model, setup, max_steps=3).run())
    assert outcome.ending is Ending.SUBMITTED and outcome.steps == 3
    assert model.only == [None, None, frozenset({"submit_finding"})]
    assert "last step" in model.seen[-1][-1]["content"]
    assert [p.body for p in setup.posts_by(setup.worker_id)] == ["a", "b"]
    assert [f.body for f in setup.findings_by(setup.worker_id)] == ["Licences, cost."]


def test_a_submission_cut_off_at_max_tokens_is_submitted_as_written(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    cut = '{"tool": "submit_finding", "arguments": {"title": "Risks", "body": "Licences, cost, and the'
    model = ScriptedChat([_action("board_post", body="a"), cut])
    outcome = asyncio.run(_agent(tmp_path, model, setup, max_steps=2).run())
    assert outcome.ending is Ending.SUBMITTED and outcome.malformed == 1 and len(model.seen) == 2
    [finding] = setup.findings_by(setup.worker_id)
    assert (finding.title, finding.body) == ("Risks", "Licences, cost, and the")


def test_a_partial_finding_salvages_the_last_cut_off_answer(tmp_path: Path,
                                                             live_plane: Callable[..., LivePlane]) -> None:
    # cut-off JSON naming no tool is re-asked, not taken as a submission; when the run ends on the budget,
    # what it began to say is the partial finding's body, not the raw JSON
    setup = _setup(live_plane)
    model = ScriptedChat(['{"title": "T", "body": "half a thought', BudgetError("no money left")])
    outcome = asyncio.run(_agent(tmp_path, model, setup, max_steps=3).run())
    assert outcome.ending is Ending.BUDGET and outcome.malformed == 1
    [finding] = setup.findings_by(setup.worker_id)
    assert (finding.title, finding.body) == ("risks (partial)", "half a thought")


def test_budget_refusal_ends_with_a_partial_finding(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    model = ScriptedChat([_action("board_read"), BudgetError("no money left")])
    outcome = asyncio.run(_agent(tmp_path, model, setup).run())
    assert outcome.ending is Ending.BUDGET
    assert [f.title for f in setup.findings_by(setup.worker_id)] == ["risks (partial)"]


def test_a_conversation_too_long_for_the_model_is_compacted_and_asked_again(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    setup.plane.store.create_task(setup.goal_id, TaskSpec(title="long", prompt="evidence " * 2000, priority=5))
    model = ScriptedChat([_action("board_read"), ContextLengthError("m", 5000, 4096),
                           ContextLengthError("m", 4500, 4096), _action("submit_finding", title="t", body="b")])
    outcome = asyncio.run(_agent(tmp_path, model, setup).run())
    assert outcome.ending is Ending.SUBMITTED and outcome.steps == 2
    full, first, second = (sum(len(m["content"]) for m in seen) for seen in model.seen[1:])
    assert full > 16_000 and first < full and second < first
    assert all(len(m["content"]) <= 1206 for m in model.seen[-1])  # the second limit, with its marker
    assert model.seen[-1][0] == model.seen[0][0]  # the system prompt is kept
    assert [f.body for f in setup.findings_by(setup.worker_id)] == ["b"]


def test_a_model_failing_in_passing_is_asked_again_then_gives_up_with_a_partial_finding(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    flaky = [ProviderError("broker answered 502", retryable=True) for _ in range(4)]
    model = ScriptedChat([flaky[0], ModelReply(_action("board_read"), ()), *flaky[1:]])
    outcome = asyncio.run(_agent(tmp_path, model, setup, retry_backoff_s=0.0, max_retries=2).run())
    assert outcome.ending is Ending.MODEL_ERROR and outcome.steps == 2
    assert len(model.seen) == 5  # one retry that worked, then a first try and two retries that did not
    [partial] = setup.findings_by(setup.worker_id)
    assert partial.title == "risks (partial)"


def test_a_lead_whose_model_fails_submits_no_placeholder(tmp_path: Path,
                                                        live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_findings=("market",))
    model = ScriptedChat([ProviderError("broker answered 400: bad request", retryable=False)])
    with pytest.raises(ProviderError, match="stopped on a model error at step 1 of 8"):
        asyncio.run(_agent(tmp_path, model, setup, role=Role.LEAD).run())
    assert len(model.seen) == 1
    assert setup.findings_by(setup.worker_id) == []


@pytest.mark.parametrize("error", [UpstreamUnknownError("the upstream dropped the connection", reservation_id="r"),
                                   ProviderError("upstream answered 401", upstream_status=401)])
def test_a_worker_whose_every_call_fails_submits_nothing_and_raises(
        tmp_path: Path, live_plane: Callable[..., LivePlane], error: ProviderError) -> None:
    # a placeholder finding would end the task done, and the coordinator's max_failures would never apply
    setup = _setup(live_plane)
    model = ScriptedChat([error])
    with pytest.raises(ProviderError, match=f"stopped on a model error at step 1 of 4, before any work "
                                            f"\\({error.code}\\)") as raised:
        asyncio.run(_agent(tmp_path, model, setup, max_steps=4, retry_backoff_s=0.0).run())
    assert raised.value.upstream_status == error.upstream_status
    assert setup.findings_by(setup.worker_id) == []
    [task] = [t for t in setup.plane.store.list_tasks(setup.goal_id) if t.id == setup.task_id]
    assert task.state.value == "claimed"  # left to the coordinator, which counts the failed try


def test_work_cut_short_by_a_model_error_is_a_partial_finding_that_says_so(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    call = ModelReply("", (("board_post", json.dumps({"body": "licences first"})),))
    model = ScriptedChat([call, ProviderError("upstream answered 401", upstream_status=401)])
    outcome = asyncio.run(_agent(tmp_path, model, setup, max_steps=4).run())
    assert outcome.ending is Ending.MODEL_ERROR and outcome.steps == 2
    [partial] = setup.findings_by(setup.worker_id)
    assert partial.title == "risks (partial)"
    assert partial.body == ("No result was reached for 'risks': cut short by a model error at step 2 of 4 "
                            "(provider_error): upstream answered 401.")


def test_a_step_cap_placeholder_names_the_limit(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane)
    calls = [ModelReply("", (("board_post", json.dumps({"body": str(i)})),)) for i in range(3)]
    outcome = asyncio.run(_agent(tmp_path, ScriptedChat(calls), setup, max_steps=3).run())
    assert outcome.ending is Ending.STEP_CAP
    [partial] = setup.findings_by(setup.worker_id)
    assert partial.body == "No result was reached for 'risks': the step cap ran out (3 of 3 steps)."


def test_the_leads_brief_gives_every_finding_an_equal_share(tmp_path: Path,
                                                            live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_findings=("a", "b", "c", "d"))
    store = setup.plane.store
    peer = store.create_task(setup.goal_id, TaskSpec(title="long lens"))
    claim = store.claim(setup.goal_id, "wrk_long", 60, task_id=peer.id)
    assert claim is not None
    store.submit_finding(peer.id, claim.token, author="wrk_long", title="long", body="z" * 20_000)
    model = ScriptedChat([_action("submit_finding", title="Go", body="Go.")])
    asyncio.run(_agent(tmp_path, model, setup, role=Role.LEAD).run())
    brief = model.seen[0][1]["content"]
    assert all(f"[{ref}]" in brief for ref in setup.peer_findings)
    assert "z" * 960 in brief and "z" * 961 not in brief  # 4,800 characters for five findings


def test_the_leads_brief_lists_each_finding_once_and_ends_with_its_instructions(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_findings=("market", "risks"), claimable=False)
    first, second = setup.peer_findings
    store = setup.plane.store
    # the coordinator's lead task holds the first finding already (as lead_prompt writes it); the second is new
    store.create_task(setup.goal_id, TaskSpec(title="synthesis", prompt=f"[{first}] market\nbig\n\nDecide."))
    model = ScriptedChat([_action("submit_finding", title="Go", body="Go.")])
    asyncio.run(_agent(tmp_path, model, setup, role=Role.LEAD).run())
    brief = model.seen[0][1]["content"]
    assert brief.count(f"[{first}]") == 1 and brief.count(f"[{second}]") == 1
    assert brief.endswith("Decide.")
    [synthesis] = setup.findings_by(setup.worker_id)
    assert {c.ref for c in synthesis.citations} == {first, second}


def test_no_task_means_no_model_call(tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, claimable=False)
    model = ScriptedChat([])
    outcome = asyncio.run(_agent(tmp_path, model, setup).run())
    assert outcome.ending is Ending.NO_TASK
    assert model.seen == []


def test_lead_reads_findings_and_cites_them_all_when_the_model_forgets(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_findings=("market", "risks"))
    first, second = setup.peer_findings
    model = ScriptedChat([_action("submit_finding", title="Go", body="Go, because market is big.")])
    outcome = asyncio.run(_agent(tmp_path, model, setup, role=Role.LEAD).run())
    assert outcome.ending is Ending.SUBMITTED
    assert f"[{first}] market" in model.seen[0][1]["content"]
    [synthesis] = setup.findings_by(setup.worker_id)
    assert synthesis.citations == (Citation(CitationKind.FINDING, first), Citation(CitationKind.FINDING, second))


def test_a_lead_citing_one_finding_twice_cites_each_finding_once(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    setup = _setup(live_plane, peer_findings=("market", "risk"))
    first, second = setup.peer_findings
    model = ScriptedChat([_action("submit_finding", title="Go", body="Go.", cite=[second, second])])
    asyncio.run(_agent(tmp_path, model, setup, role=Role.LEAD).run())
    [synthesis] = setup.findings_by(setup.worker_id)
    assert synthesis.citations == (Citation(CitationKind.FINDING, second), Citation(CitationKind.FINDING, first))


def test_files_are_confined_to_the_working_folder(tmp_path: Path) -> None:
    tools = LocalTools(tmp_path / "disk")
    (tmp_path / "disk").mkdir()
    (tmp_path / "secret").write_text("key")
    assert "wrote 5 bytes" in tools.write_file("notes/a.txt", "hello")
    assert tools.read_file("notes/a.txt") == "hello"
    for bad in ("../secret", "/etc/passwd", "notes/../../secret"):
        with pytest.raises(InvalidInputError):
            tools.read_file(bad)
        with pytest.raises(InvalidInputError):
            tools.write_file(bad, "x")
    assert (tmp_path / "secret").read_text() == "key"


def test_shell_runs_without_the_agents_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMYARD_TOKEN", "sy1.secret")
    out = asyncio.run(LocalTools(tmp_path).shell("echo token=${SWARMYARD_TOKEN:-none}; pwd"))
    assert out.startswith("[exit 0]")
    assert "token=none" in out
    assert str(tmp_path.resolve()) in out


def test_shell_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    tools = LocalTools(tmp_path, exec_timeout_s=0.5)
    out = asyncio.run(tools.shell("sleep 60 & echo $! > child.pid; wait"))
    assert "timed out" in out
    child = int((tmp_path / "child.pid").read_text())
    try:
        state = Path(f"/proc/{child}/stat").read_text().split(") ", 1)[1][0]
    except FileNotFoundError:
        state = "gone"
    assert state in {"gone", "Z"}  # dead (a zombie waits for init to reap it)


@dataclass
class BrokerRig:
    """The real broker on loopback HTTP with a scripted provider, one claimed task and its worker's token."""

    url: str
    store: SqlStore
    script: ScriptedProvider
    token: str


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerRig]:
    script = ScriptedProvider()
    routes = (ModelRoute("m", "scripted", max_output_tokens=1000), ModelRoute("tiny", "scripted", context_tokens=64))
    with loopback_broker(f"sqlite:///{tmp_path / 'store.db'}", {"scripted": script}, routes, secret=b"s" * 32,
                         prices=[Price("m", 1_000_000, 1_000_000)], budget=10_000_000, task_budget=5_000,
                         task_call_cap=2) as on:
        yield BrokerRig(on.url, on.store, script, on.worker.token)


async def _ask(rig: BrokerRig, mode: OutputMode = OutputMode.TOOLS) -> tuple[ModelReply, BrokerChatModel]:
    async with httpx.AsyncClient(base_url=rig.url, headers={"authorization": f"Bearer {rig.token}"}) as client:
        model = BrokerChatModel(client, "m", mode=mode)
        return await model.reply([{"role": "user", "content": "hi"}]), model


def test_broker_model_asks_for_tools_or_a_schema(broker: BrokerRig) -> None:
    broker.script.add("m", CallTools((("board_read", {}),)), Say('{"tool": "board_read", "args": {}}'))
    reply, model = asyncio.run(_ask(broker, OutputMode.TOOLS))
    assert reply.tool_calls == (("board_read", "{}"),)
    assert model.usage.calls == 1 and model.usage.input_tokens > 0
    asked = broker.script.requests[-1]
    assert asked.tool_choice == "required" and [t.name for t in asked.tools] == list(TOOLS)
    reply, _ = asyncio.run(_ask(broker, OutputMode.JSON_SCHEMA))
    assert broker.script.requests[-1].tools == ()  # the schema asks instead of tools
    assert parse_reply(reply.text).tool == "board_read"


def test_broker_model_types_refusals(broker: BrokerRig) -> None:
    broker.script.add("m", Fail(FailKind.STATUS_500), Say("one"), Say("two"))
    with pytest.raises(ProviderError) as failed:
        asyncio.run(_ask(broker))
    assert failed.value.retryable
    asyncio.run(_ask(broker))  # the failed call spent one of the task's two calls, this one the other
    with pytest.raises(CallCapExceededError):  # the broker's typed refusal, rebuilt by its code
        asyncio.run(_ask(broker))
    [goal] = broker.store.list_goals()
    broker.store.create_task(goal.id, TaskSpec("poor", budget_micro_usd=10, call_cap=5))
    token, poor = TokenAuthority(b"s" * 32, broker.store, FakeClock()).issue(goal.id, "main", ttl_s=3600)
    assert broker.store.claim(goal.id, poor.worker_id, 3600) is not None
    with pytest.raises(BudgetExceededError) as poorer:
        asyncio.run(_ask(BrokerRig(broker.url, broker.store, broker.script, token)))
    assert poorer.value.available == 10 and poorer.value.envelope.startswith("task ")
    assert len(broker.script.requests) == 2  # neither refusal reached the provider
    assert not broker.store.list_reservations(goal.id, state=ReservationState.HELD)


def test_broker_model_takes_a_lost_call_as_final(broker: BrokerRig) -> None:
    # the broker held the call, sent it, lost the answer: 502 upstream_unknown, x-should-retry: false
    broker.script.add("m", Fail(FailKind.AFTER_SEND))
    with pytest.raises(UpstreamUnknownError) as lost:
        asyncio.run(_ask(broker))
    assert not lost.value.retryable
    [goal] = broker.store.list_goals()
    [held] = broker.store.list_reservations(goal.id)
    assert (held.id, held.state) == (lost.value.reservation_id, ReservationState.UNKNOWN)


def test_broker_model_types_a_full_context_window(broker: BrokerRig) -> None:
    async def ask() -> None:
        async with httpx.AsyncClient(base_url=broker.url,
                                     headers={"authorization": f"Bearer {broker.token}"}) as client:
            await BrokerChatModel(client, "tiny").reply([{"role": "user", "content": "x" * 100}])

    with pytest.raises(ContextLengthError) as refused:
        asyncio.run(ask())
    assert refused.value.context_tokens == 64 and (refused.value.input_tokens or 0) > 64
    assert broker.script.requests == []


def test_settings_from_env() -> None:
    with pytest.raises(ConfigError, match="SWARMYARD_PLANE_URL"):
        AgentSettings.from_env({"SWARMYARD_TOKEN": "t"})
    settings = AgentSettings.from_env(
        {
            "SWARMYARD_PLANE_URL": "http://127.0.0.1:9",
            "SWARMYARD_TOKEN": "t",
            "SWARMYARD_ROLE": "lead",
            "SWARMYARD_MAX_STEPS": "3",
        }
    )
    assert (settings.role, settings.max_steps) == (Role.LEAD, 3)
    with pytest.raises(ConfigError):
        AgentSettings.from_env(
            {"SWARMYARD_PLANE_URL": "u", "SWARMYARD_TOKEN": "t", "SWARMYARD_MAX_STEPS": "x"}
        )


class LengthScorer:
    """A test evaluator: an artifact's score is its length in bytes."""

    async def score(self, goal: str, data: bytes, split: str, /) -> dict[str, Any]:
        return {"goal": goal, "split": split, "score": len(data)}


def test_a_finding_cites_the_agents_artifacts_and_carries_their_best_score(
        tmp_path: Path, live_plane: Callable[..., LivePlane]) -> None:
    plane = live_plane(LengthScorer())
    goal = plane.store.create_goal(GoalSpec(objective="sort", budget_micro_usd=1_000_000, call_cap=100))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    task = plane.store.create_task(goal.id, TaskSpec(title="sorter", prompt="write a sorter"))
    setup = Setup(plane, goal.id, task.id, token, me.worker_id)
    model = ScriptedChat([_action("submit_artifact", content="print(1)"),
                           _action("submit_artifact", content="print(sorted([3, 1]))"),
                           _action("submit_finding", title="sorter", body="The second attempt sorts.")])
    outcome = asyncio.run(_agent(tmp_path, model, setup).run())
    assert outcome.ending is Ending.SUBMITTED
    # the agent saw each score in its tool's result
    assert '"score": 8' in model.seen[1][-1]["content"] and '"score": 21' in model.seen[2][-1]["content"]
    [finding] = setup.findings_by(me.worker_id)
    shas = [a.sha256 for a in plane.store.list_artifacts(goal.id)]
    assert sorted(c.ref for c in finding.citations if c.kind is CitationKind.ARTIFACT) == sorted(shas)
    assert finding.score == 21
