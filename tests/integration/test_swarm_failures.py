"""No retry loop: agents that keep failing end their task (or their slot), and the run goes on to its end.

The launcher plays each agent directly on a real SQLite store, as the plane would see it: it claims, then
either finishes (a finding) or exits without one the way the test says. Nothing of swarmyard is replaced.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from swarmyard.agents.builtin import Role
from swarmyard.clock import FakeClock
from swarmyard.config import SwarmConfig, loads_config
from swarmyard.domain import Goal, TaskState
from swarmyard.report.data import WorkerSpan
from swarmyard.store import open_store
from swarmyard.store.protocol import Store
from swarmyard.swarm.coordinator import Coordinator
from swarmyard.swarm.launcher import WorkerSlot

#: (ending, exit code, error) of a failed agent run
Way = tuple[str, int | None, str]
EXIT_1: Way = ("error", 1, "exit 1: API Error: 400 the conversation leaves no room for an answer")
TIMEOUT: Way = ("timeout", None, "timed out after 90 s")


class FailingLauncher:
    """Agents that fail on the tasks named in ``fail`` (cycling through its ways), or before claiming anything
    when ``fail_unclaimed``; every other agent submits a finding."""

    def __init__(self, store: Store, clock: FakeClock, *, fail: dict[str, list[Way]] | None = None,
                 fail_unclaimed: Way | None = None) -> None:
        self.store, self.clock = store, clock
        self.fail = fail or {}
        self.fail_unclaimed = fail_unclaimed
        self.goal: Goal | None = None
        self.runs: Counter[str] = Counter()  # task title (or "-") -> agent runs

    async def start(self, goal: Goal) -> None:
        self.goal = goal

    def worker_of(self, slot: str) -> str | None:
        return None

    async def close(self) -> None:
        pass

    async def run(self, slot: WorkerSlot) -> WorkerSpan:
        assert self.goal is not None
        worker = f"{slot.name}-{sum(self.runs.values())}"
        start = self.clock.now()
        if self.fail_unclaimed is not None and slot.role is Role.WORKER:
            self.runs["-"] += 1
            ending, code, error = self.fail_unclaimed
            return WorkerSpan(worker, None, start, self.clock.now(), ending, 0, slot.name, code, error)
        claim = self.store.claim(self.goal.id, worker, 30.0, task_id=slot.task_id,
                                 group=None if slot.task_id else slot.group)
        if claim is None:
            return WorkerSpan(worker, None, start, self.clock.now(), "no_task", 0, slot.name)
        title = claim.task.title
        self.runs[title] += 1
        ways = self.fail.get(title)
        if ways:
            ending, code, error = ways[(self.runs[title] - 1) % len(ways)]
            return WorkerSpan(worker, claim.task.id, start, self.clock.now(), ending, 0, slot.name, code, error)
        self.store.submit_finding(claim.task.id, claim.token, author=worker, title=f"on {title}",
                                  body=f"{worker} says", citations=[])
        self.clock.advance(1)
        return WorkerSpan(worker, claim.task.id, start, self.clock.now(), "submitted", 1, slot.name, 0)


def _config(extra: str = "") -> SwarmConfig:
    return loads_config(f"""
[goal]
objective = "Pick a speech model"
budget_usd = "1"
call_cap = 100
[[tasks.lenses]]
title = "market"
[[tasks.lenses]]
title = "broken"
[[tasks.lenses]]
title = "risks"
[workers]
count = 2
concurrency = 2
retry_backoff_s = 0
{extra}
""")


def _run(tmp_path: Path, config: SwarmConfig, **launcher: object) -> tuple[Coordinator, FailingLauncher, str, str]:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    agents = FailingLauncher(store, clock, **launcher)  # type: ignore[arg-type]
    coordinator = Coordinator(config, store, agents, run_id="run_f", run_dir=tmp_path / "runs" / "run_f",
                              clock=clock)
    result = asyncio.run(coordinator.run())
    assert result.report is not None
    return coordinator, agents, result.goal_id, result.report.markdown.read_text()


def test_a_task_failing_the_same_way_three_times_is_failed_and_the_run_goes_on(tmp_path: Path) -> None:
    coordinator, agents, goal, report = _run(tmp_path, _config(), fail={"broken": [EXIT_1]})
    tasks = {t.title: t for t in coordinator.store.list_tasks(goal)}
    assert agents.runs["broken"] == 3  # three tries, then no more
    broken = tasks["broken"]
    assert broken.state is TaskState.FAILED and broken.attempts == 3
    assert broken.result == f"3 tries failed the same way: {EXIT_1[2]}"
    assert {t.state for title, t in tasks.items() if title != "broken"} == {TaskState.DONE}  # lead included
    assert agents.runs["market"] == agents.runs["risks"] == 1
    assert "## Failed tasks" in report and f"| broken | `{broken.id}` | 3 | {broken.result} |" in report


def test_the_number_of_tries_is_a_swarm_file_setting(tmp_path: Path) -> None:
    coordinator, agents, goal, _ = _run(tmp_path, _config("max_failures = 2"), fail={"broken": [EXIT_1]})
    assert agents.runs["broken"] == 2
    [broken] = [t for t in coordinator.store.list_tasks(goal) if t.title == "broken"]
    assert broken.state is TaskState.FAILED and broken.result is not None and broken.result.startswith("2 tries")


def test_failures_that_change_their_way_are_bounded_too(tmp_path: Path) -> None:
    coordinator, agents, goal, _ = _run(tmp_path, _config(), fail={"broken": [EXIT_1, TIMEOUT]})
    assert agents.runs["broken"] == 6  # never three the same way in a row: twice max_failures in all
    [broken] = [t for t in coordinator.store.list_tasks(goal) if t.title == "broken"]
    assert broken.state is TaskState.FAILED
    assert broken.result == f"6 tries failed in a row; the last: {TIMEOUT[2]}"


def test_agents_failing_before_any_claim_retire_their_slot_and_fail_its_tasks(tmp_path: Path) -> None:
    coordinator, agents, goal, report = _run(tmp_path, _config(), fail_unclaimed=EXIT_1)
    assert agents.runs["-"] == 2 * 3  # two slots, three failed agents each
    tasks = {t.title: t for t in coordinator.store.list_tasks(goal)}
    for title in ("market", "broken", "risks"):
        assert tasks[title].state is TaskState.FAILED
        assert tasks[title].result == f"no agent could take it: 3 tries failed the same way: {EXIT_1[2]}"
    assert tasks["synthesis"].state is TaskState.DONE  # the run still ends with its lead and report
    assert report.count("no agent could take it") == 3


def test_a_lead_that_keeps_failing_ends_the_run_without_a_synthesis(tmp_path: Path) -> None:
    config = _config()
    coordinator, agents, goal, report = _run(tmp_path, config, fail={"synthesis": [("model_error", 0, "exit 0: model "
                                                                              "failed: no scripted reply left")]})
    assert agents.runs["synthesis"] == 3
    [lead] = [t for t in coordinator.store.list_tasks(goal) if t.title == "synthesis"]
    assert lead.state is TaskState.FAILED and "no scripted reply left" in (lead.result or "")
    assert "_No synthesis was written._" in report and "## Failed tasks" in report
