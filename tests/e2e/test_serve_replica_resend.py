"""A model call in flight on a ``swarmyard serve`` replica killed with SIGKILL, and its client sending the very
same body to another replica of the same PostgreSQL store at once (as an SDK does after a lost connection).

The upstream is a counting HTTP server on loopback that reads each request and never answers, so the call is
in flight when its replica dies. Its hold stays ``held`` until a surviving replica sweeps it ``unknown`` (30 s
after the dead one's last beat); a resend in that window went upstream a second time. Asserted: the resend
is refused ``409 duplicate_in_flight`` (retry later) before the sweep and ``409 duplicate_of_unknown`` (never)
after it, nothing is held for either, and the upstream saw the body once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port as _free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


class SilentUpstream:
    """An OpenAI-compatible upstream that counts the request bodies it read and answers none of them."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self.bodies: list[bytes] = []
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk
        with self._lock:
            self.bodies.append(body)  # and no answer: the call stays in flight

    def seen(self, needle: bytes) -> int:
        with self._lock:
            return sum(needle in body for body in self.bodies)

    def close(self) -> None:
        self._server.close()
        for conn in self._open:
            conn.close()


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-resend-", dir="/tmp"))
    (path / "state").mkdir(mode=0o700)
    yield path


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "SWARMYARD_STATE_DIR": str(folder / "state")}


def _replica(folder: Path, store: str, n: int) -> tuple[str, subprocess.Popen[str]]:
    port = _free_port()
    log = folder / f"replica-{n}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--store", store, "--no-socket", "--host", "127.0.0.1",
         "--port", str(port), "--secret-file", str(folder / "secret"), "--operator-token-file",
         str(folder / "operator-token"), "--providers", str(folder / "providers.toml")],
        cwd=folder, env=_env(folder), stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # ready once its health route answers, bounded
        assert proc.poll() is None, f"replica {n} exited {proc.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"replica {n} did not start: {log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return url, proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def test_a_resend_of_a_call_a_killed_replica_held_is_never_sent(folder: Path, pg_url: str) -> None:
    upstream = SilentUpstream()
    (folder / "providers.toml").write_text(
        f'[providers.up]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:{upstream.port}/v1"\n'
        'models = ["m"]\n[providers.up.prices."m"]\ninput_usd_per_mtok = "1.00"\noutput_usd_per_mtok = "2.00"\n')
    first_url, first = _replica(folder, pg_url, 0)  # makes the secret and the operator token
    second_url, second = _replica(folder, pg_url, 1)
    try:
        operator = httpx.Client(base_url=second_url, timeout=60, headers={
            "authorization": f"Bearer {(folder / 'operator-token').read_text().strip()}"})
        goal = operator.post("/v1/operator/goals", json={"objective": "o", "budget_micro_usd": 1_000_000,
                                                         "call_cap": 100}).json()["goal"]
        operator.post(f"/v1/operator/goals/{goal['id']}/tasks", json={"title": "t", "budget_micro_usd": 500_000})
        token = operator.post(f"/v1/operator/goals/{goal['id']}/workers", json={}).json()["token"]
        auth = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        claimed = httpx.post(f"{first_url}/v1/tools/claim_task", headers=auth, json={}, timeout=60)
        assert claimed.status_code == 200 and claimed.json()["task"] is not None, claimed.text
        body = json.dumps({"model": "m", "max_tokens": 20,
                           "messages": [{"role": "user", "content": "the one question"}]}).encode()
        lost: list[BaseException] = []

        def call() -> None:
            try:
                httpx.post(f"{first_url}/v1/chat/completions", headers=auth, content=body, timeout=600)
            except httpx.TransportError as exc:
                lost.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        deadline = time.monotonic() + 120
        while upstream.seen(b"the one question") == 0:  # the call is upstream: in flight on the first replica
            assert time.monotonic() < deadline and caller.is_alive(), "the call never reached the upstream"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        caller.join(timeout=60)
        assert len(lost) == 1 and isinstance(lost[0], httpx.RemoteProtocolError)

        def holds() -> list[str]:
            answer = operator.get(f"/v1/operator/goals/{goal['id']}/reservations")
            return [r["state"] for r in answer.json()["reservations"]]

        assert holds() == ["held"]  # the dead replica's hold, not swept yet
        try:
            resend = httpx.post(f"{second_url}/v1/chat/completions", headers=auth, content=body, timeout=60)
        except httpx.ReadTimeout:  # the silent upstream never answers what reached it
            pytest.fail(f"the resend was sent upstream ({upstream.seen(b'the one question')} times in all)")
        assert resend.status_code == 409, resend.text
        assert resend.json()["error"]["code"] == "duplicate_in_flight"
        assert resend.headers["x-should-retry"] == "true"  # once the first hold ends, it may go
        assert holds() == ["held"] and upstream.seen(b"the one question") == 1
        deadline = time.monotonic() + 300
        while holds() != ["unknown"]:  # the second replica sweeps the dead one's hold
            assert time.monotonic() < deadline, holds()
            time.sleep(0.5)
        again = httpx.post(f"{second_url}/v1/chat/completions", headers=auth, content=body, timeout=60)
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "duplicate_of_unknown"
        assert again.headers["x-should-retry"] == "false"
        assert holds() == ["unknown"]
        assert upstream.seen(b"the one question") == 1  # the upstream saw the body once, whatever was resent
        goal_now = operator.get(f"/v1/operator/goals/{goal['id']}").json()["goal"]
        assert goal_now["envelope"]["calls"] == 1 and goal_now["envelope"]["reserved"] > 0  # kept until reconciled
    finally:
        upstream.close()  # first: a call still in flight upstream ends, so a replica can stop
        for proc in (first, second):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    assert second.returncode == 0
