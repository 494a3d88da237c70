"""``swarmyard run`` fails a task whose budget cannot afford one model call, and goes on with the others.

Through the console script, in real machines, on the scripted provider. The ``groups`` policy with one group and
two rounds gives round 1's task a sixth of the budget and round 2's a quarter (a share is held back for later
rounds and the lead); output costs 10 USD per million tokens and input nothing, so one call of the built-in worker
(``max_tokens`` 512) is held at 5,120 micro-USD: round 1's task (4,000) cannot afford it, round 2's (6,000) can.
The plane refuses the worker's claim of round 1's task (402 budget_exceeded); the agent ends ``claim_refused``
without claiming; the run fails that task, once, with a reason naming its slice, runs round 2 and the lead, and
says so in its JSON figures. Before, the claim was made, the first call refused, and the task retried.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from invariants import check_run, store_url_of
from rigs.cli import cli_env, run_cli
from rigs.scripted import tool_call as _tool

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SYNTHESIS = "Go: the second round found a market."
REASON = "refused at claim: its slice (4000 micro-USD) cannot afford one model call (5120 micro-USD)"


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # the plane's socket lives in the run folder: keep it short
    (short_tmp / "tmp").mkdir()
    return short_tmp


def _swarm(folder: Path) -> Path:
    conf = folder / "conf"
    conf.mkdir()
    (conf / "replies.json").write_text(json.dumps({
        "scripted-worker": [_tool("submit_finding", title="market", body="Large and growing.")],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)],
    }))
    prices = "".join(f'[providers.script.prices.{model}]\ninput_usd_per_mtok = "0"\noutput_usd_per_mtok = "10"\n'
                     for model in ("scripted-worker", "scripted-lead"))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "0.024"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "market"
prompt = "Size the market."
[policy]
kind = "groups"
groups = 1
rounds = 2
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 2
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
{prices}[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def test_a_task_no_call_fits_in_is_failed_once_and_the_run_goes_on(folder: Path) -> None:
    done = run_cli("run", "--json", str(_swarm(folder)), cwd=folder, env=cli_env(folder, TMPDIR=str(folder / "tmp")))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    [run_dir] = (folder / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        tasks = {str(title): (str(state), int(attempts), result, str(task_id), int(budget))
                 for task_id, title, state, attempts, result, budget in db.execute(
                     "SELECT id, title, state, attempts, result, budget FROM tasks")}
        events = [(str(kind), json.loads(body)) for kind, body in db.execute("SELECT kind, body FROM events")]
    assert {title: t[0] for title, t in tasks.items()} == {
        "market (round 1)": "failed", "market (round 2)": "done", "synthesis": "done"}, tasks
    _, attempts, why, refused, budget = tasks["market (round 1)"]
    assert (attempts, why, budget) == (0, REASON, 0)  # never claimed; its 4,000 went back to the goal
    # the lead got it, and what round 2's task did not spend (a done task's budget becomes what it spent)
    made = {str(body["title"]): int(body["budget"]) for kind, body in events if kind == "task.created"}
    spent = tasks["market (round 2)"][4]
    assert spent < made["market (round 2)"] == 6_000 and made["synthesis"] == 24_000 - spent
    # the summary says so: the failed task with its reason, the others done, one call each for round 2 and the lead
    assert figures["tasks_failed"] == [{"task": refused, "title": "market (round 1)", "reason": REASON}]
    assert (figures["tasks_done"], figures["calls"], figures["leftover_holds"]) == (2, 2, 0)
    assert f"task 'market (round 1)' ({refused}) failed: {REASON}" in done.stderr
    # ended once, by the run, never claimed, no slice, no hold
    about = [(kind, body) for kind, body in events if body.get("task") == refused]
    assert [kind for kind, _ in about] == ["task.created", "task.failed"], about
    assert about[1][1]["needed"] == 5_120 and about[1][1]["returned"] == 4_000
    # the worker that was refused: one agent run for round 1, ended claim_refused (its log says why)
    logs = sorted((run_dir / "agents").glob("worker-0-*.log"))
    assert len(logs) == 2 and sum("claim refused" in p.read_text() for p in logs) == 1
    check_run(store_url_of(run_dir), run_dir)
