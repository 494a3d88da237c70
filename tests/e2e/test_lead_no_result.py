"""What the lead is told of tasks that reached no result, and what the run says when there is no synthesis.

Through ``swarmyard run`` on the scripted provider, in real bubblewrap machines: a scout stopped by its task's
call cap leaves a placeholder that names that limit with the store's figures, and a scout whose envelope cannot
afford one call is refused at claim and its task failed with the figures; the lead's prompt holds only the
findings that reached a result, and its synthesis says how many tasks reached nothing and why. A grounded run (``cite_files``) in which no scout reached a result runs no lead and exits 1 saying why.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool
from rigs.swarm_files import scripted_swarm

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


def _swarm(folder: Path, lenses: list[str], *, call_cap: int = 50, extra: str = "", tasks: str = "") -> Path:
    return scripted_swarm(folder, agent="builtin", replies="replies.json", extra=extra, call_cap=call_cap,
                          lenses=[(title, f"Look at {title}.") for title in lenses], lens_extra=tasks)


def _run(folder: Path, swarm: Path, replies: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (folder / "conf" / "replies.json").write_text(json.dumps(replies))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _store(folder: Path) -> tuple[dict[str, tuple[str, str, str | None]], list[tuple[str, str, str]]]:
    """Tasks by title (id, state, prompt, result) and findings (id, task title, body) as the run stored them."""
    [run_dir] = (folder / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        tasks = {str(t): (str(i), str(s), r) for i, t, s, r in db.execute("SELECT id, title, state, result FROM tasks")}
        prompts = dict(db.execute("SELECT title, prompt FROM tasks").fetchall())
        findings = [(str(i), str(t), str(b)) for i, t, b in db.execute(
            "SELECT f.id, t.title, f.body FROM findings f JOIN tasks t ON t.id = f.task_id ORDER BY f.id")]
    tasks["synthesis prompt"] = ("", "", prompts.get("synthesis"))
    return tasks, findings


SYNTHESIS = "Go: the one scout that reached a result found paying buyers."


def test_a_scout_stopped_by_its_call_cap_is_named_to_the_lead_as_such_and_never_read_as_a_finding(
        short_tmp: Path) -> None:
    # 6 calls: 2 for each of the two scouts and 2 for the lead (the goal's cap shared out by the coordinator)
    swarm = _swarm(short_tmp, ["market", "price"], call_cap=6)
    done = _run(short_tmp, swarm, {
        "scripted-worker": [_tool("submit_finding", title="market", body="Buyers pay for offline dictation."),
                            _tool("board_post", body="pricing: looking"), _tool("board_post", body="still looking"),
                            _tool("submit_finding", title="never reached", body="a third call")],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)],
    })
    assert done.returncode == 0, done.stderr[-3000:]
    tasks, findings = _store(short_tmp)
    [(market_id, _, market_body)] = [f for f in findings if f[1] == "market"]
    [(price_id, _, price_body)] = [f for f in findings if f[1] == "price"]
    # the cap that ran out, with its figure: the task's call cap, not "the budget" (it spent nothing)
    assert price_body == ("No result was reached for 'price': the task's call cap ran out at step 3 "
                          "(all 2 of its model calls were made).")
    lead_prompt = tasks["synthesis prompt"][2] or ""
    assert market_id in lead_prompt and market_body in lead_prompt
    assert price_id not in lead_prompt and price_body not in lead_prompt  # a placeholder is no evidence
    note = ("1 of 2 tasks reached no result, so nothing of theirs is in this synthesis: 'price': the task's call "
            "cap ran out at step 3 (all 2 of its model calls were made).")
    assert note in lead_prompt
    assert done.stdout.strip() == f"{SYNTHESIS}\n\n{note}"
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        [(citations,)] = db.execute("SELECT f.citations FROM findings f JOIN tasks t ON t.id = f.task_id "
                                    "WHERE t.title = 'synthesis'").fetchall()
    assert {c["ref"] for c in json.loads(citations)} == {market_id}  # the lead rests on the real finding only


def test_a_scout_its_envelope_cannot_afford_names_the_budget_with_the_figures(short_tmp: Path) -> None:
    # the worker's model costs $1,000 per million output tokens: one 512-token answer could cost $0.512, more
    # than the scout's half of the $1 budget (the other half is held for the lead). The plane refuses the scout's
    # claim (it would be refused at its first call), and the run fails the task with the figures.
    swarm = _swarm(short_tmp, ["market"], extra='[providers.script.prices.scripted-worker]\n'
                                               'input_usd_per_mtok = "0"\noutput_usd_per_mtok = "1000"\n')
    done = _run(short_tmp, swarm, {
        "scripted-worker": [_tool("submit_finding", title="market", body="never asked")],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body="No: nothing was found.")],
    })
    assert done.returncode == 0, done.stderr[-3000:]
    tasks, findings = _store(short_tmp)
    assert [f for f in findings if f[1] == "market"] == []  # never claimed: no placeholder either
    _, state, why = tasks["market"]
    found = re.fullmatch(r"refused at claim: its slice \((\d+) micro-USD\) cannot afford one model call "
                         r"\((\d+) micro-USD\)", why or "")
    assert state == "failed" and found is not None, why
    left, needed = (int(x) for x in found.groups())
    assert (left, needed) == (500_000, 512_000)
    assert "1 of 1 tasks reached no result" in done.stdout and f"'market': it failed: {why}" in done.stdout


def test_a_grounded_run_whose_scouts_found_nothing_runs_no_lead_and_exits_1_saying_why(short_tmp: Path) -> None:
    notes = short_tmp / "notes"
    notes.mkdir()
    (notes / "market.md").write_text("Buyers pay for offline dictation.\n")
    swarm = _swarm(short_tmp, ["market"], tasks=f'files = ["{notes}"]')
    done = _run(short_tmp, swarm, {
        # never a finding: the worker posts until its step cap
        "scripted-worker": [_tool("board_post", body=f"looking {i}") for i in range(4)],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body="Go, the market is there.")],
    })
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout.strip() == "(no synthesis was written)"
    tasks, findings = _store(short_tmp)
    assert [f[2] for f in findings] == ["No result was reached for 'market': the step cap ran out (4 of 4 steps)."]
    _, state, why = tasks["synthesis"]
    assert state == "failed" and why is not None and why.startswith("no synthesis: no task reached a result to cite")
    last = done.stderr.strip().splitlines()[-1]
    assert "ended without a synthesis: the lead's task failed: no synthesis: no task reached a result" in last
    assert "'market': the step cap ran out (4 of 4 steps)" in last


def test_a_grounded_synthesis_whose_claim_names_no_finding_is_refused_and_the_run_exits_1(short_tmp: Path) -> None:
    notes = short_tmp / "notes"
    notes.mkdir()
    line = "Buyers pay for offline dictation."
    (notes / "market.md").write_text(f"{line}\n")
    swarm = _swarm(short_tmp, ["market"], tasks=f'files = ["{notes}"]')
    swarm.write_text(swarm.read_text().replace('[lead]\nmodel = "scripted-lead"',
                                               '[lead]\nmodel = "scripted-lead"\nmax_steps = 2'))
    unbacked = "Go: everyone wants a speech app."
    done = _run(short_tmp, swarm, {
        "scripted-worker": [_tool("submit_finding", title="market", body="People pay for it.",
                                  cite=[f"market.md:1: {line}"])],
        # a claim with no finding behind it, twice: refused each time with the reason
        "scripted-lead": [_tool("submit_finding", title="synthesis", body=unbacked)] * 2,
    })
    assert done.returncode == 1, done.stderr[-3000:]
    _, findings = _store(short_tmp)
    assert [f[2] for f in findings if f[1] == "market"] == ["People pay for it."]
    assert not any(unbacked in body for _, _, body in findings)  # never stored
    [run_dir] = (short_tmp / "runs").iterdir()
    steps = [json.loads(text) for path in (run_dir / "agents").glob("lead-*.jsonl")
             for text in path.read_text().splitlines() if text.strip()]
    refusals = [json.loads(s["result"])["error"] for s in steps if '"unverified_citation"' in str(s.get("result"))]
    assert len(refusals) == 2 and all("names no finding" in r["reason"] for r in refusals), refusals
    last = done.stderr.strip().splitlines()[-1]
    assert "ended without a synthesis: the lead reached no result: the step cap ran out (2 of 2 steps)" in last
