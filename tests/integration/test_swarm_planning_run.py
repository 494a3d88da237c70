"""``plan = N`` end to end: the planner worker's call goes through the broker in its own machine and sandbox.

The scripted provider answers the planner with a schema-shaped ``submit_plan`` call (and, in the second run,
with prose), the workers with findings and the lead with a synthesis. The tasks the run made must be the
planner's lenses (or the fallback lenses), the planning call is charged to its own task's envelope.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.config import loads_config
from swarmyard.domain import PLANNER_GROUP
from swarmyard.store import open_store
from swarmyard.swarm.planning import FALLBACK_LENSES
from swarmyard.swarm.run import Swarm
from swarmyard.swarm.setup import LEAD_GROUP

pytestmark = [
    pytest.mark.slow,
    pytest.mark.bwrap,
]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short folder: the plane's Unix socket lives in the run folder, and pytest's own paths are too deep."""
    path = Path(tempfile.mkdtemp(prefix="syplan-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(tmp_path: Path) -> str:
    return f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
[tasks]
plan = 2
[workers]
count = 2
concurrency = 2
exec_timeout_s = 60
max_steps = 3
model = "w"
[lead]
model = "l"
[providers.script]
kind = "scripted"
models = ["w", "l"]
[run]
runs_dir = "{tmp_path / 'runs'}"
sandbox = "local"
"""


def _finding(i: int) -> CallTools:
    return CallTools((("submit_finding", {"title": f"finding {i}", "body": f"what worker {i} found"}),))


def _run(tmp_path: Path, *plan_replies: CallTools | Say) -> tuple[list[str], dict[str, int]]:
    provider = ScriptedProvider(
        {"w": [*plan_replies, _finding(0), _finding(1)],
         "l": [CallTools((("submit_finding", {"title": "synthesis", "body": "Go."}),))]},
        name="script",
    )
    result = Swarm(loads_config(_config(tmp_path)), providers={"script": provider}).run()
    assert result.synthesis is not None and result.synthesis.body == "Go."
    # every call's tokens reached the store through the broker's settle, and the report's totals
    per_worker = result.data.by_worker()
    assert result.data.input_tokens > 0 and result.data.output_tokens > 0
    assert set(per_worker) >= {"planner", "lead"} and per_worker["planner"].calls >= 1
    assert sum(t.tokens for t in per_worker.values()) == result.data.input_tokens + result.data.output_tokens
    store = open_store(f"sqlite:///{tmp_path / 'runs' / result.run_id / 'store.db'}")
    try:
        tasks = store.list_tasks(result.goal_id)
        planning = [t for t in tasks if t.group == PLANNER_GROUP]
        assert len(planning) == 1 and planning[0].envelope.calls >= 1
        titles = [t.title for t in tasks if t.group not in (PLANNER_GROUP, LEAD_GROUP)]
        calls = {t.group: t.envelope.calls for t in tasks}
    finally:
        store.close()
    # the planner asked for exactly two lenses through the one tool it was offered
    first = provider.requests[0]
    assert [t.name for t in first.tools] == ["submit_plan"]
    return titles, calls


def test_plan_n_makes_the_planners_lenses(tmp_path: Path) -> None:
    plan = {"lenses": [{"title": "market size", "prompt": "How big?"}, {"title": "risks", "prompt": "What kills it?"}]}
    titles, calls = _run(tmp_path, CallTools((("submit_plan", plan),)))
    assert sorted(titles) == ["market size", "risks"]
    assert calls[PLANNER_GROUP] == 1


def test_an_unusable_plan_falls_back(tmp_path: Path) -> None:
    # prose twice (the planner re-asks once), then the fixed lenses take over
    prose = Say("You could look at the market and at the risks.")
    titles, calls = _run(tmp_path, prose, prose)
    assert sorted(titles) == sorted(t for t, _ in FALLBACK_LENSES[:2])
    assert calls[PLANNER_GROUP] == 2
