"""A model provider on loopback, written on the bare socket so that a test decides, call by call, whether a request
that arrived whole is answered or dropped (a reset, as a network loses an answer), and when (a behaviour may wait
for the test before it answers). A request with ``stream`` gets its answer as SSE chunks."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

#: What a behaviour returns for a request: a status line and a JSON body, or ``None`` to drop the call unanswered.
Answer = tuple[bytes, dict[str, Any]] | None


def completion_calling(model: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat completion whose one choice calls ``tool`` with ``arguments`` (usage: 100 in, 20 out)."""
    return {"id": "chatcmpl-lead", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "call_lead", "type": "function",
                                "function": {"name": tool, "arguments": json.dumps(arguments)}}]}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


def streamed(completion: dict[str, Any]) -> bytes:
    """A chat completion as the SSE chunks of a streamed one: its message's text, its finish, its usage."""
    base = {k: completion[k] for k in ("id", "model", "created")} | {"object": "chat.completion.chunk"}
    choice = completion["choices"][0]
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                          "content": choice["message"].get("content") or ""},
                                    "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
              {**base, "choices": [], "usage": completion["usage"]}]
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def completion_saying(model: str, text: str) -> dict[str, Any]:
    """An OpenAI chat completion whose one choice says ``text`` (usage: 100 in, 20 out)."""
    return {"id": "chatcmpl-say", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


class RawUpstream:
    """Reads each request whole, counts it by model in ``posts``, and answers what ``behaviour`` says.

    OpenAI-compatible as far as a swarm's broker needs (``base_url = http://127.0.0.1:{port}/v1``); connections
    are kept alive, each on a thread of its own, until ``close``.
    """

    def __init__(self, behaviour: Callable[[dict[str, Any]], Answer]) -> None:
        self.posts: Counter[str] = Counter()
        self._behaviour = behaviour
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:  # the socket closes only when its file is closed too
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = json.loads(reader.read(length))
                self.posts[body["model"]] += 1
                answer = self._behaviour(body)
                if answer is None:
                    # the request arrived whole; the answer never will (RST, not a clean close)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                status, payload = answer
                if body.get("stream") and status.startswith(b"200"):
                    data = streamed(payload)
                    conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-type: text/event-stream\r\n"
                                 b"content-length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                    continue
                data = json.dumps(payload).encode()
                conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(data)).encode() + b"\r\n\r\n" + data)

    def close(self) -> None:
        """Stop accepting connections (those open end with the test process; their threads are daemons)."""
        self._listener.close()
