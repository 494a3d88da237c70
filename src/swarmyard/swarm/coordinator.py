"""The coordinator: the five steps of a run, resumable from what the store holds.

1. create the goal and its tasks; 2-3. run agents in machines, up to the concurrency cap, until every task of
the round is done (a hung worker's lease expires and another worker takes its task); between rounds of the
``groups`` policy, broadcast each group's best findings; 4. the lead writes the synthesis; 5. delete the
machines (in ``finally``, so also on error and Ctrl-C) and write the report.

No retry loop: an agent that ended without a finding is a failed try of the task it held. A slot waits before
its next launch after a failed try (``workers.retry_backoff_s``, doubled each time, at most
``MAX_RETRY_BACKOFF_S``), and a task whose tries failed the same way (same ending, same exit code)
``workers.max_failures`` times in a row is marked failed with that error; the run goes on with the other tasks.
An agent that fails that many times without ever holding a task retires its slot; the open tasks no slot is
left for are failed with its error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from swarmyard.agents.builtin import Ending
from swarmyard.agents.settings import Role
from swarmyard.clock import Clock, SystemClock
from swarmyard.config import MAX_RETRY_BACKOFF_S, SwarmConfig
from swarmyard.domain import PLANNER_GROUP, Finding, Goal, PostKind, ReservationState, Task, TaskState
from swarmyard.errors import AuditError, FencingError, IllegalTransitionError, NotFoundError, UserError
from swarmyard.plane.completion import close_found, findings_of
from swarmyard.report import ReportData, ReportFiles, WorkerSpan, write_report
from swarmyard.rules import grounding, no_result
from swarmyard.rules.policies import Policy, best_findings, consolidation_text, make_policy
from swarmyard.store.protocol import Store
from swarmyard.swarm.launcher import WorkerLauncher, WorkerSlot
from swarmyard.swarm.planning import create_planning_task, lenses_from_plan
from swarmyard.swarm.setup import LEAD_GROUP, create_goal, create_lead_task, create_round_tasks

if TYPE_CHECKING:
    from swarmyard.audit.log import AuditLog
    from swarmyard.audit.witness import WitnessClient
    from swarmyard.swarm.scoring import HoldoutOutcome, RunEvaluator

log = logging.getLogger(__name__)

#: Groups whose tasks are steps of the coordinator's own (planning, synthesis), not the rounds' work.
SIDE_GROUPS = frozenset({LEAD_GROUP, PLANNER_GROUP})
#: How often an idle worker slot looks again for a claimable task (a peer's lease may have expired).
POLL_S = 0.2
COORDINATOR = "coordinator"


@dataclass(slots=True)
class RunState:
    """What ``runs/<id>/run.json`` keeps so that ``--resume`` can continue."""

    run_id: str
    goal_id: str
    store_url: str
    rounds_done: int = 0
    lead_done: bool = False
    #: ``plan = N``: the (title, prompt) pairs the planning step settled on, so later rounds and a resume reuse them
    planned: list[tuple[str, str]] | None = None
    #: whether the first round's tasks are all made (``False`` from the goal's creation until they are: a store
    #: failure in between leaves a run that ``--resume`` completes; a file without the key is an older run's)
    tasks_made: bool = True

    def save(self, path: Path) -> None:
        """Write atomically (a crash leaves the old file or the new one)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "run_id": self.run_id,
                    "goal_id": self.goal_id,
                    "store_url": self.store_url,
                    "rounds_done": self.rounds_done,
                    "lead_done": self.lead_done,
                    "planned": self.planned,
                    "tasks_made": self.tasks_made,
                }
            )
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> RunState:
        """Read a saved state, or ``UserError`` if there is none."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"no run to resume at {path.parent}") from None
        planned = data.pop("planned", None)
        return cls(**data, planned=[(str(t), str(p)) for t, p in planned] if planned is not None else None)


@dataclass(frozen=True, slots=True)
class ProgressRow:
    """One line of the live table: a worker slot, its task, its state and what it used so far."""

    worker: str
    task: str
    state: str
    steps: int
    tokens: int
    spent_micro_usd: int
    last_post: str


@dataclass(frozen=True, slots=True)
class ProgressSummary:
    """The run so far in a line: tasks done (and failed) of all, model calls, settled and held spend, seconds
    since the goal began, and the workers' current errors (their last error each, by code, newest last)."""

    tasks_done: int
    tasks_failed: int
    tasks_total: int
    calls: int
    settled_micro_usd: int
    held_micro_usd: int
    elapsed_s: float
    errors: tuple[tuple[str, str, str], ...] = ()  # (slot, code, message)


class ProgressRows(list[ProgressRow]):
    """The live table's rows, with the run's summary beside them."""

    summary: ProgressSummary | None = None
    #: the run's last rows, handed once its work has ended: a printer says them whatever it said just before
    final: bool = False


@dataclass(slots=True)
class RunResult:
    """The end of a run."""

    run_id: str
    goal_id: str
    synthesis: Finding | None
    report: ReportFiles | None
    data: ReportData
    spans: list[WorkerSpan] = field(default_factory=list)
    #: places a provider key was found in the machines at the run's end (``None``: the launcher scans none)
    keys_found: int | None = None
    #: whether the broker held a provider key to look for (``False``: a keyless run, where 0 found means nothing)
    keys_held: bool = False


def _open(task: Task, now: float) -> bool:
    return task.state is TaskState.PENDING or (
        task.state is TaskState.CLAIMED and (task.lease_expires_at or 0) <= now
    )


#: Task states a round is finished with (a failed task is not tried again).
_ENDED = (TaskState.DONE, TaskState.CANCELLED, TaskState.FAILED)
#: Endings of an agent run that held no task and still went wrong.
_BAD_ENDINGS = frozenset({"error", "timeout"})
#: An agent run whose claim the plane refused: the task's budget cannot afford one model call.
CLAIM_REFUSED = Ending.CLAIM_REFUSED.value


@dataclass(frozen=True, slots=True)
class _TasksRead:
    """One read of a goal's tasks that worker slots share: when it started (the loop's clock) and after how many
    ended agent runs."""

    future: asyncio.Future[list[Task]]
    at: float
    generation: int


@dataclass(slots=True)
class Streak:
    """Failed tries in a row: the way the last failed (ending, exit code), how many in a row failed that way,
    how many failed in all, and the last error."""

    way: tuple[str, int | None] | None = None
    count: int = 0
    tries: int = 0
    reason: str = ""

    def add(self, span: WorkerSpan) -> None:
        """Count one more failed try; a different way starts the streak of the same way again."""
        way = (span.ending, span.exit_code)
        self.count = self.count + 1 if way == self.way else 1
        self.tries += 1
        self.way = way
        self.reason = span.error or span.ending

    def given_up(self, limit: int) -> str | None:
        """Why to stop trying: ``limit`` failures the same way in a row, or twice that many in all (failures
        that keep changing their way are still a loop); ``None`` while neither."""
        if self.count >= limit:
            return f"{self.count} tries failed the same way: {self.reason}"
        if self.tries >= 2 * limit:
            return f"{self.tries} tries failed in a row; the last: {self.reason}"
        return None


def why_no_synthesis(tasks: Sequence[Task], findings: Sequence[Finding]) -> str:
    """Why a run has no synthesis, from its store: the lead's task failed (and why), its lead reached no result
    (the limit its placeholder names), or no lead ran."""
    leads = [t for t in tasks if t.group == LEAD_GROUP]
    if not leads:
        return "no lead was run"
    lead = leads[-1]
    if lead.state is TaskState.FAILED:
        return f"the lead's task failed: {lead.result or 'no reason was given'}"
    said = [no_result.reason(f.body) for f in findings if f.task_id == lead.id]
    if said and said[-1] is not None:
        return f"the lead reached no result: {said[-1]}"
    return f"the lead's task ended {lead.state.value} without a synthesis"


class Coordinator:
    """Runs one swarm file against a store with a worker launcher."""

    def __init__(
        self,
        config: SwarmConfig,
        store: Store,
        launcher: WorkerLauncher,
        *,
        run_id: str,
        run_dir: Path,
        clock: Clock | None = None,
        on_span: Callable[[WorkerSpan], None] | None = None,
        on_progress: Callable[[list[ProgressRow]], None] | None = None,
        witness: WitnessClient | None = None,
        evaluator: RunEvaluator | None = None,
    ) -> None:
        self.config = config
        #: cosigns every audit checkpoint when given
        self.witness = witness
        #: the run's evaluator (``[evaluator]``): started for the goal, its holdout fired once at the end
        self.evaluator = evaluator
        self.store = store
        self.launcher = launcher
        self.run_id = run_id
        self.run_dir = run_dir
        #: checkpoint the audit log after a round once this many events arrived since the last checkpoint
        self.audit_every_n = 1000
        self.clock = clock or SystemClock()
        self.policy: Policy = make_policy(config.policy)
        self.spans: list[WorkerSpan] = []
        self._on_span = on_span
        self._on_progress = on_progress
        self._running: dict[str, str] = {}  # slot -> task id it was started for ("" when any)
        self._running_group: dict[str, str] = {}  # slot -> the group of the agent it runs now
        self._goal_id = ""
        self._task_streaks: dict[str, Streak] = {}  # task id -> its failed tries in a row
        self._slot_streaks: dict[str, Streak] = {}  # slot -> its agents' failures without a task, in a row
        self._slot_failed: dict[str, int] = {}  # slot -> failed runs in a row, any way (for the backoff)
        self._retired: dict[str, str] = {}  # slot -> why it launches no more agents
        self._tasks_read: _TasksRead | None = None  # the worker slots' shared look at the tasks
        self._runs_ended = 0  # agent runs whose end the coordinator has handled

    # -- claims the coordinator settles ---------------------------------------------------------------------
    def _findings_for(self, goal_id: str, task_id: str) -> list[Finding]:
        return findings_of(self.store, goal_id, task_id)

    def settle_task(self, task: Task) -> None:
        """Complete a claimed task that already has a finding; a lapsed lease is taken back first."""
        if task.state is TaskState.CLAIMED and self._findings_for(task.goal_id, task.id):
            self._complete(task)

    def _complete(self, task: Task) -> None:
        close_found(self.store, task, COORDINATOR)  # held by another worker now: its claim goes on

    def _lose_holds(self, goal_id: str) -> None:
        """Mark ``unknown`` every hold of the goal still ``held`` as a resume starts: the broker that made it ran
        in the run's process, which died with its calls in flight, so no one is left to settle or release it
        (a late settlement of an unknown hold still goes through)."""
        for hold in self.store.list_reservations(goal_id, state=ReservationState.HELD):
            try:
                self.store.mark_unknown(hold.id)
            except IllegalTransitionError:
                continue  # ended meanwhile
            log.warning("reservation %s was held when the run stopped: marked unknown (reconcile it)", hold.id)

    def settle_goal(self, goal_id: str) -> None:
        """Settle every claimed task with a finding (after a crash, or a worker killed after submitting)."""
        for task in self.store.list_tasks(goal_id, state=TaskState.CLAIMED):
            self.settle_task(task)

    # -- step 2-3: workers ----------------------------------------------------------------------------------
    async def _tasks_now(self, goal: Goal) -> list[Task]:
        """The goal's tasks, read off the event loop at most ``POLL_S`` ago and since the last agent run ended.

        Every worker slot looks at the tasks before each launch and while it waits. Each slot reading them itself,
        on the loop, made the launches of a large run take turns: N slots read N tasks twice each before their
        agents could start (N^2 rows decoded while holding the loop, and the GIL the in-process plane serves on).
        One read is shared by every slot that looks within the same window; an agent run's end starts a new one,
        so a task it finished is never seen open again."""
        loop = asyncio.get_running_loop()
        while True:
            read = self._tasks_read
            if read is None or read.generation != self._runs_ended or (
                    read.future.done() and loop.time() - read.at >= POLL_S):
                future = asyncio.ensure_future(asyncio.to_thread(self.store.list_tasks, goal.id))
                read = self._tasks_read = _TasksRead(future, loop.time(), self._runs_ended)
            tasks = await asyncio.shield(read.future)
            # an agent run that ended while the read was out may have settled a task it shows still open (a lapsed
            # lease with a finding): read again rather than hand that task to another agent
            if read.generation == self._runs_ended:
                return tasks

    def _remaining(self, tasks: Sequence[Task], group: str) -> tuple[int, int]:
        """(open, unfinished) tasks of ``group`` outside the lead's."""
        now = self.clock.now()
        unfinished = [t for t in tasks if t.group == group and t.group not in SIDE_GROUPS and t.state not in _ENDED]
        return sum(1 for t in unfinished if _open(t, now)), len(unfinished)

    def _past_deadline(self, goal: Goal) -> bool:
        return goal.deadline is not None and self.clock.now() >= goal.deadline

    async def _record(self, slot: WorkerSlot) -> WorkerSpan:
        self._running[slot.name] = slot.task_id or ""
        self._running_group[slot.name] = slot.group
        try:
            span = await self.launcher.run(slot)
        finally:
            self._running.pop(slot.name, None)
            self._running_group.pop(slot.name, None)
        self.spans.append(span)
        if self._on_span is not None:
            self._on_span(span)
        held = [t for t in self.store.list_tasks(self._goal_id, state=TaskState.CLAIMED)
                if t.worker_id == span.worker_id]
        failed = False
        for task in held:
            if self._findings_for(task.goal_id, task.id):
                self._complete(task)
                continue
            failed = True
            streak = self._task_streaks.setdefault(task.id, Streak())
            streak.add(span)
            why = streak.given_up(self.config.workers.max_failures)
            if why is not None:
                self._fail(task, why)
            else:
                self._give_back(task)
        if span.ending == CLAIM_REFUSED and not held and not self._fail_unaffordable(slot):
            # refused, and yet no task of its group is short of the floor now (its price moved, or a task was
            # given budget meanwhile): counted as a failure of the slot, so a refusal that repeats retires it
            failed = True
            self._slot_streaks.setdefault(slot.name, Streak()).add(span)
        elif held:
            self._slot_streaks.pop(slot.name, None)
        elif span.ending in _BAD_ENDINGS:
            failed = True
            self._slot_streaks.setdefault(slot.name, Streak()).add(span)
        self._slot_failed[slot.name] = self._slot_failed.get(slot.name, 0) + 1 if failed else 0
        self._runs_ended += 1  # the tasks it held have moved on: the next look reads them again
        return span

    def _fail_unaffordable(self, slot: WorkerSlot) -> list[Task]:
        """An agent's claim was refused: its task's budget cannot afford one call. Fail every claimable task of
        the slot's group that cannot afford the least call of the slot's agent, each exactly once, with a reason
        naming its slice (the store's conditional update; the plane's floor, not what the agent said), so the run
        goes on with the others rather than launch agents at a task no call fits in."""
        failed = self.store.fail_unaffordable(self._goal_id, self.launcher.claim_floor(slot.role), group=slot.group)
        for task in failed:
            log.warning("task %s (%s) failed: %s", task.id, task.title, task.result)
        return failed

    def _fail(self, task: Task, reason: str) -> None:
        """Mark a task failed for good: with the claim its last agent left, else one the coordinator takes."""
        log.warning("task %s (%s) failed: %s", task.id, task.title, reason)
        try:
            if task.fencing_token is None:
                raise FencingError("no claim", task_id=task.id, presented=0, current=None)
            self.store.fail(task.id, task.fencing_token, reason)
        except FencingError:
            claim = self.store.claim(task.goal_id, COORDINATOR, 60.0, task_id=task.id)
            if claim is not None:  # else another worker holds it now: its try counts on
                self.store.fail(task.id, claim.token, reason)

    async def _backoff(self, goal: Goal, slot: str) -> None:
        """After a failed run, wait before the slot launches again (never past the deadline)."""
        failures = self._slot_failed.get(slot, 0)
        if failures == 0:
            return
        wait = min(MAX_RETRY_BACKOFF_S, self.config.workers.retry_backoff_s * 2 ** (failures - 1))
        if goal.deadline is not None:
            wait = min(wait, max(0.0, goal.deadline - self.clock.now()))
        await asyncio.sleep(wait)

    def _give_back(self, task: Task) -> None:
        """A claim whose agent has exited without a finding (it crashed, or was killed at its exec timeout)
        goes back at once, rather than when its lease runs out: the next agent can take the task now."""
        try:
            if task.fencing_token is not None:
                self.store.release(task.id, task.fencing_token)
                log.info("gave back %s: its agent %s exited holding it", task.id, task.worker_id)
        except FencingError:
            pass  # the lease ran out, or another worker took the task, in between: nothing to give back

    async def _slot_loop(self, goal: Goal, slot: WorkerSlot, gate: asyncio.Semaphore) -> None:
        while not self._past_deadline(goal):
            streak = self._slot_streaks.get(slot.name)
            why = streak.given_up(self.config.workers.max_failures) if streak is not None else None
            if why is not None:
                self._retired[slot.name] = why
                log.warning("%s launches no more agents: %s", slot.name, why)
                return
            open_now, unfinished = self._remaining(await self._tasks_now(goal), slot.group)
            if unfinished == 0:
                return
            if open_now == 0:
                # a peer holds the last tasks; wait for them to finish or for a lease to lapse
                await asyncio.sleep(POLL_S)
                continue
            await self._backoff(goal, slot.name)
            async with gate:
                tasks = await self._tasks_now(goal)
                # from here to the launcher's run, nothing awaits: the next slot sees this one as running
                handed = self._handed(tasks, slot)
                if handed is not None:
                    await self._record(handed)
            if handed is None:
                await asyncio.sleep(POLL_S)  # every open task is being handed to another slot's agent

    def _handed(self, tasks: Sequence[Task], slot: WorkerSlot) -> WorkerSlot | None:
        """The slot as its agent gets it. Where tasks have input files, the coordinator hands each agent its
        task (so the launcher can put that task's files in the machine first), never one another slot holds:
        ``None`` when no such task is open. Without files, agents claim whichever task they get, and ``None`` when
        the agents already started will claim every open task."""
        if not any(lens.files for lens in self.config.tasks.lenses):
            return slot if self._claimable(tasks, slot.group) > 0 else None
        taken = set(self._running.values())
        now = self.clock.now()
        for task in tasks:
            if task.group == slot.group and task.group not in SIDE_GROUPS and task.id not in taken \
                    and _open(task, now):
                return replace(slot, task_id=task.id)
        return None

    def _claimable(self, tasks: Sequence[Task], group: str) -> int:
        """Open tasks of ``group`` that no agent already started for it will claim. An agent still booting holds
        no claim yet: one more started for the same last task would boot a machine only to end ``no_task``.
        (``tasks`` may be a moment old: a task claimed since is counted open, and its agent booting, so the
        difference is the same.)"""
        now = self.clock.now()
        tasks = [t for t in tasks if t.group == group and t.group not in SIDE_GROUPS]
        claimed_by = {t.worker_id for t in tasks if t.worker_id}
        booting = sum(1 for name, g in list(self._running_group.items())
                      if g == group and self.launcher.worker_of(name) not in claimed_by)
        return sum(1 for t in tasks if t.state not in _ENDED and _open(t, now)) - booting

    async def _work_round(self, goal: Goal) -> None:
        gate = asyncio.Semaphore(self.config.workers.concurrency)
        self._tasks_read = None  # the round's tasks were just made
        slots = [
            WorkerSlot(f"worker-{i}", self.policy.worker_group(i)) for i in range(self.config.workers.count)
        ]
        await asyncio.gather(*(self._slot_loop(goal, slot, gate) for slot in slots))
        if self._past_deadline(goal):
            return
        # every slot has returned: a task still open has no slot left to run it (they all retired)
        retired = {slot.group: self._retired[slot.name] for slot in slots if slot.name in self._retired}
        now = self.clock.now()
        for task in self.store.list_tasks(goal.id):
            if task.group in retired and task.group not in SIDE_GROUPS and _open(task, now):
                self._fail(task, f"no agent could take it: {retired[task.group]}")

    def _consolidate(self, goal: Goal, round_index: int) -> None:
        """Broadcast each group's best findings by score: a finding's own (the artifacts it cites), else the
        best its task's artifacts were scored, so a worker that did not cite its attempt is still ranked."""
        by_task = self.store.best_scores(goal.id, by="task")
        findings = [f if f.score is not None else replace(f, score=by_task.get(f.task_id))
                    for f in self.store.read_findings(goal.id, limit=10_000) if f.group not in SIDE_GROUPS]
        best = best_findings(findings, self.config.policy.broadcast_top)
        if not best:
            return
        text = consolidation_text(round_index, best)
        for group in sorted({self.policy.worker_group(i) for i in range(self.config.workers.count)}):
            self.store.post_as_operator(
                goal.id, PostKind.CONSOLIDATION, text, author=COORDINATOR, group=group
            )

    # -- step 1 with ``plan = N``: the planning call ----------------------------------------------------------
    async def _plan(self, goal: Goal, count: int) -> list[tuple[str, str]]:
        """Run the planner on its own task (made once), then read its plan; unusable parts fall back."""
        planning = self.store.list_tasks(goal.id, group=PLANNER_GROUP)
        task = planning[-1] if planning else create_planning_task(self.store, goal, count)
        if (not self._findings_for(goal.id, task.id) and not self._past_deadline(goal)
                and _open(self.store.get_task(task.id), self.clock.now())):
            await self._record(WorkerSlot("planner", PLANNER_GROUP, Role.PLANNER, task.id))
        found = self._findings_for(goal.id, task.id)
        return lenses_from_plan(found[-1].body if found else None, count)

    def _out_of_time_or_money(self, goal: Goal) -> bool:
        """Past the deadline, or nothing left of the goal's budget that a next round could be given."""
        envelope = self.store.get_goal(goal.id).envelope
        if self._past_deadline(goal) or envelope.available <= 0:
            log.info("no further round: %s", "the deadline passed" if self._past_deadline(goal)
                     else "the budget is spent")
            return True
        return False

    def _round_tasks_exist(self, goal: Goal) -> bool:
        return any(t.group not in SIDE_GROUPS for t in self.store.list_tasks(goal.id))

    # -- step 4: the lead -----------------------------------------------------------------------------------
    async def _lead(self, goal: Goal) -> Finding | None:
        lead_tasks = self.store.list_tasks(goal.id, group=LEAD_GROUP)
        if lead_tasks:
            task = lead_tasks[-1]
        else:
            findings = [
                f for f in self.store.read_findings(goal.id, limit=10_000) if f.group not in SIDE_GROUPS
            ]
            # a task's no-result placeholder is no evidence: the lead reads the real findings, and is told how
            # many tasks reached nothing and why (the limit each placeholder names, from the store)
            evidence = [f for f in findings if not no_result.is_placeholder(f.body)]
            note = grounding.nothing_found(grounding.outcomes(self.store.list_tasks(goal.id), findings, SIDE_GROUPS))
            task = create_lead_task(self.store, goal, self.config, evidence, note)
            if not evidence and self.config.tasks.cite_files:
                # a grounded synthesis cites findings, and there is none: no lead is run to write one from nothing
                self._fail(task, f"no synthesis: no task reached a result to cite. {note}".strip())
                return None
        # a lead that failed leaves its task for the next one, up to max_failures tries in all
        for _ in range(self.config.workers.max_failures):
            if self._findings_for(goal.id, task.id) or self._past_deadline(goal):
                break
            current = self.store.get_task(task.id)
            while not _open(current, self.clock.now()) and current.state not in _ENDED:
                await asyncio.sleep(POLL_S)
                current = self.store.get_task(task.id)
            if current.state in _ENDED:
                break
            await self._backoff(goal, "lead")
            await self._record(WorkerSlot("lead", LEAD_GROUP, Role.LEAD, task.id))
        synthesis = self._findings_for(goal.id, task.id)
        task = self.store.get_task(task.id)
        if not synthesis and task.state not in _ENDED and _open(task, self.clock.now()):
            streak = self._task_streaks.get(task.id)
            if streak is not None and not self._past_deadline(goal):
                self._fail(task, f"{self.config.workers.max_failures} leads ended without a synthesis; the "
                                 f"last: {streak.reason}")
            elif self._past_deadline(goal):  # the run ends here: say so, not "pending without a synthesis"
                self._fail(task, "the goal's deadline passed before a lead wrote the synthesis")
        if synthesis and no_result.is_placeholder(synthesis[-1].body):
            return None  # the lead reached no result: that is no synthesis, and the run says why
        return synthesis[-1] if synthesis else None

    # -- progress -------------------------------------------------------------------------------------------
    def progress(self) -> list[ProgressRow]:
        """The live table's rows, read from the store: finished runs by their spans, running ones as such."""
        from swarmyard.report.data import worker_totals

        if not self._goal_id:
            return []
        tasks = {t.id: t for t in self.store.list_tasks(self._goal_id)}
        rows = {s.worker_id: s.row for s in self.spans}
        rows.update({w: slot for slot in self._running if (w := self.launcher.worker_of(slot))})
        owner = {t.id: t.worker_id for t in tasks.values() if t.worker_id}
        totals = worker_totals(self.store.list_reservations(self._goal_id), rows, owner)
        last_post: dict[str, str] = {}
        for post in self.store.read_board(self._goal_id, limit=10_000):
            last_post[rows.get(post.author, post.author)] = post.body
        last_span = {s.row: s for s in self.spans}
        out = ProgressRows()
        out.summary = self._summary(list(tasks.values()))
        for slot in sorted(set(last_span) | set(self._running)):
            worker = next((w for w, r in rows.items() if r == slot and r in self._running), None)
            task = next((t for t in tasks.values() if worker and t.worker_id == worker), None)
            span = last_span.get(slot)
            if slot in self._running:
                state = "running"
                title = task.title if task else "-"
            else:
                state = span.ending if span else "-"
                title = tasks[span.task_id].title if span and span.task_id in tasks else "-"
            used = totals.get(slot)
            steps = span.steps if span and slot not in self._running else (used.calls if used else 0)
            out.append(ProgressRow(slot, title, state, steps, used.tokens if used else 0,
                                   used.spent_micro_usd if used else 0, last_post.get(slot, "")[:60]))
        return out

    def _summary(self, tasks: list[Task]) -> ProgressSummary:
        """The run's totals for the progress line, from the goal's envelope and the agents' logs."""
        from swarmyard.plane.agent_errors import AgentLogs

        goal = self.store.get_goal(self._goal_id)
        errors = sorted(AgentLogs(self.run_dir / "agents").errors().values(), key=lambda e: e.at)
        return ProgressSummary(
            sum(1 for t in tasks if t.state is TaskState.DONE), sum(1 for t in tasks if t.state is TaskState.FAILED),
            len(tasks), goal.envelope.calls, goal.envelope.settled, goal.envelope.reserved,
            max(0.0, self.clock.now() - goal.created_at),
            tuple((e.slot, e.code, e.message) for e in errors[-3:]))

    async def _report_progress(self) -> None:
        """Every second, hand the live table a fresh set of rows (read off the event loop)."""
        assert self._on_progress is not None
        while True:
            self._on_progress(await asyncio.to_thread(self.progress))
            await asyncio.sleep(1.0)

    # -- the whole run --------------------------------------------------------------------------------------
    def _start_or_resume(self, resume: bool) -> tuple[Goal, RunState]:
        state_path = self.run_dir / "run.json"
        if resume:
            state = RunState.load(state_path)
            try:
                goal = self.store.get_goal(state.goal_id)
            except NotFoundError:
                raise UserError(f"run {self.run_id}: its goal {state.goal_id} is not in the store") from None
            if not state.tasks_made:
                self._make_first_tasks(goal, state, state_path)
            self.settle_goal(goal.id)
            self._lose_holds(goal.id)
            self.store.return_ended_slices(goal.id, every=True)  # their claims' holders died with the run
            wanted = str(self.config.evaluator.bundle_path) if self.config.evaluator else None
            if goal.evaluator != wanted:
                # a goal's scores and its one holdout belong to one bundle: a resume cannot swap it
                raise UserError(f"run {self.run_id} was made with evaluator {goal.evaluator or 'none'}, and the "
                                f"swarm file now names {wanted or 'none'}")
            return goal, state
        self.run_dir.mkdir(parents=True, exist_ok=True)
        goal = create_goal(self.store, self.config, self.clock)
        state = RunState(self.run_id, goal.id, self.store.url, tasks_made=False)
        state.save(state_path)  # from here the run can be resumed, whatever stops it
        self._make_first_tasks(goal, state, state_path)
        return goal, state

    def _make_first_tasks(self, goal: Goal, state: RunState, state_path: Path) -> None:
        """The first round's tasks (none under ``plan``: its planner makes them), each once: on a resume, those a
        store failure left unmade."""
        if self.config.tasks.plan is None:
            made = {(t.title, t.group) for t in self.store.list_tasks(goal.id)}
            create_round_tasks(self.store, goal, self.config, self.policy, 0, made=made)
        state.tasks_made = True
        state.save(state_path)

    async def run(self, *, resume: bool = False) -> RunResult:
        """Run (or continue) the swarm; machines are deleted whatever happens."""
        started = time.monotonic()
        from swarmyard.report.charts import prepare

        prepare()  # the report is written after the run's last event: its charts' library loads while agents work
        goal, state = self._start_or_resume(resume)
        self._goal_id = goal.id
        from swarmyard.audit.log import AuditLog, run_origin
        from swarmyard.swarm.run_secrets import log_key

        audit = AuditLog(self.store, self.run_dir / "audit", origin=run_origin(self.run_id),
                         witness=self.witness, every_n=self.audit_every_n,
                         key_path=log_key(self.run_id, self.run_dir / "audit"))
        ticker = asyncio.create_task(self._report_progress()) if self._on_progress is not None else None
        holdout: HoldoutOutcome | None = None
        try:
            synthesis = await self._work(goal, state, audit, ticker)
            if self.evaluator is not None and goal.evaluator is not None:
                # the run's end: its best search-scored artifact meets the holdout, once for this goal
                holdout = await asyncio.to_thread(self.evaluator.fire_holdout, self.store, goal)
        finally:
            if self.evaluator is not None:
                await asyncio.to_thread(self.evaluator.close)
        return self._finish(goal, audit, synthesis, holdout, time.monotonic() - started)

    async def _work(self, goal: Goal, state: RunState, audit: AuditLog,
                    ticker: asyncio.Task[None] | None) -> Finding | None:
        """Steps 1-4, and the machines' deletion whatever happens; the synthesis, if one was written."""
        synthesis: Finding | None = None
        try:
            if self.evaluator is not None and goal.evaluator is not None:
                await asyncio.to_thread(self.evaluator.start, goal.id)
            await self.launcher.start(goal)
            if self.config.tasks.plan is not None and state.planned is None:
                state.planned = await self._plan(goal, self.config.tasks.plan)
                state.save(self.run_dir / "run.json")
            if not self._round_tasks_exist(goal):
                create_round_tasks(self.store, goal, self.config, self.policy, 0, state.planned)
            for round_index in range(state.rounds_done, self.policy.rounds):
                if round_index > 0 and self._out_of_time_or_money(goal):
                    break  # rounds repeat up to the deadline or the budget; the lead still writes the synthesis
                if round_index > 0 and not self.store.list_tasks(goal.id, state=TaskState.PENDING):
                    self._consolidate(goal, round_index - 1)
                    create_round_tasks(self.store, goal, self.config, self.policy, round_index, state.planned)
                await self._work_round(goal)
                audit.maybe_checkpoint()  # every ``every_n`` events, as the run goes
                state.rounds_done = round_index + 1
                state.save(self.run_dir / "run.json")
            synthesis = await self._lead(goal)
            state.lead_done = synthesis is not None
            state.save(self.run_dir / "run.json")
        finally:
            if ticker is not None:
                ticker.cancel()
            await self.launcher.close()
        if ticker is not None and self._on_progress is not None:
            # the ticker said the run as it was up to a second ago: the last line says where it ended
            rows = await asyncio.to_thread(self.progress)
            if isinstance(rows, ProgressRows):
                rows.final = True
            self._on_progress(rows)
        return synthesis

    def _finish(self, goal: Goal, audit: AuditLog, synthesis: Finding | None, holdout: HoldoutOutcome | None,
                wall_s: float) -> RunResult:
        """Step 5: close the audit log with a checkpoint and write the report."""
        from swarmyard.audit.log import RUN_CLOSED

        extra: dict[str, str] = {}
        not_cosigned: AuditError | None = None
        try:
            # Nothing runs now that could write: the log's last leaf says so, and a resume refuses to sign any
            # event found after it (see swarmyard.audit.log).
            self.store.record_event(RUN_CLOSED, {"goal": goal.id, "run": self.run_id})
            try:
                audit.checkpoint()
            except AuditError as exc:
                # The log-signed checkpoint is on disk before the witness is asked; a witness that is gone or
                # refuses must not cost the run its report, but the report says so and the run fails after it.
                not_cosigned = exc
                extra["audit witness"] = f"last checkpoint NOT cosigned: {exc.message}"
            audit_root = base64.b64encode(audit.tree.root()).decode()
            audit_key = audit.verifier.vkey
            if audit.witness_verifier is not None and not extra:
                extra["audit witness"] = audit.witness_verifier.vkey
        finally:
            audit.close()
        data = self.report_data(goal, synthesis, wall_s)
        data = replace(data, audit_root=audit_root, audit_key=audit_key, extra={**data.extra, **extra})
        if self.evaluator is not None and goal.evaluator is not None:
            from swarmyard.swarm.scoring import run_scores

            rows = {s.worker_id: s.row for s in self.spans}
            data = replace(data, scores=run_scores(self.store, goal, self.evaluator.describe(), rows, holdout,
                                                   self.evaluator.public_key_b64))
        report = write_report(data, self.run_dir)
        if not_cosigned is not None:
            raise AuditError(f"run {self.run_id}: the witness did not cosign the last checkpoint "
                             f"({not_cosigned.message}); the log's own checkpoint and the report in {self.run_dir} "
                             f"are written; resume the run once the witness is back",
                             run_id=self.run_id) from not_cosigned
        # a launcher without machines (a test's) has nothing to scan
        keys_found: int | None = getattr(self.launcher, "keys_found", None)
        keys_held = bool(getattr(self.launcher, "keys_held", False))
        return RunResult(self.run_id, goal.id, synthesis, report, data, list(self.spans), keys_found, keys_held)

    def report_data(self, goal: Goal, synthesis: Finding | None, wall_s: float) -> ReportData:
        """Everything the report shows, read back from the store."""
        return ReportData(
            self.run_id,
            self.store.get_goal(goal.id),
            tuple(self.store.list_tasks(goal.id)),
            tuple(self.store.read_findings(goal.id, limit=10_000)),
            tuple(self.store.read_board(goal.id, limit=10_000)),
            tuple(self.store.list_reservations(goal.id)),
            tuple(self.spans),
            synthesis,
            wall_s=wall_s,
            task_scores=self.store.best_scores(goal.id, by="task"),
        )

