"""The body that crashed ``swarmyard serve``, sent from inside a real machine through its relay during a
``swarmyard run``: the run goes on to its synthesis.

Before, a million ``[`` to ``/v1/chat/completions`` through the in-sandbox relay overflowed orjson's stack in the
run's own process (its in-process control plane) and ended ``swarmyard run`` with exit 139. Here the worker's
model (a loopback fake of a paid provider) has the built-in agent run a shell command that sends that body from
the machine to the broker and to a tool, with no token and with the worker's own; then it submits what it saw.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from rigs.network import http_server
from swarmyard.machines.local import RELAY_PORT

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
MODEL = "fake-worker-model"

# Run by the agent's shell inside the machine: the million-deep body to the broker and to a tool, through the
# relay, without a token and then with the worker's (read from the agent's environment, as any code in the
# machine could); each status and error code is printed for the model to read.
ATTACK = f"""python3 - <<'EOF'
import http.client, json, os
token = None
for pid in os.listdir('/proc'):
    try:
        env = open(f'/proc/{{pid}}/environ', 'rb').read().split(b'\\0')
    except OSError:
        continue
    token = next((e.split(b'=', 1)[1].decode() for e in env if e.startswith(b'SWARMYARD_TOKEN=')), token)
body = b'[' * 1000000 + b']' * 1000000
for path in ('/v1/chat/completions', '/v1/tools/board_post'):
    for auth in (None, token):
        c = http.client.HTTPConnection('127.0.0.1', {RELAY_PORT}, timeout=120)
        headers = {{'content-type': 'application/json'}}
        if auth:
            headers['authorization'] = 'Bearer ' + auth
        c.request('POST', path, body=body, headers=headers)
        r = c.getresponse()
        print('RESULT', path, 'token' if auth else 'none', r.status, json.loads(r.read())['error']['code'])
EOF"""


def _completion(message: dict[str, Any]) -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                    "finish_reason": "tool_calls"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}).encode()


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                             "function": {"name": name, "arguments": json.dumps(arguments)}}]}


class _Model(BaseHTTPRequestHandler):
    """A worker's first step runs the attack; once a tool result is in the conversation, it submits it."""

    # keep-alive, as a provider is: the broker reuses its upstream connections (an HTTP/1.0 server closing each
    # one after its answer races the next request onto it, which is a lost answer)
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        offered = {t["function"]["name"] for t in request.get("tools") or ()}
        # the built-in agent hands a tool's result back as a user message "Result of <tool>: ..."
        results = [str(m["content"]) for m in request["messages"]
                   if m.get("role") == "user" and str(m.get("content")).startswith("Result of shell")]
        if "shell" in offered and not results:
            reply = _call("shell", {"command": ATTACK})
        else:
            reply = _call("submit_finding", {"title": "what the relay answered", "body": "\n".join(results) or "none"})
        data = _completion(reply)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def model() -> Iterator[str]:
    with http_server(_Model) as url:
        yield f"{url}/v1"


def test_the_million_bracket_body_from_inside_a_machine_does_not_kill_the_run(short_tmp: Path, model: str) -> None:
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Probe the control plane."
budget_usd = "1"
call_cap = 50
deadline_s = 600
[[tasks.lenses]]
title = "probe"
prompt = "Send the body."
[policy]
kind = "team"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 240
max_steps = 4
model = "{MODEL}"
[lead]
model = "{MODEL}"
[providers.fake]
kind = "openai_compatible"
base_url = "{model}"
models = ["{MODEL}"]
[providers.fake.prices."{MODEL}"]
input_usd_per_mtok = "1"
output_usd_per_mtok = "1"
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "local"
""")
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    run = subprocess.run([str(SWARMYARD), "run", str(swarm), "--quiet"], cwd=short_tmp, env=env,
                         capture_output=True, text=True, timeout=600)
    # the run went on to its lead and ended: this model never has the lead submit, so the run says it has no
    # synthesis and exits 1 (a crash of the plane would be another exit and another reason)
    assert run.returncode == 1, f"exit {run.returncode}\n{run.stderr[-3000:]}"
    assert "ended without a synthesis: the lead reached no result: the step cap ran out" in run.stderr, run.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [r[0] for r in db.execute("SELECT body FROM findings WHERE title = 'what the relay answered'")]
    seen = "\n".join(bodies)
    # no token: refused before the body is read; with the worker's token: read, and refused before any parser
    for path, expected in (("/v1/chat/completions", "400 nesting_too_deep"),
                           ("/v1/tools/board_post", "413 payload_too_large")):
        assert f"RESULT {path} none 401 invalid_token" in seen, seen
        assert f"RESULT {path} token {expected}" in seen, seen
