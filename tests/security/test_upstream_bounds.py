"""A hostile upstream cannot make ``swarmyard serve`` buffer without limit or stall.

A loopback fake of a paid provider sends bodies far past what the broker reads: a 100 MiB error body, a chunk
claiming 200 MiB, 100 MiB of 1 MiB chunks, 100 MiB framed by its length or by the connection's close, an absurd chunk size, a
stream of 100 MiB of events and a stream line with no end. Each call is a typed 502 (an error status releases
the hold; an answer whose bytes left is ``unknown``, never released), the broker stops reading (the upstream
sees its connection dropped before it wrote everything), ``/healthz`` answers while the upstream is sending, and
the serving process's peak RSS grows by far less than what was sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from serving import Served, child_env, served_with_claim

from rigs.folders import short_folder
from rigs.network import http_server

MIB = 1 << 20
_BLOCK = b"x" * MIB
# an event that parses and carries nothing for the worker (padding): what the broker buffers is its own
_EVENT = b'data: {"choices":[{"index":0,"delta":{}}],"pad":"' + b"y" * (MIB - 64) + b'"}\n\n'


class _Upstream(BaseHTTPRequestHandler):
    """Sends its first MiB, says so, waits for the test's go, then tries to send the rest."""

    protocol_version = "HTTP/1.1"
    started: ClassVar[threading.Event] = threading.Event()
    go: ClassVar[threading.Event] = threading.Event()
    #: model -> whether the upstream managed to write its whole body
    wrote_all: ClassVar[dict[str, bool]] = {}

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        model = json.loads(self.rfile.read(int(self.headers["content-length"])))["model"]
        head, blocks = self._plan(model)
        self.close_connection = True
        try:
            self.wfile.write(head)
            for i, block in enumerate(blocks):
                self.wfile.write(block)
                if i == 0:
                    self.wfile.flush()
                    self.started.set()
                    assert self.go.wait(60)
            self.wfile.flush()
            self.wrote_all[model] = True
        except OSError:  # the broker dropped the connection: what it did not read, it never buffered
            self.wrote_all[model] = False
            self.started.set()

    @staticmethod
    def _plan(model: str) -> tuple[bytes, Iterator[bytes]]:
        def repeat(block: bytes, count: int) -> Iterator[bytes]:
            return (block for _ in range(count))

        def chunked(block: bytes, count: int) -> Iterator[bytes]:
            return (b"%x\r\n%s\r\n" % (len(block), block) for _ in range(count))

        name = model.removeprefix("stream-")
        if name == "big-error":
            return b"HTTP/1.1 500 Oops\r\ncontent-length: %d\r\n\r\n" % (100 * MIB), repeat(_BLOCK, 100)
        if name == "huge-chunk":
            return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n" % (200 * MIB),
                    repeat(_BLOCK, 200))
        if name == "many-chunks":
            return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", chunked(_BLOCK, 100)
        if name == "by-length":
            return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (100 * MIB), repeat(_BLOCK, 100)
        if name == "by-close":
            return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n", repeat(_BLOCK, 100)
        if name == "absurd-chunk":
            return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n",
                    repeat(_BLOCK, 100))
        if name == "events":  # whole events, 1 MiB each, past the cap on a whole stream
            return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", chunked(_EVENT, 100)
        assert name == "endless-line", model
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ", repeat(_BLOCK, 100)


#: model -> (stream, the hold's state after the call)
CASES = {"big-error": (False, "released"), "stream-big-error": (True, "released"),
         "huge-chunk": (False, "unknown"), "many-chunks": (False, "unknown"), "by-length": (False, "unknown"),
         "by-close": (False, "unknown"),
         "absurd-chunk": (False, "unknown"), "stream-events": (True, "unknown"),
         "stream-endless-line": (True, "unknown")}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with http_server(_Upstream) as upstream, short_folder("sy-bounds-") as folder:
        (folder / "providers.toml").write_text(
            f'[providers.big]\nkind = "openai_compatible"\nbase_url = "{upstream}/v1"'
            f'\napi_key_env = "BIG_KEY"\nmodels = {json.dumps(list(CASES))}\n'
            + "".join(f'[providers.big.prices."{m}"]\ninput_usd_per_mtok = "1"\noutput_usd_per_mtok = "1"\n'
                      for m in CASES))
        with served_with_claim("--providers", str(folder / "providers.toml"),
                               env={**child_env(), "BIG_KEY": "sk-bounds-0123456789abcdef"},
                               budget_micro_usd=100_000_000) as running:
            yield running


def _peak_rss_bytes(served: Served) -> int:
    status = Path(f"/proc/{served.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def _ask(served: Served, model: str, answers: dict[str, httpx.Response]) -> None:
    stream = CASES[model][0]
    with served.client(served.worker) as worker:
        answers[model] = worker.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})


def test_a_hostile_body_is_read_bounded_and_the_broker_keeps_answering(served: Served) -> None:
    before = _peak_rss_bytes(served)
    answers: dict[str, httpx.Response] = {}
    with served.client() as plain:
        for model in CASES:
            _Upstream.started.clear()
            _Upstream.go.clear()
            call = threading.Thread(target=_ask, args=(served, model, answers))
            call.start()
            try:
                assert _Upstream.started.wait(60), model
                # the upstream is mid-body: the same serve answers its health check
                assert plain.get("/healthz").status_code == 200, model
            finally:
                _Upstream.go.set()
            call.join(120)
            assert not call.is_alive(), model
            assert plain.get("/healthz").status_code == 200, model
    grown = _peak_rss_bytes(served) - before
    # 100-200 MiB sent per call, 1 GiB in all; what the broker may keep is one capped answer (32 MiB)
    assert grown < 100 * MIB, f"serve's peak RSS grew by {grown / MIB:.0f} MiB"
    for model, (stream, held) in CASES.items():
        answer = answers[model]
        code = "provider_error" if held == "released" else "upstream_unknown"
        if answer.status_code == 200:  # a stream that had begun: its last event carries the error
            assert stream and code in answer.text.splitlines()[-2], (model, answer.text[-300:])
        else:
            assert answer.status_code == 502 and answer.json()["error"]["code"] == code, (model, answer.text)
        if held == "released":
            assert answer.json()["error"]["message"] == "big: upstream answered 500", answer.text
        # the broker stopped reading: the upstream could not write the rest
        assert _Upstream.wrote_all[model] is False, model
    with served.client(served.operator) as op:
        reservations = op.get(f"/v1/operator/goals/{served.goal_id}/reservations").json()["reservations"]
    assert {r["model"]: r["state"] for r in reservations} == {m: held for m, (_, held) in CASES.items()}
