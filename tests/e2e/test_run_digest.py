"""``[lead] synthesis = "digest"`` through ``swarmyard run``, in real machines, on the scripted provider: the lead
asks its verdict on each finding (constrained to yes, no or unclear) and what the finding means (plain text), and
the run prints the composed synthesis: the answer the verdicts make, the model's reason for it, a point per finding,
each citing its finding. Checked from the store: the opening is the one the stored points' verdicts make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigs.cli import run_cli
from swarmyard.agents import verdicts
from swarmyard.domain import LEAD_GROUP
from swarmyard.store import open_store

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

MARKET = "Clinicians dictate notes daily and pay for offline dictation; about 5M of them in Europe."
RISKS = "The platforms may ship offline dictation for free within a year; a developer beta is the warning sign."
POINTS = ["Paying buyers exist, which favours building, though the count is rough.",
          "A free platform feature could erase the market, so speed matters more than polish."]
REASON = "Demand pays now, but a free platform feature could take it away within a year."
SWARM = """
[goal]
objective = "Should a small team build an offline dictation app?"
budget_usd = "0.50"
call_cap = 40
deadline_s = 600
max_depth = 1
[[tasks.lenses]]
title = "market"
prompt = "Size the market."
[[tasks.lenses]]
title = "risks"
prompt = "List the risks."
[policy]
kind = "team"
[workers]
agent = "builtin"
count = 2
concurrency = 1
max_steps = 2
model = "w"
[lead]
agent = "builtin"
model = "l"
max_steps = 4
synthesis = "digest"
[providers.s]
kind = "scripted"
models = ["w", "l"]
replies = "replies.json"
"""


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    """An ordinary folder with a short path (the plane's Unix socket lives in the run folder)."""
    return short_tmp


def test_a_digest_lead_prints_its_answer_and_a_point_per_finding(folder: Path) -> None:
    def finding(title: str, body: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "submit_finding", "arguments": {"title": title, "body": body}}]}

    # concurrency 1: the market lens is claimed first, so its finding is the first the lead reads
    def verdict(said: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "submit_finding", "arguments": {"verdict": said}}]}

    replies = {"w": [finding("market", MARKET), finding("risks", RISKS)],
               "l": [verdict("yes"), {"say": POINTS[0]}, verdict("no"), {"say": POINTS[1]}, {"say": REASON}]}
    (folder / "replies.json").write_text(json.dumps(replies))
    (folder / "swarm.toml").write_text(SWARM)
    out = run_cli("run", "swarm.toml", "--quiet", cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (folder / "runs").iterdir()
    goal = json.loads((run_dir / "run.json").read_text())["goal_id"]
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        scouts = {f.title: f.id for f in store.read_findings(goal) if f.group != LEAD_GROUP}
        [synthesis] = store.read_findings(goal, group=LEAD_GROUP)
    finally:
        store.close()
    # the answer names the findings it was written from, and each point the one it came from
    expected = (f"Mixed: 1 of 2 findings says yes [{scouts['market']}]; 1 of 2 findings says no "
                f"[{scouts['risks']}]. {REASON}\n\nFrom the findings:\n"
                f"- Yes: {POINTS[0]} [{scouts['market']}]\n"
                f"- No: {POINTS[1]} [{scouts['risks']}]")
    assert synthesis.body == expected
    assert verdicts.check(synthesis.body) is None
    assert out.stdout.strip() == expected  # what the user reads: the synthesis, whole
    assert {c.ref for c in synthesis.citations if c.kind == "finding"} == set(scouts.values())
    steps = [json.loads(line) for line in next((run_dir / "agents").glob("lead-*.jsonl")).read_text().splitlines()]
    asked = [json.loads(step["result"]) for step in steps if step.get("replies")]
    assert len(asked) == 5 and all(len(step["replies"]) == 1 for step in steps if step.get("replies"))
    assert [part.get("verdict", part.get("text")) for part in asked] == ["yes", POINTS[0], "no", POINTS[1], REASON]
