"""The reconciliation benchmark end to end through ``swarmyard run --json``, in real bubblewrap machines.

The shipped ``examples/reconciliation/oracle.toml`` (the scripted provider scripted as an oracle: every worker
runs the shell command that finds its shard's inconsistent records in its machine, the lead merges them with
grep and sort) must find all 15 records of seed 1, score 1,000,000, leave no hold and no provider key in any
machine. The broker holds a canary key (an unused hosted provider) for the end-of-run scan to look for; a run
whose worker writes that key into its machine must be reported with it found.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from swarmyard.families import reconciliation

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reconciliation"
FIGURES = {"score", "wall_s", "calls", "tokens_in", "tokens_out", "spend_micro_usd", "leftover_holds", "keys_found"}


def _keyed(folder: Path) -> str:
    """A hosted provider nothing routes to, whose key (a canary) the broker holds all run long."""
    return f"""
[providers.keyed]
kind = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CANARY_KEY"
models = ["unused-model"]
[providers.keyed.prices."unused-model"]
input_usd_per_mtok = "1"
output_usd_per_mtok = "1"

[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
"""


def _run(folder: Path, swarm: Path, key: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "CANARY_KEY": key}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=900)


def _store(folder: Path) -> sqlite3.Connection:
    [run_dir] = (folder / "runs").iterdir()
    return sqlite3.connect(run_dir / "store.db")


def test_the_oracle_finds_all_fifteen_records_with_no_hold_and_no_key_left(short_tmp: Path) -> None:
    shutil.copytree(EXAMPLE, short_tmp / "reconciliation")
    swarm = short_tmp / "reconciliation" / "oracle.toml"
    swarm.write_text(swarm.read_text() + _keyed(short_tmp))
    done = _run(short_tmp, swarm, "sk-canary-" + secrets.token_hex(20))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert set(figures) >= FIGURES
    assert (figures["leftover_holds"], figures["keys_found"], figures["keys_held"]) == (0, 0, True)
    assert figures["calls"] == 10 * 3 + 4 and figures["tokens_in"] > 0 and figures["tokens_out"] > 0
    assert "leftover holds" in done.stderr and "provider keys found in sandboxes" in done.stderr
    with _store(short_tmp) as db:
        tasks = dict(db.execute("SELECT id, title FROM tasks").fetchall())
        findings = db.execute("SELECT task_id, body FROM findings").fetchall()
        progress = db.execute("SELECT COUNT(*) FROM posts WHERE kind = 'progress'").fetchone()[0]
    truth = reconciliation.answer(1)
    by_title = {tasks[task]: body for task, body in findings}
    assert progress == 10  # one note per shard
    shards = [body for title, body in by_title.items() if title.startswith("shard ")]
    assert len(shards) == 10
    # every shard's finding names records of that shard only, and together they are the truth
    named = [re.findall(r"TX-[0-9]{5}", body) for body in shards]
    assert sorted(i for ids in named for i in ids) == truth
    assert re.findall(r"TX-[0-9]{5}", by_title["synthesis"]) == truth  # sorted, de-duplicated
    assert figures["score"] == 1_000_000, done.stderr[-3000:]


def test_a_key_written_into_a_machine_is_found_by_the_scan(short_tmp: Path) -> None:
    key = "sk-canary-" + secrets.token_hex(20)
    conf = short_tmp / "conf"
    (conf / "shard").mkdir(parents=True)
    (conf / "shard" / "ledger.csv").write_text("id,date,account,amount\n")
    # split in two so that the broker's scrubber (which takes held keys out of answers) lets it through
    leak = f"printf '%s%s' '{key[:12]}' '{key[12:]}' > leak.txt; echo written"
    replies = {
        "oracle-worker": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": leak}}]},
            {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "t", "body": "{{last_message}}"}}]},
        ],
        "oracle-lead": [{"tool_calls": [{"name": "submit_finding",
                                         "arguments": {"title": "s", "body": "Nothing to merge."}}]}],
    }
    (conf / "replies.json").write_text(json.dumps(replies))
    swarm = conf / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Leave a key behind."
budget_usd = "1"
deadline_s = 300
[[tasks.lenses]]
title = "shard"
prompt = "Look at task/."
files = ["shard"]
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
model = "oracle-worker"
[lead]
model = "oracle-lead"
[providers.oracle]
kind = "scripted"
models = ["oracle-worker", "oracle-lead"]
replies = "replies.json"
{_keyed(short_tmp)}""")
    done = _run(short_tmp, swarm, key)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["keys_found"] == 1, done.stderr[-3000:]
    assert figures["leftover_holds"] == 0
    assert "leak.txt" in done.stderr and key not in done.stderr + done.stdout
