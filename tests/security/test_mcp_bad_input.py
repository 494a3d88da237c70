"""Bad tool calls through the real ``swarmyard mcp`` (stdio, JSON-RPC lines) relaying to the real ``swarmyard serve``.

Arguments nested too deep or of the wrong type come back as tool results with ``isError`` and the plane's typed
error; a message the JSON-RPC parser itself cannot read (nested 1,000 deep, a lone surrogate, cut short) gets a
JSON-RPC parse error, and the server goes on answering. Nothing of any refused call reaches the store.
"""

from __future__ import annotations

import json
import selectors
import subprocess
from collections.abc import Iterator
from typing import IO, Any

import pytest
from serving import SWARMYARD, Served, served_with_claim
from test_bad_input import snapshot


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_with_claim() as running:
        yield running


class Mcp:
    """``swarmyard mcp`` as a worker's agent starts it, spoken to in raw JSON-RPC lines."""

    def __init__(self, served: Served) -> None:
        self.proc = subprocess.Popen(
            [str(SWARMYARD), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "SWARMYARD_TOKEN": served.worker,
                 "SWARMYARD_PLANE_SOCKET": str(served.folder / "plane.sock"), "SWARMYARD_TASK_ID": served.task_id,
                 "SWARMYARD_FENCING_TOKEN": str(served.fencing_token)})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)

    def send(self, raw: bytes) -> None:
        self._in.write(raw + b"\n")
        self._in.flush()

    def answer(self, timeout_s: float = 60.0) -> dict[str, Any] | None:
        """The next message from the server, or None if none came within ``timeout_s`` (a hang, not a race)."""
        if not self._selector.select(timeout=timeout_s):
            return None
        line = self._out.readline()
        return json.loads(line) if line else None

    def call(self, call_id: int, name: str, arguments: bytes) -> None:
        self.send(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
                  % (call_id, name.encode(), arguments))

    def close(self) -> int:
        self._in.close()
        return self.proc.wait(timeout=30)


def error_of(answer: dict[str, Any] | None) -> str:
    assert answer is not None and answer["result"]["isError"] is True, answer
    return str(json.loads(answer["result"]["content"][0]["text"])["error"]["code"])


def test_bad_tool_calls_through_mcp_are_typed_errors_and_change_nothing(served: Served) -> None:
    before = snapshot(served.store)
    mcp = Mcp(served)
    mcp.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}).encode())
    assert mcp.answer() is not None
    mcp.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    # deep enough for the plane's limit, not for the MCP library's own: the plane's typed refusal comes back
    mcp.call(2, "board_post", b'{"body": "x", "extra": ' + b'{"a":' * 100 + b"{}" + b"}" * 100 + b"}")
    assert error_of(mcp.answer()) == "nesting_too_deep"
    for call_id, arguments in enumerate([b'{"body": "x", "fencing_token": "1"}', b'{"body": "x", "fencing_token": true}',
                                         b'{"body": "x", "fencing_token": 1.0}', b'{"body": "a\\u0000b"}'],
                                        start=3):
        mcp.call(call_id, "board_post", arguments)
        assert error_of(mcp.answer()) == "invalid_input", arguments
    mcp.call(9, "delegate", b'{"title": "sub", "budget_micro_usd": "100"}')
    assert error_of(mcp.answer()) == "invalid_input"
    # what the JSON-RPC parser itself cannot read (nested 1,000 deep, a lone surrogate, not JSON) is answered
    # with a JSON-RPC parse error (its id unknown: null), and the server lives on
    for call_id, arguments in enumerate([b'{"body": "x", "extra": ' + b'{"a":' * 1000 + b"{}" + b"}" * 1000 + b"}",
                                         b'{"body": "\\ud800"}', b'{"body": '], start=10):
        mcp.call(call_id, "board_post", arguments)
        answer = mcp.answer()
        assert answer is not None and answer["id"] is None and answer["error"]["code"] == -32700, answer
        assert mcp.proc.poll() is None
    assert snapshot(served.store) == before
    mcp.call(13, "board_post", b'{"body": "after all of it"}')
    answer = mcp.answer()
    assert answer is not None and answer["id"] == 13 and answer["result"]["isError"] is False, answer
    assert mcp.close() == 0
    assert snapshot(served.store) != before  # the good post landed: the comparison above sees writes


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def test_a_line_too_long_is_a_parse_error_and_never_held_whole(served: Served) -> None:
    from swarmyard.plane.mcp_server import MAX_MESSAGE_BYTES

    mcp = Mcp(served)
    mcp.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}).encode())
    assert mcp.answer() is not None
    mcp.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    before_kib = _peak_rss_kib(mcp.proc.pid)
    # 256 MiB in one line (a tool call whose body never ends): read and dropped a piece at a time
    piece = b"x" * (1024 * 1024)
    mcp._in.write(b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"board_post","arguments":'
                  b'{"body":"')
    for _ in range(256):
        mcp._in.write(piece)
    mcp.send(b'"}}}')
    answer = mcp.answer()
    assert answer is not None and answer["id"] is None and answer["error"]["code"] == -32700, answer
    assert str(MAX_MESSAGE_BYTES) in answer["error"]["message"]
    grown_mib = (_peak_rss_kib(mcp.proc.pid) - before_kib) / 1024
    assert grown_mib < 4 * MAX_MESSAGE_BYTES / 2**20, f"peak RSS grew {grown_mib:.0f} MiB"  # not 256 MiB
    # a line just within the limit is still read (and refused by the plane for its size, as a tool error)
    mcp.call(3, "board_post", b'{"body": "after the long line"}')
    answer = mcp.answer()
    assert answer is not None and answer["id"] == 3 and answer["result"]["isError"] is False, answer
    assert mcp.close() == 0
