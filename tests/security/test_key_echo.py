"""A provider key never reaches a worker, whatever encoding an upstream echoes it in.

``swarmyard serve`` (the console script) routes models to a loopback fake of a paid provider, which refuses
every call with an error body that quotes the key it was sent: plainly, JSON-escaped (short escapes and
``\\u`` escapes), URL-encoded, hex, and base64 (standard and URL-safe) at each of the three alignments, inside a
larger encoded blob. The worker's answer, plain or streamed, in the OpenAI and the Anthropic formats, must hold
no piece of any of those forms: an error reaches it as a fixed message (the provider, the status and the
upstream's error type); the broker's own log keeps the text, scrubbed.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from serving import Served, child_env, served_with_claim

from rigs.network import http_server

# quote, backslash, slash, plus, space and equals: each encoding below writes this key differently
KEY = 'sk-echo/Key+with"quote\\and space=0123456789abcdefXYZ'


def _b64(prefix: bytes, alphabet: Callable[[bytes], bytes]) -> str:
    return alphabet(prefix + KEY.encode() + b":tail").decode()


#: model name -> how its upstream echoes the key
FORMS: dict[str, str] = {
    "echo-plain": KEY,
    "echo-json": json.dumps(KEY)[1:-1],
    "echo-json-slash": json.dumps(KEY)[1:-1].replace("/", "\\/"),
    "echo-json-unicode": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "echo-json-twice": json.dumps(json.dumps(KEY))[1:-1],
    "echo-url": urllib.parse.quote(KEY, safe=""),
    "echo-url-plus": urllib.parse.quote_plus(KEY),
    "echo-hex": KEY.encode().hex(),
    "echo-hex-upper": KEY.encode().hex().upper(),
    **{f"echo-b64-{n}": _b64(b"x" * n, base64.b64encode) for n in range(3)},
    **{f"echo-b64url-{n}": _b64(b"x" * n, base64.urlsafe_b64encode) for n in range(3)},
    **{f"echo-b64-bearer-{n}": _b64(b"Bearer "[:5 + n], base64.b64encode) for n in range(3)},
}


class _Upstream(BaseHTTPRequestHandler):
    """Refuses every call, quoting the key from the request's own header in the encoding its model asks for."""

    seen_keys: ClassVar[list[str]] = []

    # keep-alive, as a provider is: the broker reuses its upstream connections (an HTTP/1.0 server closing each
    # one after its answer races the next request onto it, which is a lost answer)
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        sent = self.headers.get("authorization", "").removeprefix("Bearer ") or self.headers.get("x-api-key", "")
        self.seen_keys.append(sent)
        echoed = FORMS[request["model"].removeprefix("an-")] if sent == KEY else "no key"
        if request.get("stream") and self.path.endswith("/messages"):
            # an Anthropic stream that starts, then fails with an error event quoting the key
            events = [("message_start", {"type": "message_start", "message": {
                          "id": "m1", "type": "message", "role": "assistant", "model": request["model"],
                          "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}}),
                      ("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}),
                      ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": "partial"}}),
                      ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                            "message": f"bad key {echoed}"}})]
            data = "".join(f"event: {name}\ndata: {json.dumps(body)}\n\n" for name, body in events).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
        else:
            data = json.dumps({"error": {"message": f"Incorrect API key provided: {echoed}",
                                         "type": "invalid_request_error"}}).encode()
            # A JSON body holding the form as JSON text would escape it once more: send it as written
            data = data.replace(json.dumps(echoed)[1:-1].encode(), echoed.encode())
            self.send_response(401)
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with http_server(_Upstream) as url:
        yield url


@pytest.fixture(scope="module")
def served(upstream: str) -> Iterator[Served]:
    folder = Path(tempfile.mkdtemp(prefix="sy-keys-"))
    names = {"oa": list(FORMS), "an": [f"an-{m}" for m in FORMS]}
    tables = {"oa": f'kind = "openai_compatible"\nbase_url = "{upstream}/v1"',
              "an": f'kind = "anthropic"\nbase_url = "{upstream}"'}  # the Anthropic provider's own error path
    text = ""
    for provider, models in names.items():
        text += (f"[providers.{provider}]\n{tables[provider]}\napi_key_env = \"ECHO_KEY\"\n"
                 f"models = {json.dumps(models)}\n")
        text += "".join(f'[providers.{provider}.prices."{m}"]\ninput_usd_per_mtok = "1"\n'
                        f'output_usd_per_mtok = "1"\n' for m in models)
    (folder / "providers.toml").write_text(text)
    try:
        with served_with_claim("--providers", str(folder / "providers.toml"),
                               env={**child_env(), "ECHO_KEY": KEY}, budget_micro_usd=100_000_000) as running:
            yield running
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def pieces(form: str, size: int = 12) -> list[str]:
    """Every run of ``size`` characters of ``form``: none of them may reach the worker."""
    return [form[i:i + size] for i in range(len(form) - size + 1)]


def assert_no_key(text: str, where: str) -> None:
    for name, form in FORMS.items():
        leaked = [piece for piece in pieces(form) if piece in text]
        assert not leaked, f"{where}: a piece of the key ({name}) reached the worker: {leaked[0]!r} in {text!r}"


@pytest.mark.parametrize("model", sorted(FORMS))
def test_an_echoed_key_in_any_encoding_never_reaches_the_worker(served: Served, model: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"model": model, "max_tokens": 8, "messages": messages}),
        ("/v1/chat/completions", {"model": model, "max_tokens": 8, "messages": messages, "stream": True}),
        ("/v1/responses", {"model": model, "max_output_tokens": 8, "input": "hi"}),
        ("/v1/messages", {"model": model, "max_tokens": 8, "messages": messages}),
        ("/v1/messages", {"model": f"an-{model}", "max_tokens": 8, "messages": messages}),
        ("/v1/messages", {"model": f"an-{model}", "max_tokens": 8, "messages": messages, "stream": True}),
    ]
    before = len(_Upstream.seen_keys)
    with served.client(served.worker) as worker:
        for path, request in calls:
            answer = worker.post(path, json=request)
            where = f"{path} {request['model']}{' stream' if request.get('stream') else ''}"
            if request.get("stream") and request["model"].startswith("an-"):
                # the failure came mid-stream: the answer is a stream whose last event is the error
                assert answer.status_code == 200 and "event: error" in answer.text, answer.text
                assert "partial" in answer.text
            else:
                assert answer.status_code == 502, f"{where}: {answer.status_code} {answer.text}"
                assert answer.json()["error"]["code"] == "provider_error"
                # a fixed message: the upstream's status and its error type (when its body parses), never its text
                message = answer.json()["error"]["message"].split(": ", 1)[1]
                assert message in ("upstream answered 401", "upstream answered 401 (invalid_request_error)"), \
                    f"{where}: {message}"
            assert_no_key(answer.text, where)
    # the key did go upstream, each time: what came back held it, and only scrubbing kept it from the worker
    assert _Upstream.seen_keys[before:] == [KEY] * len(calls)
