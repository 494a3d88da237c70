"""The built-in agent's loop, parsing, re-asks, step cap and its own machine's tools.

The control plane here is an ``httpx.MockTransport`` that records requests and answers like the worker tools;
the model is a scripted ``ChatModel`` (a paid external service in real runs).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarmyard.agents.actions import TOOLS, action_schema, parse_reply, parse_tool_call, response_format
from swarmyard.agents.builtin import AgentSettings, BuiltinAgent, Ending, Role
from swarmyard.agents.model import BrokerChatModel, ModelReply, OutputMode
from swarmyard.agents.tools import LocalTools, PlaneTools
from swarmyard.errors import BudgetError, ConfigError, InvalidInputError, ProviderError


class ScriptedModel:
    """Replies from a list; a ``BudgetError`` in the list is raised."""

    def __init__(self, replies: list[ModelReply | str | Exception]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []
        self.only: list[frozenset[str] | None] = []

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None) -> ModelReply:
        self.seen.append(list(messages))
        self.only.append(only)
        item = self.replies.pop(0) if self.replies else "not json at all"
        if isinstance(item, Exception):
            raise item
        return item if isinstance(item, ModelReply) else ModelReply(item)


class FakePlane:
    """Records tool calls and answers in the worker tools' shapes."""

    def __init__(self, *, claimable: bool = True, findings: list[dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.claimable = claimable
        self.findings = findings or []

    def handler(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        body = json.loads(request.content or b"{}")
        assert request.headers["authorization"] == "Bearer sy1.test"
        self.calls.append((name, body))
        if name == "claim_task":
            if not self.claimable:
                return httpx.Response(200, json={"task": None})
            return httpx.Response(
                200,
                json={
                    "task": {"id": "task_1", "title": "risks", "prompt": "list risks", "group": "main"},
                    "fencing_token": 7,
                },
            )
        if name == "board_read":
            return httpx.Response(
                200, json={"posts": [{"seq": 3, "author": "wrk_b", "body": "checked licences"}]}
            )
        if name == "read_findings":
            return httpx.Response(200, json={"findings": self.findings})
        if name == "submit_finding":
            return httpx.Response(200, json={"finding": {"id": "fnd_new"}})
        return httpx.Response(200, json={"seq": 4})


def _agent(tmp_path: Path, model: ScriptedModel, plane: FakePlane, **overrides: Any) -> BuiltinAgent:
    settings = AgentSettings(
        plane_url="http://plane", token="sy1.test", model="m", workdir=tmp_path, **overrides
    )
    client = httpx.AsyncClient(
        base_url="http://plane",
        transport=httpx.MockTransport(plane.handler),
        headers={"Authorization": "Bearer sy1.test"},
    )
    return BuiltinAgent(model, PlaneTools(client), LocalTools(tmp_path, exec_timeout_s=5), settings)


def _action(tool: str, **args: Any) -> str:
    return json.dumps({"action": {"tool": tool, "args": args}})


def test_parse_reply_shapes() -> None:
    assert parse_reply(_action("board_post", body="hi")).args == {"body": "hi"}
    assert parse_reply('```json\n{"tool": "board_read", "args": {}}\n```').tool == "board_read"
    assert parse_reply('Sure! {"name": "shell", "arguments": {"command": "ls"}}').args == {"command": "ls"}
    assert parse_reply('{"tool": "shell", "args": "{\\"command\\": \\"ls\\"}"}').args == {"command": "ls"}
    assert parse_tool_call("read_file", '{"path": "a.txt", "junk": 1}').args == {"path": "a.txt"}


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
    ],
)
def test_parse_reply_refuses_malformed(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_reply(text)


def test_action_schema_has_one_branch_per_tool() -> None:
    schema = action_schema()
    assert schema["type"] == "object"
    branches = schema["properties"]["action"]["anyOf"]
    assert [b["properties"]["tool"]["const"] for b in branches] == list(TOOLS)
    assert response_format()["json_schema"]["schema"] == schema


def test_loop_survives_malformed_output_and_submits(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            "garbage",
            '{"tool": "nope"}',
            _action("board_post", body="looking at licences"),
            ModelReply(
                "",
                (
                    (
                        "submit_finding",
                        json.dumps({"title": "Risks", "body": "Three risks.", "cite": ["3", "fnd_unknown"]}),
                    ),
                ),
            ),
        ]
    )
    plane = FakePlane()
    outcome = asyncio.run(_agent(tmp_path, model, plane).run())
    assert outcome.ending is Ending.SUBMITTED
    assert (outcome.task_id, outcome.finding_id, outcome.malformed, outcome.steps) == (
        "task_1",
        "fnd_new",
        2,
        2,
    )
    names = [name for name, _ in plane.calls]
    assert names == ["claim_task", "board_read", "board_post", "submit_finding"]
    post, submit = plane.calls[2][1], plane.calls[3][1]
    assert (post["task_id"], post["fencing_token"], post["body"]) == ("task_1", 7, "looking at licences")
    assert submit["citations"] == [{"kind": "post", "ref": "3"}]  # the unknown id is dropped, not sent
    assert "checked licences" in model.seen[0][1]["content"]  # the board was in the brief


def test_reasks_are_bounded_and_the_step_cap_still_submits(tmp_path: Path) -> None:
    model = ScriptedModel([])
    plane = FakePlane()
    outcome = asyncio.run(_agent(tmp_path, model, plane, max_steps=3, max_reasks=2).run())
    assert outcome.ending is Ending.STEP_CAP
    assert len(model.seen) == 3 * 3
    assert plane.calls[-1][0] == "submit_finding"
    assert plane.calls[-1][1]["title"] == "risks (partial)"


def test_the_last_step_may_only_submit(tmp_path: Path) -> None:
    submit = ModelReply("", (("submit_finding", json.dumps({"title": "Risks", "body": "Licences, cost."})),))
    model = ScriptedModel([_action("board_post", body="a"), _action("board_post", body="b"), submit])
    plane = FakePlane()
    outcome = asyncio.run(_agent(tmp_path, model, plane, max_steps=3).run())
    assert outcome.ending is Ending.SUBMITTED and outcome.steps == 3
    assert model.only == [None, None, frozenset({"submit_finding"})]
    assert "last step" in model.seen[-1][-1]["content"]
    assert plane.calls[-1][1]["body"] == "Licences, cost."


def test_budget_refusal_ends_with_a_partial_finding(tmp_path: Path) -> None:
    model = ScriptedModel([_action("board_read"), BudgetError("no money left")])
    plane = FakePlane()
    outcome = asyncio.run(_agent(tmp_path, model, plane).run())
    assert outcome.ending is Ending.BUDGET
    assert [n for n, _ in plane.calls].count("submit_finding") == 1


def test_no_task_means_no_model_call(tmp_path: Path) -> None:
    model = ScriptedModel([])
    outcome = asyncio.run(_agent(tmp_path, model, FakePlane(claimable=False)).run())
    assert outcome.ending is Ending.NO_TASK
    assert model.seen == []


def test_lead_reads_findings_and_cites_them_all_when_the_model_forgets(tmp_path: Path) -> None:
    findings = [
        {"id": "fnd_a", "title": "market", "body": "big"},
        {"id": "fnd_b", "title": "risks", "body": "some"},
    ]
    model = ScriptedModel([_action("submit_finding", title="Go", body="Go, because market is big.")])
    plane = FakePlane(findings=findings)
    outcome = asyncio.run(_agent(tmp_path, model, plane, role=Role.LEAD).run())
    assert outcome.ending is Ending.SUBMITTED
    assert "[fnd_a] market" in model.seen[0][1]["content"]
    assert plane.calls[-1][1]["citations"] == [
        {"kind": "finding", "ref": "fnd_a"},
        {"kind": "finding", "ref": "fnd_b"},
    ]


def test_a_lead_citing_one_finding_twice_cites_each_finding_once(tmp_path: Path) -> None:
    findings = [{"id": "fnd_a", "title": "market", "body": "big"}, {"id": "fnd_b", "title": "risk", "body": "x"}]
    model = ScriptedModel([_action("submit_finding", title="Go", body="Go.", cite=["fnd_b", "fnd_b"])])
    plane = FakePlane(findings=findings)
    asyncio.run(_agent(tmp_path, model, plane, role=Role.LEAD).run())
    assert plane.calls[-1][1]["citations"] == [
        {"kind": "finding", "ref": "fnd_b"},
        {"kind": "finding", "ref": "fnd_a"},
    ]


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


def _chat_response(message: dict[str, Any]) -> httpx.Response:
    return httpx.Response(
        200, json={"choices": [{"message": message}], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}
    )


def test_broker_model_asks_for_tools_or_a_schema() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return _chat_response(
            {
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "board_read", "arguments": "{}"}}
                ],
            }
        )

    async def go(mode: OutputMode) -> ModelReply:
        async with httpx.AsyncClient(base_url="http://b", transport=httpx.MockTransport(handler)) as client:
            model = BrokerChatModel(client, "m", mode=mode)
            reply = await model.reply([{"role": "user", "content": "hi"}])
            assert (model.usage.calls, model.usage.input_tokens) == (1, 11)
            return reply

    assert asyncio.run(go(OutputMode.TOOLS)).tool_calls == (("board_read", "{}"),)
    asyncio.run(go(OutputMode.JSON_SCHEMA))
    assert bodies[0]["tool_choice"] == "required" and len(bodies[0]["tools"]) == len(TOOLS)
    assert "tools" not in bodies[1] and bodies[1]["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize(("status", "error"), [(402, BudgetError), (429, BudgetError), (500, ProviderError)])
def test_broker_model_types_refusals(status: int, error: type[Exception]) -> None:
    async def go() -> None:
        transport = httpx.MockTransport(lambda r: httpx.Response(status, json={"error": {"message": "no"}}))
        async with httpx.AsyncClient(base_url="http://b", transport=transport) as client:
            await BrokerChatModel(client, "m").reply([])

    with pytest.raises(error):
        asyncio.run(go())


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
