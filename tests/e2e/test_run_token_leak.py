"""A worker that prints its own capability token (its environment, through the shell tool) and then writes it
into its finding: the token went on into its messages file, its trajectory, the lead's messages and, with
``--otlp-content``, the spans (here the fallback file, the collector being down). Through the console script on
the scripted provider (process sandbox: the agent's environment is readable from its shell there too), no
``sy1.`` token is in any of those files; where it stood, ``[capability token]``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
TOKEN = re.compile(r"sy1\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{20,}")
PRINT_TOKENS = ("for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null | grep SWARMYARD_TOKEN"
                " | sort -u; env | grep SWARMYARD_TOKEN")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_workers_printed_token_is_in_no_trajectory_message_file_or_span(short_tmp: Path) -> None:
    swarm = scripted_swarm(short_tmp)
    (short_tmp / "conf" / "replies").mkdir()
    (short_tmp / "conf" / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool_call("shell", command=PRINT_TOKENS),
                            tool_call("submit_finding", title="market", body="env: {{last_message}}", cite=["1"])],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness",
                           "--otlp", f"http://127.0.0.1:{_closed_port()}/v1/traces", "--otlp-content"],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    files = [*sorted((run_dir / "agents").glob("*.jsonl")), *sorted((run_dir / "agents" / "messages").glob("*.jsonl")),
             run_dir / "traces.otlp.jsonl"]
    assert len(files) >= 5, files  # two trajectories, two message files, the spans
    for path in files:
        assert not TOKEN.search(path.read_text()), path
    # the worker did print its token: what it sent its model next holds it, redacted
    [worker_messages] = (run_dir / "agents" / "messages").glob("worker-0-*.jsonl")
    assert "SWARMYARD_TOKEN=[capability token]" in worker_messages.read_text()
    assert "SWARMYARD_TOKEN=[capability token]" in (run_dir / "traces.otlp.jsonl").read_text()
