"""A run on a priced upstream, through the console script: spend is usage x price exactly, and the budget binds.

The upstream is a small OpenAI-compatible server on loopback (the only test double: it stands in for a paid
provider). It answers every call with a tool call and reports the same usage each time. Its models are priced
in the swarm file, so the broker reserves and settles in real micro-USD. The worker's envelope covers three of
its calls; its fourth is refused with 402, it submits what it has, the lead writes the synthesis, and the run
ends with exit 0, a report that shows the spend, and no hold left.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from rigs.network import http_server
from rigs.swarm_files import upstream_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

#: What the upstream reports for every call, and the swarm file's prices (USD per million tokens).
PROMPT_TOKENS, COMPLETION_TOKENS = 1000, 500
INPUT_USD, OUTPUT_USD = "0.15", "100"
#: micro-USD per million tokens, as the broker holds them; one call's cost, rounded up to a whole micro-USD
INPUT_MICRO, OUTPUT_MICRO = 150_000, 100_000_000
CALL_COST = -(-(PROMPT_TOKENS * INPUT_MICRO + COMPLETION_TOKENS * OUTPUT_MICRO) // 1_000_000)
#: The worker's envelope is half the goal's (the lead keeps the other half). A call holds its worst case,
#: 512 output tokens x $100/Mtok = 51,200 micro-USD plus its input bound: three calls fit in 175,000, a fourth
#: (with 24,550 left) does not.
BUDGET_USD = "0.35"


class Upstream:
    """An OpenAI-compatible chat completions server: the worker model posts to the board every time, the lead
    model submits a synthesis; each request is recorded."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """Each POST recorded and answered as :meth:`answer` says."""
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                upstream.requests.append(body)
                reply = json.dumps(upstream.answer(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        return Handler

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        n = len(self.requests)
        if body["model"] == "up-lead":
            name, args = "submit_finding", {"title": "synthesis", "body": "Three notes were posted in budget."}
        else:
            name, args = "board_post", {"body": f"note {n}"}
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{n}", "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)}}]}}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
        }


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    with http_server(server.handler()) as server.url:
        yield server


def test_spend_is_usage_times_price_and_the_fourth_call_is_refused(short_tmp: Path, upstream: Upstream) -> None:
    swarm = upstream_swarm(short_tmp, upstream.base_url, objective="Post notes while the budget lasts.",
                           lens=("notes", "Post notes to the board."), workers={"max_steps": 6},
                           budget_usd=BUDGET_USD, input_usd=INPUT_USD, output_usd=OUTPUT_USD)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answer, note = done.stdout.strip().split("\n\n", 1)
    assert answer == "Three notes were posted in budget."
    # the worker's task ended on the budget, and the lead's output says so with the envelope's figures
    assert note.startswith("1 of 1 tasks reached no result") and "'notes': the budget ran out at step 4" in note

    # the upstream saw three worker calls (the fourth was refused before it left) and the lead's one
    assert [r["model"] for r in upstream.requests] == ["up-worker"] * 3 + ["up-lead"]
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        rows = db.execute("SELECT state, actual, overage, input_tokens, output_tokens FROM reservations").fetchall()
    # every hold settled (none left held, none unknown) at its actual cost, none above its hold
    assert rows == [("settled", CALL_COST, 0, PROMPT_TOKENS, COMPLETION_TOKENS)] * 4
    spent = 4 * CALL_COST
    assert spent == 200_600
    report = (run_dir / "report.md").read_text()
    assert f"| spend | ${spent // 1_000_000}.{spent % 1_000_000:06d} of $0.350000 |" in report
    assert f"${spent // 1_000_000}.{spent % 1_000_000:06d}" in done.stderr
    # the worker was told no at its fourth call, by the broker, with 402 and what its envelope had left
    [worker_log] = [p.read_text() for p in (run_dir / "agents").glob("worker-0-*.log")]
    answers = re.findall(r'chat/completions "HTTP/1.1 (\d+)', worker_log)
    assert answers == ["200", "200", "200", "402"], worker_log[-2000:]
    assert f"(available {175_000 - 3 * CALL_COST})" in worker_log
    assert '"ending": "budget"' in worker_log
