"""A provider key never reaches a worker through a successful answer either.

``swarmyard serve`` routes models to a loopback fake of a paid provider (OpenAI-compatible and Anthropic) that
answers 200 and quotes the key it was sent: in the text, in a tool call's id and arguments, in reasoning, as
base64, and, streamed, split across two events (text and tool arguments both). Whatever the worker asks
through (chat completions, responses, messages; whole or streamed), it sees the answer with ``***`` where the
key stood and no piece of any form of it. An upstream error reaches it as a fixed message whose error type is
dropped when it holds a piece of the key.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest
from serving import Served, child_env, served_with_claim
from test_key_echo import KEY, assert_no_key

from rigs.folders import short_folder
from rigs.network import http_server

_SPLIT = 23  # where a streamed key is cut in two


def _said(model: str) -> str:
    """What the upstream's text says for ``model``."""
    return f"key is {base64.b64encode(b'ab' + KEY.encode()).decode()} ok" if "b64" in model else f"key is {KEY} ok"


def _openai_answer(model: str) -> dict[str, Any]:
    call = {"id": f"call_{KEY}", "type": "function",
            "function": {"name": "look", "arguments": json.dumps({"key": KEY})}}
    return {"id": f"chatcmpl-{KEY}", "object": "chat.completion", "model": KEY,
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
            "choices": [{"index": 0, "finish_reason": "tool_calls" if "tool" in model else "stop",
                         "message": {"role": "assistant", "content": _said(model), "reasoning_content": KEY,
                                     "tool_calls": [call] if "tool" in model else None}}]}


def _openai_stream(model: str) -> list[str]:
    text, args = _said(model), json.dumps({"key": KEY})
    cut, args_cut = text.index(KEY[0]) + _SPLIT, args.index(KEY[0]) + _SPLIT
    deltas: list[dict[str, Any]] = [{"content": text[:cut]}, {"content": text[cut:]}]
    if "tool" in model:
        deltas += [{"tool_calls": [{"index": 0, "id": f"call_{KEY}", "type": "function",
                                    "function": {"name": "look", "arguments": args[:args_cut]}}]},
                   {"tool_calls": [{"index": 0, "function": {"arguments": args[args_cut:]}}]}]
    chunks = [{"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
    return [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]


def _anthropic_answer(model: str) -> dict[str, Any]:
    return {"id": f"msg_{KEY}", "type": "message", "role": "assistant", "model": model, "stop_reason": "tool_use",
            "content": [{"type": "thinking", "thinking": KEY}, {"type": "text", "text": _said(model)},
                        {"type": "tool_use", "id": f"toolu_{KEY}", "name": "look", "input": {"key": KEY}}],
            "usage": {"input_tokens": 3, "output_tokens": 5}}


def _anthropic_stream(model: str) -> list[str]:
    text, args = _said(model), json.dumps({"key": KEY})
    cut, args_cut = text.index(KEY[0]) + _SPLIT, args.index(KEY[0]) + _SPLIT
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {
            "id": f"msg_{KEY}", "type": "message", "role": "assistant", "model": model, "content": [],
            "usage": {"input_tokens": 3, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": piece}})
          for piece in (text[:cut], text[cut:])],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": f"toolu_{KEY}", "name": "look", "input": {}}}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 1,
                                   "delta": {"type": "input_json_delta", "partial_json": piece}})
          for piece in (args[:args_cut], args[args_cut:])],
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                           "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(body)}\n\n" for name, body in events]


#: model -> the error type its upstream refuses with (each holds a piece of the key, or is a safe token)
ERRORS = {"refuse-piece": "sk-echo", "refuse-hex": KEY.encode().hex()[:24], "refuse-safe": "rate_limit_error"}


class _Upstream(BaseHTTPRequestHandler):
    """Answers 200 quoting the key it was sent; streams as HTTP chunks, one per event."""

    seen_keys: ClassVar[list[str]] = []
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        sent = self.headers.get("authorization", "").removeprefix("Bearer ") or self.headers.get("x-api-key", "")
        self.seen_keys.append(sent)
        model, anthropic = request["model"], self.path.endswith("/messages")
        if (refusal := model.split("-", 1)[1]) in ERRORS:
            self._whole(429, {"error": {"type": ERRORS[refusal], "message": f"no: {KEY[:20]}",
                                        "param": KEY[20:]}})
        elif request.get("stream"):
            events = _anthropic_stream(model) if anthropic else _openai_stream(model)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for event in events:
                data = event.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._whole(200, _anthropic_answer(model) if anthropic else _openai_answer(model))

    def _whole(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


MODELS = ["say", "say-b64", "say-tool", *ERRORS]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with http_server(_Upstream) as upstream, short_folder("sy-answers-") as folder:
        text = ""
        for provider, table in {"oa": f'kind = "openai_compatible"\nbase_url = "{upstream}/v1"',
                                "an": f'kind = "anthropic"\nbase_url = "{upstream}"'}.items():
            models = [f"{provider}-{m}" for m in MODELS]
            text += (f'[providers.{provider}]\n{table}\napi_key_env = "ECHO_KEY"\n'
                     f'models = {json.dumps(models)}\n')
            text += "".join(f'[providers.{provider}.prices."{m}"]\ninput_usd_per_mtok = "1"\n'
                            f'output_usd_per_mtok = "1"\n' for m in models)
        (folder / "providers.toml").write_text(text)
        with served_with_claim("--providers", str(folder / "providers.toml"),
                               env={**child_env(), "ECHO_KEY": KEY}, budget_micro_usd=100_000_000) as running:
            yield running


def _calls(model: str) -> list[tuple[str, dict[str, Any]]]:
    messages = [{"role": "user", "content": "hi"}]
    return [(path, {"model": model, **limit, **body, **stream})
            for path, limit, body in [("/v1/chat/completions", {"max_tokens": 64}, {"messages": messages}),
                                      ("/v1/responses", {"max_output_tokens": 64}, {"input": "hi"}),
                                      ("/v1/messages", {"max_tokens": 64}, {"messages": messages})]
            for stream in ({}, {"stream": True})]


@pytest.mark.parametrize("model", [f"{p}-{m}" for p in ("oa", "an") for m in ("say", "say-b64", "say-tool")])
def test_a_key_quoted_in_a_whole_or_streamed_answer_never_reaches_the_worker(served: Served, model: str) -> None:
    before = len(_Upstream.seen_keys)
    calls = _calls(model)
    with served.client(served.worker) as worker:
        for path, request in calls:
            where = f"{path} {model}{' stream' if request.get('stream') else ''}"
            answer = worker.post(path, json=request)
            assert answer.status_code == 200, f"{where}: {answer.status_code} {answer.text}"
            assert "provider_error" not in answer.text and "upstream_" not in answer.text, f"{where}: {answer.text}"
            assert_no_key(answer.text, where)
            # scrubbed where the key stood, the rest of the answer intact
            assert "key is " in answer.text and "***" in answer.text and " ok" in answer.text, \
                f"{where}: {answer.text}"
    assert _Upstream.seen_keys[before:] == [KEY] * len(calls)


@pytest.mark.parametrize("model", [f"{p}-{m}" for p in ("oa", "an") for m in ERRORS])
def test_an_error_reaches_the_worker_as_a_fixed_message(served: Served, model: str) -> None:
    safe = ERRORS[model.split("-", 1)[1]] == "rate_limit_error"
    with served.client(served.worker) as worker:
        for path, request in _calls(model):
            answer = worker.post(path, json=request)
            where = f"{path} {model}"
            assert answer.status_code == 502, f"{where}: {answer.status_code} {answer.text}"
            message = answer.json()["error"]["message"]
            expected = "upstream answered 429" + (" (rate_limit_error)" if safe else "")
            assert message == f"{model.split('-')[0]}: {expected}", f"{where}: {message}"
            assert "sk-echo" not in answer.text and KEY.encode().hex()[:12] not in answer.text
            assert_no_key(answer.text, where)
