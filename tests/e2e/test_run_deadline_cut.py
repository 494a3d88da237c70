"""A run's deadline cuts a model call still in flight: the run ends at its deadline, not when the upstream answers.

Before, ``deadline_s = 6`` on an upstream that took 60 s to answer took 62 s: nothing stopped a call already sent.
Here an OpenAI-compatible upstream on loopback never answers before the test is over; it only notes when the
broker hung up on it. Through the console script: the worker's one call reached the upstream once (never sent
again) and was cut at the deadline (the upstream saw its connection closed); its hold is ``unknown`` at its worst
case, as a call lost after sending is; the worker's finding says the deadline stopped it; by the run's own events
it closed within a few seconds of its deadline; and its last line says the deadline is why it has no synthesis.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rigs.swarm_files import upstream_swarm

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
DEADLINE_S = 20
#: seconds from the deadline to the run's last event (``run.closed``): the cut, the worker's finding, the lead not
#: started, every machine deleted
AFTER_DEADLINE_S = 8.0


class SilentUpstream:
    """Reads each request whole and answers nothing until the connection closes; notes each request's model and
    whether the caller hung up on it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.hung_up = 0
        self._lock = threading.Lock()
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
        with conn, conn.makefile("rb") as reader:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = reader.readline()
                if not line:
                    return
                head += line
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = reader.read(length)
            with self._lock:
                self.requests.append(body.decode())
            conn.settimeout(600)
            try:
                gone = conn.recv(1) == b""  # no answer is ever sent: the only way on is the caller's
            except OSError:
                gone = True
            with self._lock:
                self.hung_up += gone

    def close(self) -> None:
        self._listener.close()


def test_a_call_in_flight_at_the_deadline_is_cut_and_the_run_ends_there(short_tmp: Path) -> None:
    upstream = SilentUpstream()
    try:
        swarm = upstream_swarm(short_tmp, f"http://127.0.0.1:{upstream.port}/v1",
                               objective="Should a small team build a speech app?",
                               lens=("market", "Size the market."),
                               workers={"max_steps": 4, "retry_backoff_s": 0.2})
        swarm.write_text(swarm.read_text().replace("deadline_s = 300", f"deadline_s = {DEADLINE_S}"))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
               "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
        done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--no-witness"], cwd=short_tmp, env=env,
                              capture_output=True, text=True, timeout=600)
        # the broker closed the upstream's connection itself (the upstream never answers, and is still up)
        deadline_end = time.monotonic() + 10
        while upstream.hung_up < len(upstream.requests) and time.monotonic() < deadline_end:
            time.sleep(0.05)
        requests, hung_up = list(upstream.requests), upstream.hung_up
    finally:
        upstream.close()
    assert len(requests) == 1 and '"up-worker"' in requests[0], (requests, done.stderr[-3000:])
    assert hung_up == 1

    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True) as db:
        created, deadline = db.execute("SELECT created_at, deadline FROM goals").fetchone()
        first = db.execute("SELECT min(created_at) FROM events").fetchone()[0]
        kind, closed = db.execute("SELECT kind, created_at FROM events ORDER BY id DESC LIMIT 1").fetchone()
        holds = db.execute("SELECT state, amount, actual FROM reservations").fetchall()
        findings = db.execute("SELECT f.body FROM findings f JOIN tasks t ON t.id = f.task_id "
                              "WHERE t.title = 'market'").fetchall()
    assert deadline - created == pytest.approx(DEADLINE_S, abs=0.1)
    assert kind == "run.closed"
    # by the run's own clock: it ran to its deadline (the call was in flight there) and stopped soon after it
    assert deadline <= closed <= deadline + AFTER_DEADLINE_S, (closed - deadline, done.stderr[-3000:])
    assert closed - first <= DEADLINE_S + AFTER_DEADLINE_S
    # the cut call: sent once, its cost unknown, its worst case still held (never released, never sent again)
    [(state, amount, actual)] = holds
    assert state == "unknown" and amount > 0 and actual is None
    assert findings == [("No result was reached for 'market': the goal's deadline passed at step 1.",)], findings
    # no lead was started past the deadline, and the run says that is why it has no synthesis
    assert done.returncode != 0
    assert ("ended without a synthesis: the lead's task failed: the goal's deadline passed before a lead wrote the "
            "synthesis") in done.stderr, done.stderr[-3000:]
