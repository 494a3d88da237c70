"""What the embedded model reads of an agent CLI's request: a short tool listing, one leading system message
that every request of the CLI shares, and no per-request billing line (so a slot's cache can serve the start)."""

from __future__ import annotations

import json

from swarmyard.broker.chat import ChatRequest, Message, Role, Tool, ToolCall
from swarmyard.broker.providers.local import (
    CLI_TOOL_ROUNDS,
    FINAL_ANSWER,
    FULL_LISTING_CHARS,
    answer_schema,
    cli_tools,
    prompt_messages,
    tool_listing,
    tool_rounds,
    tool_schema,
)
from swarmyard.broker.providers.protocol import agent_cli

MANUAL = "Run a workflow. " + "It has many steps, each described at length here. " * 400
BIG = Tool("Workflow", MANUAL, {"type": "object", "properties": {
    "name": {"type": "string", "description": "which"}, "steps": {"type": "array", "items": {"type": "string"}},
    "mode": {"enum": ["a", "b"]}}, "required": ["name"]})
SMALL = Tool("lookup", "Look a word up.\nSecond line.", {"type": "object", "properties": {"word": {"type": "string"}}})


def _request(*messages: Message, tools: tuple[Tool, ...] = (BIG, SMALL)) -> ChatRequest:
    return ChatRequest("m", messages, tools=tools)


def test_a_short_listing_is_given_in_full() -> None:
    listing = tool_listing(_request(Message(Role.USER, "hi"), tools=(SMALL,)))
    assert listing == f"- lookup: {SMALL.description} arguments schema {json.dumps(SMALL.parameters)}"


def test_a_long_listing_keeps_names_arguments_and_first_sentences_and_the_schema_keeps_the_rest() -> None:
    request = _request(Message(Role.USER, "hi"))
    listing = tool_listing(request)
    assert listing.splitlines() == ["- Workflow(name: string, steps?: array, mode?: enum): Run a workflow.",
                                    "- lookup(word?: string): Look a word up."]
    assert len(listing) < FULL_LISTING_CHARS < len(MANUAL)
    # the answer is still held to each tool's whole argument schema
    branches = tool_schema(request)["anyOf"]
    assert branches[0]["properties"]["arguments"] == BIG.parameters


def test_claude_codes_billing_line_is_dropped_and_early_system_text_leads() -> None:
    billing = "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"
    messages = prompt_messages(_request(
        Message(Role.SYSTEM, billing + "You are a Claude agent."),
        Message(Role.USER, "Today is Tuesday. Say hi."),
        Message(Role.SYSTEM, "Agents you may start: none."),
        Message(Role.ASSISTANT, "hi"),
        Message(Role.SYSTEM, "A reminder after the answer stays in place."),
        Message(Role.USER, "again")), "TOOLS")
    assert [m.role for m in messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.USER]
    assert messages[0].content == "TOOLS\n\nYou are a Claude agent.\n\nAgents you may start: none."
    assert messages[3].content == "A reminder after the answer stays in place."


def test_two_requests_that_differ_only_in_billing_line_and_prompt_share_their_start() -> None:
    def start(version: str, prompt: str) -> str:
        return prompt_messages(_request(
            Message(Role.SYSTEM, f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=sdk-cli;Sys."),
            Message(Role.USER, prompt)), "TOOLS")[0].content

    assert start("2.1.197.123", "Say hi") == start("2.1.197.1c0", "Name three colours") == "TOOLS\n\nSys."


def _rounds(n: int) -> tuple[Message, ...]:
    out: list[Message] = []
    for i in range(n):
        out += [Message(Role.ASSISTANT, "", (ToolCall(f"c{i}", "lookup", "{}"),)),
                Message(Role.TOOL, "found", tool_call_id=f"c{i}"),
                Message(Role.USER, "<system-reminder>sent along with the result</system-reminder>")]
    return tuple(out)


def test_an_agent_cli_must_answer_after_its_rounds_of_tools_and_its_prompt_is_unchanged() -> None:
    start = (Message(Role.SYSTEM, "Sys."), Message(Role.USER, "Say hi."))
    before = _request(*start, *_rounds(CLI_TOOL_ROUNDS - 1))
    after = _request(*start, *_rounds(CLI_TOOL_ROUNDS))
    assert tool_rounds(before) == CLI_TOOL_ROUNDS - 1 and tool_rounds(after) == CLI_TOOL_ROUNDS
    assert answer_schema(before, "claude") == tool_schema(before)
    assert answer_schema(after, "claude") == {"anyOf": [FINAL_ANSWER]}
    assert prompt_messages(after, "T")[0] == prompt_messages(before, "T")[0]
    # the user speaking again starts the count again
    again = _request(*start, *_rounds(CLI_TOOL_ROUNDS), Message(Role.ASSISTANT, "hi"), Message(Role.USER, "More."))
    assert tool_rounds(again) == 0 and answer_schema(again, "claude") == tool_schema(again)


def test_the_cap_is_keyed_on_the_caller_not_on_the_listing() -> None:
    # the built-in agent (no CLI) keeps its tools however many rounds, with a short listing or a long one
    for tools in ((SMALL,), (Tool("manual", MANUAL, {"type": "object", "properties": {}}),)):
        request = _request(Message(Role.USER, "Work."), *_rounds(CLI_TOOL_ROUNDS + 5), tools=tools)
        assert answer_schema(request) == tool_schema(request)
        # an agent CLI with the same request must answer, whatever the size of its listing
        assert answer_schema(request, "codex") == {"anyOf": [FINAL_ANSWER]}


def test_the_agent_cli_is_read_from_the_user_agent() -> None:
    assert agent_cli("claude-cli/2.1.197 (external, cli)") == "claude"
    assert agent_cli("codex_cli_rs/0.171.0 (Debian 12; x86_64) xterm") == "codex"
    assert agent_cli("opencode/1.18.33") == "opencode"
    for other in ("python-httpx/0.28.1", "OpenAI/Python 1.99.0", "", "claude", "curl/8.0 claude-cli/1"):
        assert agent_cli(other) == ""


def test_an_agent_cli_is_not_offered_a_sub_agent() -> None:
    agent = Tool("Agent", "Start a sub-agent.", {"type": "object", "properties": {"prompt": {"type": "string"}}})
    request = _request(Message(Role.USER, "Work."), tools=(BIG, agent, SMALL))
    assert [t.name for t in cli_tools(request, "claude").tools] == ["Workflow", "lookup"]
    assert "Agent" not in tool_listing(cli_tools(request, "claude"))
    # any other caller keeps every tool it sent
    assert cli_tools(request, "") == request and cli_tools(request, "codex") == request
