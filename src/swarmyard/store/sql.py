"""``SqlStore``: the one implementation of the Store protocol, on either engine.

Why one class for two engines: the claim, fence and ledger rules must be the same everywhere, so they are
written once as conditional statements; the engines differ only in where the fencing counter lives (a counter
row under SQLite's single writer, a sequence in PostgreSQL), in ``FOR UPDATE SKIP LOCKED`` and in how committed
events are sequenced into audit leaves.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from swarmyard.canonical import canonical_json
from swarmyard.clock import Clock, SystemClock
from swarmyard.domain import (
    FINDING_TRANSITIONS,
    Artifact,
    Citation,
    CitationKind,
    Claim,
    Event,
    Finding,
    FindingStatus,
    Goal,
    GoalSpec,
    Post,
    PostKind,
    Price,
    Quotas,
    Reservation,
    ReservationState,
    Task,
    TaskSpec,
    TaskState,
    Worker,
)
from swarmyard.errors import (
    BudgetExceededError,
    CallCapExceededError,
    ConflictError,
    DeadlinePassedError,
    DepthExceededError,
    DuplicateInFlightError,
    DuplicateOfUnknownError,
    IllegalTransitionError,
    InvalidInputError,
    InvalidTokenError,
    LeaseExpiredError,
    MigrationError,
    NoCallsLeftError,
    NotFoundError,
    PayloadTooLargeError,
    QuotaExceededError,
    StaleFencingTokenError,
)
from swarmyard.ids import new_id
from swarmyard.money import micro_usd
from swarmyard.store import rows
from swarmyard.store.directions import DirectionStore
from swarmyard.store.engine import Cursor, Engine
from swarmyard.store.protocol import (
    DEFAULT_ARTIFACT_LIMIT_BYTES,
    DEFAULT_FINDING_LIMIT_BYTES,
    DEFAULT_POST_LIMIT_BYTES,
    DEFAULT_QUOTAS,
)
from swarmyard.store.replicas import ReplicaStore
from swarmyard.store.schema import MIGRATIONS, POSTGRES_TYPES, SQLITE_TYPES

log = logging.getLogger(__name__)
E = TypeVar("E")

POLICIES = frozenset({"independent", "team", "explore", "groups"})
BROADCAST_GROUP = "*"  # posts in this group are visible to every group
_MAX_TEXT = 1_000_000
_MAX_SEQ = 2**63 - 1  # a sequence number is a 64-bit integer on both engines


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _int(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{field} must be an integer, got {type(value).__name__}", field=field)
    if value < minimum:
        raise InvalidInputError(f"{field} must be at least {minimum}, got {value}", field=field)
    return value


def _text(value: object, field: str, *, allow_empty: bool = False, limit: int = _MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{field} must be a string, got {type(value).__name__}", field=field)
    if not allow_empty and not value.strip():
        raise InvalidInputError(f"{field} must not be empty", field=field)
    size = len(value.encode())
    if size > limit:
        raise PayloadTooLargeError(field, size, limit)
    return value


def _tokens(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{field} must be a whole number of tokens, zero or more, got {value!r}", field=field)
    return value


def _enum(kind: type[E], value: object, field: str) -> E:
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        raise InvalidInputError(f"{field} has no value {value!r}", field=field) from None


# A hold's charge on its task's row, and the rules it must pass there (parameters: amount, amount; then
# amount, now). Inside a live slice (the one carved at this claim) the hold is also counted in the slice and
# bounded by it, and the goal's deadline is read here (a read: no lock on the goal's row).
_IN_SLICE = "slice_token = fencing_token"
_CHARGE = (f"reserved = reserved + ?, calls = calls + 1, slice_reserved = slice_reserved + CASE WHEN {_IN_SLICE} "
           f"THEN ? ELSE 0 END, slice_calls = slice_calls + CASE WHEN {_IN_SLICE} THEN 1 ELSE 0 END")
_AFFORDS = ("budget - reserved - settled >= ? AND (call_cap = 0 OR calls < call_cap) AND (slice_token IS NULL OR "
            f"NOT {_IN_SLICE} OR slice - slice_reserved - slice_settled >= ?) AND NOT EXISTS (SELECT 1 FROM goals g "
            "WHERE g.id = tasks.goal_id AND g.deadline <= ?)")
_SLICE_OF_HOLD = f"CASE WHEN {_IN_SLICE} THEN slice_token END"
# A new hold's row (parameters: id, goal, task, model, amount, method, created, updated, worker, plane, body digest,
# slice token). The checked forms insert it only when no call of the same body of the same worker is lost
# (``unknown``) or, with a plane, in flight on another replica (parameters then: worker, digest, and worker,
# digest, plane): one statement, each check an index probe of its partial index. CAST: under PostgreSQL an
# untyped NULL selected into a BIGINT column would be taken for text.
_HOLD_ROW = (f"INSERT INTO reservations ({rows.RESERVATION_COLS}, plane_id, body_digest, slice_token) SELECT ?, ?, ?, "
             "?, ?, NULL, 'held', ?, ?, ?, 0, 0, 0, ?, ?, ?, CAST(? AS BIGINT)")
_INSERT_HOLD = _HOLD_ROW
_UNLESS_LOST = (" WHERE NOT EXISTS (SELECT 1 FROM reservations WHERE worker_id = ? AND body_digest = ? AND "
                "state = 'unknown')")
_INSERT_HOLD_UNLESS_LOST = _HOLD_ROW + _UNLESS_LOST + " RETURNING 1"
# A hold's end (parameters: state, actual, actual, actual, updated, input tokens, output tokens, id): the overage is
# what the actual cost passed the hold by (none for a release), and the row as it now is comes back, then the slice
# token the hold was charged to.
_FINISH_HELD = ("UPDATE reservations SET state = ?, actual = ?, overage = CASE WHEN ? > amount THEN ? - amount "
                "ELSE 0 END, updated_at = ?, input_tokens = ?, output_tokens = ? WHERE id = ? AND state = 'held' "
                f"RETURNING {rows.RESERVATION_COLS}, slice_token")
#: The same from the state given as one more parameter.
_FINISH_FROM = _FINISH_HELD.replace("state = 'held'", "state = ?")
_INSERT_HOLD_UNLESS_LOST_OR_BUSY = (_HOLD_ROW + _UNLESS_LOST + " AND NOT EXISTS (SELECT 1 FROM reservations WHERE "
                                    "worker_id = ? AND body_digest = ? AND state = 'held' AND plane_id <> ?) RETURNING 1")
# A claimable task (a row of ``tasks``) that has a model call left: one of its own cap, or, with no cap of its own,
# one of its goal's not yet made or allocated to another task (a goal with no cap: always).
_HAS_CALLS = ("(calls < call_cap OR (call_cap = 0 AND NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = tasks.goal_id "
              "AND g.call_cap > 0 AND (g.allocated_calls >= g.call_cap OR g.calls + g.escrowed_calls >= g.call_cap))))")
# ... and one that no live task of its goal could give calls back to (a live task's unused calls go back when it
# ends, to its nearest live ancestor or to the goal): a task with none left and this true can never make a call.
_NO_CALLS_EVER = (f"NOT {_HAS_CALLS} AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.goal_id = tasks.goal_id AND "
                  "o.id <> tasks.id AND o.state IN ('pending', 'claimed') AND o.call_cap > o.calls)")


def claim_pick(filters: str = "") -> str:
    """SQLite: the best claimable task id, as the better of two index-served picks (pending, expired).

    Why not one ``state = 'pending' OR (... lease_expires_at <= ?)``: SQLite cannot serve that OR with an
    index in priority order, so it would read every claimed row of the goal on every claim. Parameters:
    goal, *filters, goal, now, *filters.
    """
    best = "ORDER BY priority DESC, n LIMIT 1"
    return (f"SELECT id FROM (SELECT * FROM (SELECT id, priority, n FROM tasks WHERE goal_id = ? AND "
            f"state = 'pending'{filters} {best}) UNION ALL SELECT * FROM (SELECT id, priority, n FROM tasks "
            f"WHERE goal_id = ? AND state = 'claimed' AND lease_expires_at <= ?{filters} {best})) {best}")


class SqlStore(DirectionStore, ReplicaStore):
    """The Store protocol on SQLite or PostgreSQL."""

    def __init__(self, url: str, engine: Engine, *, clock: Clock | None = None, blob_dir: Path,
                 post_limit: int = DEFAULT_POST_LIMIT_BYTES, finding_limit: int = DEFAULT_FINDING_LIMIT_BYTES,
                 artifact_limit: int = DEFAULT_ARTIFACT_LIMIT_BYTES, quotas: Quotas = DEFAULT_QUOTAS) -> None:
        """``quotas``: what a goal may store when its spec names none (and for goals older than quotas)."""
        self.url = url
        self._e = engine
        self.single_writer = not engine.postgres
        self._clock = clock or SystemClock()
        self.blob_dir = blob_dir
        self.post_limit = post_limit
        self.finding_limit = finding_limit
        self.artifact_limit = artifact_limit
        self.quotas = quotas
        self._migrate()

    # -- plumbing -------------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        types = POSTGRES_TYPES if self._e.postgres else SQLITE_TYPES
        with self._e.write() as cur:
            if self._e.postgres:
                cur.execute("SELECT pg_advisory_xact_lock(727001)")
            cur.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            cur.execute("SELECT value FROM meta WHERE key = 'schema_version'")
            row = cur.fetchone()
            version = int(row[0]) if row else 0
            if version > len(MIGRATIONS):
                raise MigrationError(f"store schema version {version} is newer than this swarmyard "
                                     f"({len(MIGRATIONS)}); upgrade swarmyard")
            for migration in MIGRATIONS[version:]:
                for statement in migration(types, self._e.postgres):
                    cur.execute(statement)
            if version < len(MIGRATIONS):
                cur.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                            "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(len(MIGRATIONS)),))

    def close(self) -> None:
        """Release connections."""
        self._e.close()

    def nowait(self) -> AbstractContextManager[bool]:
        """A block in which this thread's writes fail with ``StoreBusyError`` rather than wait for the write
        lock; it yields False where the engine cannot do that (PostgreSQL), and writes wait as usual."""
        return self._e.nowait()

    def _now(self) -> float:
        return self._clock.now()

    @staticmethod
    def _event(cur: Cursor, kind: str, now: float, data: dict[str, Any]) -> None:
        body = canonical_json({"kind": kind, "at_ms": _ms(now), **data})
        cur.execute("INSERT INTO events (kind, body, created_at) VALUES (?, ?, ?)", (kind, body, now))

    @staticmethod
    def _one(cur: Cursor, sql: str, params: Sequence[Any]) -> Any:
        cur.execute(sql, params)
        return cur.fetchone()

    def _goal_row(self, cur: Cursor, goal_id: str) -> Goal:
        """The goal as before escrow: its row's reserved, settled and calls plus what its live slices hold, spent
        and counted (a hold inside a slice is charged to its task's row only, until the slice is returned)."""
        # one statement, so one snapshot: a slice returned meanwhile is counted once, on one side or the other
        live = "FROM tasks t WHERE t.goal_id = goals.id AND t.slice_token IS NOT NULL"
        row = self._one(cur, f"SELECT {rows.GOAL_COLS}, (SELECT COALESCE(SUM(t.slice_reserved), 0) {live}), "
                             f"(SELECT COALESCE(SUM(t.slice_settled), 0) {live}), "
                             f"(SELECT COALESCE(SUM(t.slice_calls), 0) {live}) FROM goals WHERE id = ?", (goal_id,))
        if row is None:
            raise NotFoundError("goal", goal_id)
        # int(): PostgreSQL's SUM of BIGINT is NUMERIC (a Decimal), which JSON and the dashboard do not take
        return rows.goal((*row[:9], int(row[9]) + int(row[12]), int(row[10]) + int(row[13]),
                          int(row[11]) + int(row[14])))

    def _task_row(self, cur: Cursor, task_id: str, *, lock: bool = False) -> Task:
        suffix = " FOR UPDATE" if lock and self._e.postgres else ""
        row = self._one(cur, f"SELECT {rows.TASK_COLS} FROM tasks WHERE id = ?{suffix}", (task_id,))
        if row is None:
            raise NotFoundError("task", task_id)
        return rows.task(row)

    def _fence(self, cur: Cursor, task_id: str, token: object, now: float) -> Task:
        """The task, locked for this transaction, if ``token`` is its live claim; otherwise a typed refusal."""
        token = _int(token, "fencing_token", minimum=1)
        task = self._task_row(cur, task_id, lock=True)
        self._check_claim(task, token, now)
        return task

    @staticmethod
    def _check_claim(task: Task, token: int, now: float) -> None:
        if task.fencing_token != token:
            raise StaleFencingTokenError(task.id, token, task.fencing_token)
        if task.state is not TaskState.CLAIMED or task.lease_expires_at is None or task.lease_expires_at <= now:
            raise LeaseExpiredError(task.id, token, task.fencing_token)

    def _refuse_claim_write(self, cur: Cursor, task_id: str, token: int, now: float, target: TaskState) -> None:
        """Explain why a conditional claim update matched no row."""
        task = self._task_row(cur, task_id)
        self._check_claim(task, token, now)
        raise IllegalTransitionError("task", task_id, task.state.value, target.value)

    # -- goals and tasks ------------------------------------------------------------------------------------
    def create_goal(self, spec: GoalSpec) -> Goal:
        """Create a goal and its envelope."""
        objective = _text(spec.objective, "objective")
        budget = micro_usd(spec.budget_micro_usd, field="budget_micro_usd")
        call_cap = _int(spec.call_cap, "call_cap")
        max_depth = _int(spec.max_depth, "max_depth")
        if spec.deadline is not None and (isinstance(spec.deadline, bool)
                                          or not isinstance(spec.deadline, int | float)):
            raise InvalidInputError("deadline must be a time in seconds", field="deadline")
        if spec.policy not in POLICIES:
            raise InvalidInputError(f"policy must be one of {sorted(POLICIES)}, got {spec.policy!r}", field="policy")
        quotas = spec.quotas or self.quotas
        for name in ("artifact_bytes", "task_artifact_bytes", "board_posts", "board_bytes"):
            _int(getattr(quotas, name), f"quotas.{name}")
        goal_id, now = new_id("goal"), self._now()
        with self._e.write() as cur:
            cur.execute("INSERT INTO goals (id, objective, budget, call_cap, deadline, max_depth, policy, evaluator,"
                        " created_at, artifact_quota, task_artifact_quota, post_quota, post_bytes_quota)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (goal_id, objective, budget, call_cap, spec.deadline, max_depth, spec.policy,
                         spec.evaluator, now, quotas.artifact_bytes, quotas.task_artifact_bytes, quotas.board_posts,
                         quotas.board_bytes))
            self._event(cur, "goal.created", now, {"goal": goal_id, "objective": objective, "budget": budget,
                                                   "call_cap": call_cap, "max_depth": max_depth,
                                                   "policy": spec.policy,
                                                   "deadline_ms": None if spec.deadline is None
                                                   else _ms(spec.deadline)})
            return self._goal_row(cur, goal_id)

    def get_goal(self, goal_id: str) -> Goal:
        """The goal, or ``NotFoundError``."""
        with self._e.read() as cur:
            return self._goal_row(cur, goal_id)

    def list_goals(self) -> list[Goal]:
        """Every goal, oldest first."""
        with self._e.read() as cur:
            cur.execute("SELECT id FROM goals ORDER BY created_at, id")
            return [self._goal_row(cur, str(r[0])) for r in cur.fetchall()]

    def _validate_task(self, spec: TaskSpec) -> tuple[str, str, str, int, int, int]:
        title = _text(spec.title, "title")
        prompt = _text(spec.prompt, "prompt", allow_empty=True)
        group = _text(spec.group, "group", limit=200)
        if group == BROADCAST_GROUP:
            raise InvalidInputError(f"group {BROADCAST_GROUP!r} is reserved for broadcasts", field="group")
        budget = micro_usd(spec.budget_micro_usd, field="budget_micro_usd")
        call_cap = _int(spec.call_cap, "call_cap")
        priority = _int(spec.priority, "priority", minimum=-(2**31))
        return title, prompt, group, budget, call_cap, priority

    def _insert_task(self, cur: Cursor, goal_id: str, parent_id: str | None, depth: int, spec: TaskSpec,
                     now: float) -> Task:
        title, prompt, group, budget, call_cap, priority = self._validate_task(spec)
        task_id = new_id("task")
        cur.execute("INSERT INTO tasks (id, goal_id, parent_id, depth, group_name, title, prompt, priority, state,"
                    " created_at, budget, call_cap) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (task_id, goal_id, parent_id, depth, group, title, prompt, priority, TaskState.PENDING.value,
                     now, budget, call_cap))
        self._event(cur, "task.created", now, {"goal": goal_id, "task": task_id, "parent": parent_id,
                                               "depth": depth, "group": group, "title": title, "budget": budget,
                                               "call_cap": call_cap})
        return self._task_row(cur, task_id)

    def create_task(self, goal_id: str, spec: TaskSpec) -> Task:
        """Create a top-level task; its envelope is carved from the goal's unallocated budget, and, when the goal
        caps calls, its own call cap from the goal's unallocated calls (``CallCapExceededError`` when they cannot
        cover it). A task with no cap of its own on such a goal takes each call from the unallocated ones."""
        if spec.parent_id is not None:
            raise InvalidInputError("create_task makes top-level tasks; use delegate for sub-tasks",
                                    field="parent_id")
        budget = micro_usd(spec.budget_micro_usd, field="budget_micro_usd")
        now = self._now()
        with self._e.write() as cur:
            calls = self._validate_task(spec)[4]
            cur.execute("UPDATE goals SET allocated = allocated + ?, allocated_calls = allocated_calls + CASE WHEN "
                        "call_cap > 0 THEN ? ELSE 0 END WHERE id = ? AND budget - allocated >= ? AND "
                        "(call_cap = 0 OR call_cap - allocated_calls >= ?) RETURNING allocated",
                        (budget, calls, goal_id, budget, calls))
            if cur.fetchone() is None:
                goal = self._goal_row(cur, goal_id)
                allocated, allocated_calls = self._one(cur, "SELECT allocated, allocated_calls FROM goals "
                                                            "WHERE id = ?", (goal_id,))
                if goal.budget_micro_usd - int(allocated) < budget:
                    raise BudgetExceededError(f"goal {goal.id} (unallocated)", budget,
                                              goal.budget_micro_usd - int(allocated))
                raise CallCapExceededError(f"goal {goal.id} (unallocated: {goal.call_cap - int(allocated_calls)} "
                                           "calls left)", goal.call_cap, asked=calls)
            return self._insert_task(cur, goal_id, None, 0, spec, now)

    def delegate(self, parent_id: str, token: int, spec: TaskSpec) -> Task:
        """Create a sub-task under a claimed task, one level deeper, its envelope carved from the parent's."""
        budget = micro_usd(spec.budget_micro_usd, field="budget_micro_usd")
        self._validate_task(spec)
        now = self._now()
        with self._e.write() as cur:
            parent = self._fence(cur, parent_id, token, now)
            goal = self._goal_row(cur, parent.goal_id)
            if parent.depth + 1 > goal.max_depth:
                raise DepthExceededError(parent_id, parent.depth + 1, goal.max_depth)
            # carved from the parent's live slice when it has one: the slice gives it back to the goal, whose
            # envelope the child's own claim carves it from again. On a goal that caps calls the child's cap is
            # carved from its parent's (the parent keeps one at least: a cap of 0 means none of its own), or,
            # under a parent with no cap of its own, from the goal's unallocated calls.
            calls = _int(spec.call_cap, "call_cap") if goal.call_cap else 0
            of_parent, of_goal = (calls, 0) if parent.envelope.call_cap else (0, calls)
            in_slice = "slice_token = fencing_token"
            cur.execute(f"UPDATE tasks SET budget = budget - ?, slice = slice - CASE WHEN {in_slice} THEN ? ELSE 0 "
                        f"END, call_cap = call_cap - ?, slice_call_cap = slice_call_cap - CASE WHEN {in_slice} "
                        f"THEN ? ELSE 0 END WHERE id = ? AND budget - reserved - settled >= ? AND (slice_token IS "
                        f"NULL OR NOT {in_slice} OR slice - slice_reserved - slice_settled >= ?) AND "
                        f"(? = 0 OR (call_cap - calls >= ? AND call_cap > ?)) "
                        f"RETURNING CASE WHEN {in_slice} THEN 1 ELSE 0 END",
                        (budget, budget, of_parent, of_parent, parent_id, budget, budget, of_parent, of_parent,
                         of_parent))
            carved = cur.fetchone()
            if carved is None:
                available = min(parent.envelope.available, self._slice_available(cur, parent_id))
                if available < budget:
                    raise BudgetExceededError(f"task {parent_id}", budget, available)
                left = parent.envelope.call_cap - parent.envelope.calls
                raise CallCapExceededError(f"task {parent_id} ({left} calls left, and it keeps one)",
                                           parent.envelope.call_cap, asked=of_parent)
            escrowed, escrowed_calls = (budget, of_parent) if carved[0] else (0, 0)
            if (escrowed or escrowed_calls or of_goal) and self._one(
                    cur, "UPDATE goals SET escrowed = escrowed - ?, escrowed_calls = escrowed_calls - ?, "
                         "allocated_calls = allocated_calls + ? WHERE id = ? AND (? = 0 OR call_cap - allocated_calls >= ?) "
                         "RETURNING id", (escrowed, escrowed_calls, of_goal, parent.goal_id, of_goal, of_goal)) is None:
                left = self._one(cur, "SELECT call_cap - allocated_calls FROM goals WHERE id = ?",
                                 (parent.goal_id,))[0]
                raise CallCapExceededError(f"goal {parent.goal_id} (unallocated: {int(left)} calls left)",
                                           goal.call_cap, asked=of_goal)
            child = TaskSpec(title=spec.title, prompt=spec.prompt, group=spec.group, budget_micro_usd=budget,
                             call_cap=spec.call_cap, parent_id=parent_id, priority=spec.priority)
            return self._insert_task(cur, parent.goal_id, parent_id, parent.depth + 1, child, now)

    def get_task(self, task_id: str) -> Task:
        """The task, or ``NotFoundError``."""
        with self._e.read() as cur:
            return self._task_row(cur, task_id)

    def list_tasks(self, goal_id: str, *, state: TaskState | None = None, group: str | None = None) -> list[Task]:
        """A goal's tasks, in creation order."""
        sql, params = f"SELECT {rows.TASK_COLS} FROM tasks WHERE goal_id = ?", [goal_id]
        if state is not None:
            sql += " AND state = ?"
            params.append(_enum(TaskState, state, "state").value)
        if group is not None:
            sql += " AND group_name = ?"
            params.append(group)
        with self._e.read() as cur:
            cur.execute(sql + " ORDER BY n", params)
            return [rows.task(r) for r in cur.fetchall()]

    # -- escrow ---------------------------------------------------------------------------------------------
    # Lock order, everywhere: a reservation, then its task, then the goal; never the other way.

    def _carve(self, cur: Cursor, task_id: str, token: int, now: float) -> bool:
        """Move the claim's slice from the goal's envelope to the task's row: what the task may still spend, and,
        when the goal caps calls, the calls its own cap has left. Those were allocated to it when it was made (or
        delegated), so a slice takes no call a peer could make. A task with no cap of its own on such a goal gets
        no slice: its calls come from the goal's unallocated ones, counted on the goal's row. So does every task
        of a goal whose tasks' caps add up to more than its cap (a store older than call allocation): a carved
        cap could take its peers' calls. False when no slice was carved; its holds then charge the goal's row as
        well, which is correct, only slower."""
        self._return_slice(cur, task_id, None, now, stale_for=token)
        goal_cap = "(SELECT g.call_cap FROM goals g WHERE g.id = tasks.goal_id)"
        row = self._one(cur, "UPDATE tasks SET slice_token = ?, slice = budget - reserved - settled, "
                             f"slice_call_cap = CASE WHEN {goal_cap} = 0 THEN 0 ELSE call_cap - calls END, "
                             "slice_reserved = 0, slice_settled = 0, slice_calls = 0 "
                             "WHERE id = ? AND fencing_token = ? AND state = 'claimed' AND slice_token IS NULL "
                             f"AND (call_cap > 0 OR {goal_cap} = 0) RETURNING goal_id, slice, slice_call_cap",
                        (token, task_id, token))
        if row is None:
            return False
        goal_id, amount, calls = str(row[0]), int(row[1]), int(row[2])
        if self._one(cur, "UPDATE goals SET escrowed = escrowed + ?, escrowed_calls = escrowed_calls + ? "
                          "WHERE id = ? AND budget - reserved - settled - escrowed >= ? AND (call_cap = 0 OR "
                          "(calls + escrowed_calls + ? <= call_cap AND allocated_calls <= call_cap)) RETURNING id",
                     (amount, calls, goal_id, amount, calls)) is None:
            cur.execute("UPDATE tasks SET slice_token = NULL WHERE id = ?", (task_id,))
            return False
        # the claim's token is named slice_token: a slice's events are the store's moves, not writes of the claim
        self._event(cur, "task.slice_carved", now, {"goal": goal_id, "task": task_id, "slice_token": token,
                                                    "amount": amount, "calls": calls})
        return True

    def _return_slice(self, cur: Cursor, task_id: str, token: int | None, now: float, *,
                      stale_for: int | None = None) -> int | None:
        """Return the task's live slice to the goal (the one of claim ``token``; any with ``token`` None; any but
        claim ``stale_for``'s with that set): the goal's row takes what the slice holds, spent and counted, and
        gives up the slice. Exactly once: the conditional update of ``slice_token`` matches one transaction only.
        The returned amount (what the slice did not spend or hold), or None when no slice was live."""
        if token is None:
            lock = " FOR UPDATE" if self._e.postgres else ""
            live = self._one(cur, f"SELECT slice_token FROM tasks WHERE id = ?{lock}", (task_id,))
            if live is None or live[0] is None or live[0] == stale_for:
                return None
            token = int(live[0])
        row = self._one(cur, "UPDATE tasks SET slice_token = NULL WHERE id = ? AND slice_token = ? RETURNING goal_id, "
                             "slice, slice_call_cap, slice_reserved, slice_settled, slice_calls", (task_id, token))
        if row is None:
            return None
        goal_id, amount, call_cap, reserved, settled, calls = str(row[0]), *(int(v) for v in row[1:])
        cur.execute("UPDATE goals SET escrowed = escrowed - ?, escrowed_calls = escrowed_calls - ?, "
                    "reserved = reserved + ?, settled = settled + ?, calls = calls + ? WHERE id = ?",
                    (amount, call_cap, reserved, settled, calls, goal_id))
        unspent = amount - reserved - settled
        self._event(cur, "task.slice_returned", now, {"goal": goal_id, "task": task_id, "slice_token": token,
                                                      "returned": unspent,
                                                      "reserved": reserved, "settled": settled, "calls": calls})
        return unspent

    def _slice_available(self, cur: Cursor, task_id: str) -> int:
        """What the task's live slice (of its current claim) can still hold; its whole envelope if none is live."""
        row = self._one(cur, "SELECT CASE WHEN slice_token = fencing_token THEN slice - slice_reserved - "
                             "slice_settled ELSE budget - reserved - settled END FROM tasks WHERE id = ?", (task_id,))
        return 0 if row is None else int(row[0])

    def return_ended_slices(self, goal_id: str | None = None, *, every: bool = False) -> list[str]:
        """Return the slices whose claim ended without returning them (its lease expired, its holder died): the
        sweep of the replicas and a resumed run call this. Each in its own transaction, each exactly once
        (a concurrent sweep or re-claim finds ``slice_token`` already cleared); the ids of the tasks returned.

        ``every``: the goal's live claims' slices too (a resumed run: the process that held them died; a claim
        that lives on charges the goal's row, which is correct, only slower)."""
        now = self._now()
        ended = "" if every else " AND (state <> 'claimed' OR fencing_token <> slice_token OR lease_expires_at <= ?)"
        sql = f"SELECT id, slice_token FROM tasks WHERE slice_token IS NOT NULL{ended}"
        params: list[Any] = [] if every else [now]
        if goal_id is not None:
            sql += " AND goal_id = ?"
            params.append(goal_id)
        with self._e.read() as cur:
            cur.execute(sql, params)
            found = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
        returned = []
        for task_id, token in found:
            with self._e.write() as cur:
                # ``slice_token = token`` in the update makes it once; the claim's end is re-read under the lock
                if not every and self._one(cur, "SELECT 1 FROM tasks WHERE id = ? AND state = 'claimed' AND "
                                                "fencing_token = ? AND lease_expires_at > ?"
                                           + (" FOR UPDATE" if self._e.postgres else ""),
                                           (task_id, token, now)) is not None:
                    continue
                if self._return_slice(cur, task_id, token, now) is not None:
                    returned.append(task_id)
        return returned

    # -- claims ---------------------------------------------------------------------------------------------
    def claim(self, goal_id: str, worker_id: str, lease_s: float, *, task_id: str | None = None,
              group: str | None = None, min_slice_micro_usd: int = 0, calls: bool = False) -> Claim | None:
        """Claim ``task_id`` or any claimable task of the goal (in ``group``); ``None`` if nothing is claimable.

        The claim carves the task's slice from the goal's envelope (see ``_carve``). ``calls``: the claimer will
        make model calls (so does one that names ``min_slice_micro_usd``, one call's worst case). A task that could
        not make one is skipped: its money cannot afford the least call, or it has no call left (its own cap made,
        or, with no cap of its own, its goal's all made or allocated). When no task is claimable but such ones,
        the best of them is named in the refusal, ``BudgetExceededError`` or its kind ``NoCallsLeftError``,
        rather than at its first call (the claim is not made). A claimer that makes no call (one that claims to
        end a task) is handed any claimable task."""
        worker_id = _text(worker_id, "worker_id", limit=200)
        if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not 0 < lease_s <= 86400:
            raise InvalidInputError("lease_s must be a number of seconds in (0, 86400]", field="lease_s")
        min_slice = micro_usd(min_slice_micro_usd, field="min_slice_micro_usd")
        now = self._now()
        expires = now + lease_s
        claimable = "(state = 'pending' OR (state = 'claimed' AND lease_expires_at <= ?))"
        filters, fparams = "", list[Any]()
        if task_id is not None:
            filters += " AND id = ?"
            fparams.append(task_id)
        if group is not None:
            filters += " AND group_name = ?"
            fparams.append(group)
        plain = (filters, list(fparams))
        calls = calls or bool(min_slice)
        if min_slice:
            filters += " AND budget - reserved - settled >= ?"
            fparams.append(min_slice)
        if calls:
            filters += f" AND {_HAS_CALLS}"
        if self._e.postgres:
            # SKIP LOCKED must see the whole claimable set in one scan (it cannot be split by UNION).
            pick = (f"SELECT id FROM tasks WHERE goal_id = ? AND {claimable}{filters} "
                    "ORDER BY priority DESC, n LIMIT 1 FOR UPDATE SKIP LOCKED")
            claim = self._claim_pg(goal_id, worker_id, now, expires, claimable, pick, [goal_id, now, *fparams],
                                   task_id)
            if claim is None and calls:
                with self._e.read() as cur:
                    self._refuse_claim(cur, goal_id, claimable, plain, now, min_slice)
            if claim is not None:
                # a second transaction: the claim stays one statement; a crash in between leaves the task
                # without a slice, and its holds charge the goal's row too (correct, only slower)
                with self._e.write() as cur:
                    self._carve(cur, claim.task.id, claim.token, now)
            return claim
        pick = claim_pick(filters)
        params = [goal_id, *fparams, goal_id, now, *fparams]
        with self._e.write() as cur:
            token_params = [self._one(cur, "UPDATE counters SET value = value + 1 WHERE name = 'fencing' "
                                           "RETURNING value", ())[0]]
            cur.execute(f"UPDATE tasks SET state = 'claimed', fencing_token = ?, worker_id = ?, "
                        f"lease_expires_at = ?, revision = revision + 1, attempts = attempts + 1 "
                        f"WHERE id = ({pick}) AND {claimable} RETURNING {rows.TASK_COLS}",
                        [*token_params, worker_id, expires, *params, now])
            row = cur.fetchone()
            if row is None:
                if task_id is not None:
                    self._task_row(cur, task_id)  # NotFoundError for an unknown id
                if calls:
                    self._refuse_claim(cur, goal_id, claimable, plain, now, min_slice)
                return None
            task = rows.task(row)
            assert task.fencing_token is not None
            self._event(cur, "task.claimed", now, {"goal": goal_id, "task": task.id, "worker": worker_id,
                                                   "token": task.fencing_token, "expires_ms": _ms(expires)})
            self._carve(cur, task.id, task.fencing_token, now)
            return Claim(task=task, token=task.fencing_token, worker_id=worker_id, expires_at=expires)

    @staticmethod
    def _refuse_claim(cur: Cursor, goal_id: str, claimable: str, plain: tuple[str, list[Any]], now: float,
                      min_slice: int) -> None:
        """Nothing was claimed: when no claimable task can make a call (too small for one, or no call left), name
        the best of them. One that could (taken or locked by a concurrent claim: PostgreSQL's pick skips locked
        rows) means nothing is claimable for now, not a refusal."""
        filters, params = plain
        money = "budget - reserved - settled"
        cur.execute(f"SELECT id, {money}, CASE WHEN {_HAS_CALLS} THEN 1 ELSE 0 END, call_cap, goal_id FROM tasks "
                    f"WHERE goal_id = ? AND {claimable}{filters} ORDER BY ({money} >= ? AND {_HAS_CALLS}) DESC, "
                    "priority DESC, n LIMIT 1", [goal_id, now, *params, min_slice])
        row = cur.fetchone()
        if row is None:
            return
        available, has_calls = int(row[1]), bool(int(row[2]))
        if available < min_slice:
            raise BudgetExceededError(f"task {row[0]} (its slice at claim)", min_slice, available)
        if not has_calls:
            cap = int(row[3])
            if not cap:
                cap = int(SqlStore._one(cur, "SELECT call_cap FROM goals WHERE id = ?", (row[4],))[0])
            raise NoCallsLeftError(f"task {row[0]} (its calls at claim)", cap,
                                   goal_id=None if int(row[3]) else str(row[4]), needed=min_slice,
                                   available=available)

    def _claim_pg(self, goal_id: str, worker_id: str, now: float, expires: float, claimable: str, pick: str,
                  params: list[Any], task_id: str | None) -> Claim | None:
        """The claim and its audit event as ONE statement: one round trip, atomic on its own.

        The event body is spliced from canonical JSON fragments made here (``canonical_json`` of every value
        known before the statement) around the two values only the statement knows: the task id (ours, so plain
        ``[a-z0-9_]``) and the fencing token (an integer). Keys are in sorted order, so the bytes are exactly
        what ``canonical_json`` would give for the whole object; a contract test checks it.
        """
        head = canonical_json({"at_ms": _ms(now), "expires_ms": _ms(expires), "goal": goal_id,
                               "kind": "task.claimed"}).decode()[:-1] + ',"task":"'
        tail = ',"worker":' + canonical_json(worker_id).decode() + "}"
        sql = (f"WITH c AS (UPDATE tasks SET state = 'claimed', fencing_token = nextval('fencing_seq'), "
               f"worker_id = ?, lease_expires_at = ?, revision = revision + 1, attempts = attempts + 1 "
               f"WHERE id = ({pick}) AND {claimable} RETURNING {rows.TASK_COLS}), "
               f"e AS (INSERT INTO events (kind, body, created_at) SELECT 'task.claimed', "
               f"convert_to(?::text || c.id || '\",\"token\":' || c.fencing_token::text || ?::text, 'UTF8'), ? FROM c) "
               f"SELECT * FROM c")
        # autocommit: the single statement is its own transaction; a write transaction instead when a tool call
        # folded its rate token's take into this thread's next write (see ReplicaStore.rate_token_folded)
        with (self._e.write() if self._e.folding() else self._e.read()) as cur:
            cur.execute(sql, [worker_id, expires, *params, now, head, tail, now])
            row = cur.fetchone()
            if row is None:
                if task_id is not None:
                    self._task_row(cur, task_id)  # NotFoundError for an unknown id
                return None
        task = rows.task(row)
        assert task.fencing_token is not None
        return Claim(task=task, token=task.fencing_token, worker_id=worker_id, expires_at=expires)

    def _claim_update(self, task_id: str, token: object, set_sql: str, set_params: Sequence[Any],
                      target: TaskState, event: str, data: dict[str, Any], *,
                      held_until: float | None = None) -> Task:
        """One conditional update of a live claim; the directions it holds follow (``held_until``: the
        renewed lease's expiry, ``None`` when the claim ends)."""
        token = _int(token, "fencing_token", minimum=1)
        now = self._now()
        with self._e.write() as cur:
            cur.execute(f"UPDATE tasks SET {set_sql}, revision = revision + 1 WHERE id = ? AND fencing_token = ? "
                        f"AND state = 'claimed' AND lease_expires_at > ? RETURNING {rows.TASK_COLS}",
                        [*set_params, task_id, token, now])
            row = cur.fetchone()
            if row is None:
                self._refuse_claim_write(cur, task_id, token, now, target)
            task = rows.task(row)
            if target in (TaskState.DONE, TaskState.FAILED):
                # the task ends: what it did not spend and the calls it did not make go back, where they can be
                # given out again, and its slice with them (in the same transaction)
                heir, returned, returned_calls = self._give_back(cur, task, token, now)
                data = {**data, "returned": returned, "returned_calls": returned_calls, "returned_to": heir}
                task = self._task_row(cur, task_id)
            elif target is not TaskState.CLAIMED:  # the claim ends: its slice goes back, in the same transaction
                self._return_slice(cur, task_id, token, now)
            self.follow_claim(cur, task_id, token, held_until)
            self._event(cur, event, now, {"goal": task.goal_id, "task": task_id, "token": token, **data})
            return task

    def renew(self, task_id: str, token: int, lease_s: float) -> Claim:
        """Extend a live claim's lease."""
        if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not 0 < lease_s <= 86400:
            raise InvalidInputError("lease_s must be a number of seconds in (0, 86400]", field="lease_s")
        expires = self._now() + lease_s
        task = self._claim_update(task_id, token, "lease_expires_at = ?", [expires], TaskState.CLAIMED,
                                  "task.renewed", {"expires_ms": _ms(expires)}, held_until=expires)
        assert task.worker_id is not None
        return Claim(task=task, token=token, worker_id=task.worker_id, expires_at=expires)

    def release(self, task_id: str, token: int) -> Task:
        """Give a claimed task back (it becomes pending)."""
        return self._claim_update(task_id, token, "state = 'pending', worker_id = NULL, lease_expires_at = NULL",
                                  [], TaskState.PENDING, "task.released", {})

    def complete(self, task_id: str, token: int, result: str | None = None) -> Task:
        """Mark a claimed task done."""
        if result is not None:
            _text(result, "result", allow_empty=True, limit=self.finding_limit)
        return self._claim_update(task_id, token, "state = 'done', result = ?, lease_expires_at = NULL", [result],
                                  TaskState.DONE, "task.completed",
                                  {"result_sha256": None if result is None
                                   else hashlib.sha256(result.encode()).hexdigest()})

    def fail(self, task_id: str, token: int, reason: str) -> Task:
        """Mark a claimed task failed."""
        _text(reason, "reason", allow_empty=True, limit=self.finding_limit)
        return self._claim_update(task_id, token, "state = 'failed', result = ?, lease_expires_at = NULL",
                                  [reason], TaskState.FAILED, "task.failed", {"reason": reason})

    def cancel_task(self, task_id: str, reason: str) -> Task:
        """End a pending or claimed task that will do no more (a claim on it ends), and give the unspent part of
        its envelope back to where it can still be spent: the envelope of its nearest live (pending or claimed)
        ancestor, else the goal's unallocated budget. (An ended parent's envelope can spend nothing: a grandchild
        cancelled after its cancelled parent used to leave its budget there, out of the goal for good.)

        Its budget becomes what it has spent and still holds, so a hold in flight settles inside it and the goal's
        ledger stays exact."""
        _text(reason, "reason", allow_empty=True, limit=self.finding_limit)
        now = self._now()
        with self._e.write() as cur:
            task = self._task_row(cur, task_id, lock=True)
            if task.state not in (TaskState.PENDING, TaskState.CLAIMED):
                raise IllegalTransitionError("task", task_id, task.state.value, TaskState.CANCELLED.value)
            cur.execute("UPDATE tasks SET state = 'cancelled', result = ?, lease_expires_at = NULL, "
                        "revision = revision + 1 WHERE id = ? AND state = ? RETURNING id",
                        (reason, task_id, task.state.value))
            if cur.fetchone() is None:
                raise IllegalTransitionError("task", task_id, "(changed meanwhile)", TaskState.CANCELLED.value)
            heir, unspent, unused = self._end_unspent(cur, task, now)
            self._event(cur, "task.cancelled", now, {"goal": task.goal_id, "task": task_id, "reason": reason,
                                                     "returned": unspent, "returned_calls": unused,
                                                     "returned_to": heir})
            return self._task_row(cur, task_id)

    def fail_unaffordable(self, goal_id: str, min_slice_micro_usd: int, *, group: str | None = None) -> list[Task]:
        """Fail every claimable task of the goal that no agent can work on, of ``group`` if given: one whose
        envelope cannot afford ``min_slice_micro_usd`` (one model call's worst case), or one with no model call
        left that none can come back to (``_NO_CALLS_EVER``: no other live task of the goal holds unused calls,
        which it would hand back when it ends). These are the tasks ``claim(min_slice_micro_usd=, calls=True)``
        refuses; a task with no call left while a peer may still give some back stays pending. A run calls this
        once an agent's claim was refused, so such a task ends instead of staying pending.

        Each task in its own transaction, by one conditional update (still claimable, still refused), so it
        ends exactly once, with ``task.failed`` and a reason naming its slice or its calls. No slice is carved for
        it (a stale one of a lapsed claim is returned); like a cancelled task, its unspent budget goes to its
        nearest live ancestor, else to the goal's unallocated budget. The tasks failed, in claim order."""
        min_slice = micro_usd(min_slice_micro_usd, field="min_slice_micro_usd")
        now = self._now()
        claimable = "(state = 'pending' OR (state = 'claimed' AND lease_expires_at <= ?))"
        short = f"{claimable} AND (budget - reserved - settled < ? OR {_NO_CALLS_EVER})"
        of_group, params = ("", [goal_id, now, min_slice]) if group is None else (
            " AND group_name = ?", [goal_id, now, min_slice, group])
        with self._e.read() as cur:
            cur.execute(f"SELECT id FROM tasks WHERE goal_id = ? AND {short}{of_group} ORDER BY priority DESC, n",
                        params)
            found = [str(r[0]) for r in cur.fetchall()]
        failed = []
        for task_id in found:
            with self._e.write() as cur:
                task = self._task_row(cur, task_id, lock=True)
                if task.envelope.available < min_slice:
                    reason = (f"refused at claim: its slice ({task.envelope.available} micro-USD) cannot afford one "
                              f"model call ({min_slice} micro-USD)")
                elif task.envelope.call_cap:
                    reason = (f"refused at claim: it has no model call left (all {task.envelope.call_cap} of its "
                              "own were made)")
                else:
                    reason = (f"refused at claim: it has no model call left (its goal's cap of "
                              f"{self._goal_row(cur, task.goal_id).call_cap} calls is all made or allocated)")
                row = self._one(cur, "UPDATE tasks SET state = 'failed', result = ?, lease_expires_at = NULL, "
                                     f"revision = revision + 1 WHERE id = ? AND {short} RETURNING id",
                                (reason, task_id, now, min_slice))
                if row is None:
                    continue  # claimed, ended or given more budget or calls meanwhile
                heir, unspent, unused = self._end_unspent(cur, task, now)
                self._event(cur, "task.failed", now, {"goal": task.goal_id, "task": task_id, "reason": reason,
                                                      "needed": min_slice, "returned": unspent,
                                                      "returned_calls": unused, "returned_to": heir})
                failed.append(self._task_row(cur, task_id))
        return failed

    def _end_unspent(self, cur: Cursor, task: Task, now: float) -> tuple[str | None, int, int]:
        """What a task ended before it was done (cancelled, or failed at claim) leaves: see ``_give_back``; its
        claim's follower ended too."""
        given = self._give_back(cur, task, None, now)
        if task.state is TaskState.CLAIMED and task.fencing_token is not None:
            self.follow_claim(cur, task.id, task.fencing_token, None)
        return given

    def _give_back(self, cur: Cursor, task: Task, token: int | None, now: float) -> tuple[str | None, int, int]:
        """An ended task (done, failed, cancelled; ``task`` as it was before it ended, its row locked) gives back
        what it can no longer use: its budget becomes what it spent and still holds (a hold in flight settles
        inside it and gives up what it did not use, see ``_finish``), and, on a goal that caps calls, its own cap
        becomes the calls it made. The unspent budget and the unused calls are handed up (see ``_hand_up``) and
        its live slice (claim ``token``'s, any with None) is returned: the unspent part is then the goal's to give
        out again, to a later task or a delegation, exactly once (this runs in the transaction that ends the task,
        which only one can). The heir's id (None: the goal), the budget and the calls given back."""
        unspent = task.envelope.available
        goal_cap = self._one(cur, "SELECT call_cap FROM goals WHERE id = ?", (task.goal_id,))[0]
        unused = task.envelope.call_cap - task.envelope.calls if int(goal_cap) and task.envelope.call_cap else 0
        if unspent or unused:
            cur.execute("UPDATE tasks SET budget = budget - ?, call_cap = call_cap - ? WHERE id = ?",
                        (unspent, unused, task.id))
        # lock order: this task, its ancestors, then the goal: the slice goes back to the goal's row after the
        # unspent budget went up the chain (holding the goal's row while waiting for an ancestor's deadlocked with
        # that ancestor's own cancel or delegate, which holds it while waiting for the goal's)
        heir = self._hand_up(cur, task.parent_id, unspent, task.goal_id, unused)
        self._return_slice(cur, task.id, token, now)
        return heir, unspent, unused

    def _hand_up(self, cur: Cursor, parent_id: str | None, amount: int, goal_id: str, calls: int = 0) -> str | None:
        """Give ``amount`` (and ``calls``, a goal's allocated calls) back where they can still be spent: to the
        nearest live ancestor (see ``_give_to_live_ancestor``), else to the goal's unallocated budget and calls;
        the heir's id, or None for the goal. Calls an heir with no cap of its own cannot take go to the goal's
        unallocated calls, which such a task draws on."""
        heir, took_calls = self._give_to_live_ancestor(cur, parent_id, amount, goal_id, calls)
        if heir is None or not took_calls:
            to_goal = amount if heir is None else 0
            if to_goal or calls:
                cur.execute("UPDATE goals SET allocated = allocated - ?, allocated_calls = allocated_calls - ? "
                            "WHERE id = ?", (to_goal, calls, goal_id))
        return heir

    def _give_to_live_ancestor(self, cur: Cursor, parent_id: str | None, amount: int, goal_id: str,
                               calls: int = 0) -> tuple[str | None, bool]:
        """Add ``amount`` to the envelope of the nearest live (pending or claimed) task up the chain from
        ``parent_id``, and to its live slice too if it has one (its holds are bounded by that slice); ``calls`` to
        its own call cap and its slice's, if it has a cap of its own. The id of that task, or None when no
        ancestor is live, and whether it took the calls. Each step's update is conditional on the ancestor still
        being live, so an ancestor cancelled concurrently either passes this amount on with its own (our update
        came first) or is skipped (its cancel came first)."""
        while parent_id is not None:
            given = self._one(cur, "UPDATE tasks SET budget = budget + ?, slice = slice + CASE WHEN slice_token IS "
                                   "NULL THEN 0 ELSE ? END, call_cap = call_cap + CASE WHEN call_cap > 0 THEN ? "
                                   "ELSE 0 END, slice_call_cap = slice_call_cap + CASE WHEN slice_token IS NOT NULL "
                                   "AND call_cap > 0 THEN ? ELSE 0 END WHERE id = ? AND state IN ('pending', "
                                   "'claimed') RETURNING slice_token, call_cap",
                              (amount, amount, calls, calls, parent_id))
            if given is not None:
                took = bool(calls) and int(given[1]) > 0
                if given[0] is not None and (amount or took):
                    cur.execute("UPDATE goals SET escrowed = escrowed + ?, escrowed_calls = escrowed_calls + ? "
                                "WHERE id = ?", (amount, calls if took else 0, goal_id))
                return parent_id, took
            up = self._one(cur, "SELECT parent_id FROM tasks WHERE id = ?", (parent_id,))
            parent_id = None if up is None or up[0] is None else str(up[0])
        return None, False

    def current_claim(self, worker_id: str) -> Claim | None:
        """The worker's live claim (the one with the latest lease), if any."""
        now = self._now()
        with self._e.read() as cur:
            row = self._one(cur, f"SELECT {rows.TASK_COLS} FROM tasks WHERE worker_id = ? AND state = 'claimed' "
                                 "AND lease_expires_at > ? ORDER BY lease_expires_at DESC LIMIT 1",
                            (worker_id, now))
        if row is None:
            return None
        task = rows.task(row)
        assert task.fencing_token is not None and task.lease_expires_at is not None
        return Claim(task=task, token=task.fencing_token, worker_id=worker_id, expires_at=task.lease_expires_at)

    def check_fence(self, task_id: str, token: int) -> Task:
        """Raise unless ``token`` is the task's current claim with a live lease; return the task."""
        token = _int(token, "fencing_token", minimum=1)
        with self._e.read() as cur:
            task = self._task_row(cur, task_id)
        self._check_claim(task, token, self._now())
        return task

    # -- board ----------------------------------------------------------------------------------------------
    def _insert_post(self, cur: Cursor, goal_id: str, kind: PostKind, group: str, author: str,
                     task_id: str | None, token: int | None, body: str, now: float) -> Post:
        row = self._one(cur, "UPDATE goals SET board_seq = board_seq + 1 WHERE id = ? RETURNING board_seq",
                        (goal_id,))
        if row is None:
            raise NotFoundError("goal", goal_id)
        seq = int(row[0])
        cur.execute(f"INSERT INTO posts ({rows.POST_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (goal_id, seq, kind.value, group, author, task_id, token, body, now))
        self._event(cur, "board.posted", now, {"goal": goal_id, "seq": seq, "kind": kind.value, "group": group,
                                               "author": author, "task": task_id, "token": token,
                                               "body_sha256": hashlib.sha256(body.encode()).hexdigest()})
        return rows.post((goal_id, seq, kind.value, group, author, task_id, token, body, now))

    def post(self, task_id: str, token: int, kind: PostKind, body: str, *, author: str,
             group: str | None = None) -> Post:
        """Append a post to the goal's board under a claimed task; ``group`` defaults to the task's."""
        kind = _enum(PostKind, kind, "kind")
        body = _text(body, "body", limit=self.post_limit)
        author = _text(author, "author", limit=200)
        now = self._now()
        with self._e.write() as cur:
            task = self._fence(cur, task_id, token, now)
            self._count_worker_post(cur, task.goal_id, task_id, len(body.encode()))
            return self._insert_post(cur, task.goal_id, kind, group or task.group, author, task_id, token, body,
                                     now)

    def _count_worker_post(self, cur: Cursor, goal_id: str, task_id: str, size: int) -> None:
        """Count a worker's post against its goal's board quotas, or refuse it: one conditional update of the goal's
        row, which concurrent posts wait on (PostgreSQL re-checks the condition on the row they then see)."""
        q = self.quotas
        row = self._one(cur, "UPDATE goals SET worker_posts = worker_posts + 1, worker_post_bytes = worker_post_bytes"
                             " + ? WHERE id = ? AND worker_posts < COALESCE(post_quota, ?) AND worker_post_bytes + ?"
                             " <= COALESCE(post_bytes_quota, ?) RETURNING worker_posts",
                        (size, goal_id, q.board_posts, size, q.board_bytes))
        if row is not None:
            return
        row = self._one(cur, "SELECT worker_posts, COALESCE(post_quota, ?), worker_post_bytes, "
                             "COALESCE(post_bytes_quota, ?) FROM goals WHERE id = ?",
                        (q.board_posts, q.board_bytes, goal_id))
        if row is None:
            raise NotFoundError("goal", goal_id)
        posts, post_quota, used, bytes_quota = (int(v) for v in row)
        if posts >= post_quota:
            raise QuotaExceededError("the goal's board posts", 1, posts, post_quota, goal_id=goal_id, task_id=task_id)
        raise QuotaExceededError("the goal's board bytes", size, used, bytes_quota, goal_id=goal_id, task_id=task_id)

    def post_as_operator(self, goal_id: str, kind: PostKind, body: str, *, author: str, group: str) -> Post:
        """Append a post with no task (coordinator consolidations, operator notes)."""
        kind = _enum(PostKind, kind, "kind")
        body = _text(body, "body", limit=self.post_limit)
        author = _text(author, "author", limit=200)
        group = _text(group, "group", limit=200)
        now = self._now()
        with self._e.write() as cur:
            return self._insert_post(cur, goal_id, kind, group, author, None, None, body, now)

    def read_board(self, goal_id: str, *, after: int = 0, limit: int = 100, group: str | None = None,
                   kinds: Sequence[PostKind] | None = None, author: str | None = None) -> list[Post]:
        """Posts with ``seq > after`` in order, at most ``limit``; a group filter also returns broadcasts."""
        after = _int(after, "after")
        limit = _int(limit, "limit", minimum=1)
        sql, params = f"SELECT {rows.POST_COLS} FROM posts WHERE goal_id = ? AND seq > ?", [goal_id, after]
        if group is not None:
            sql += " AND group_name IN (?, ?)"
            params += [group, BROADCAST_GROUP]
        if kinds:
            values = [_enum(PostKind, k, "kinds").value for k in kinds]
            sql += f" AND kind IN ({', '.join('?' for _ in values)})"
            params += values
        if author is not None:
            sql += " AND author = ?"
            params.append(author)
        with self._e.read() as cur:
            cur.execute(sql + " ORDER BY seq LIMIT ?", [*params, min(limit, 10_000)])
            found = [rows.post(r) for r in cur.fetchall()]
            if not found and after == 0:
                self._goal_row(cur, goal_id)
            return found

    # -- artifacts ------------------------------------------------------------------------------------------
    def _blob_path(self, sha256: str) -> Path:
        return self.blob_dir / sha256[:2] / sha256[2:]

    def _write_blob(self, sha256: str, data: bytes) -> None:
        path = self._blob_path(sha256)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{new_id('tmp')}")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the whole blob or none

    def put_artifact(self, task_id: str, token: int, data: bytes, *, author: str,
                     media_type: str = "application/octet-stream") -> Artifact:
        """Store a blob content-addressed by SHA-256 under a claimed task (idempotent per goal and hash)."""
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError("artifact data must be bytes", field="data")
        if len(data) > self.artifact_limit:
            raise PayloadTooLargeError("artifact", len(data), self.artifact_limit)
        author = _text(author, "author", limit=200)
        media_type = _text(media_type, "media_type", limit=200)
        now = self._now()
        sha = hashlib.sha256(data).hexdigest()
        with self._e.write() as cur:
            task = self._fence(cur, task_id, token, now)
            # The goal's row is locked before the blob is looked for: a concurrent submit to the same goal waits
            # here, then finds the blob the first one stored (not counted twice) or the total it left.
            suffix = " FOR UPDATE" if self._e.postgres else ""
            used, quota, task_quota = (int(v) for v in self._one(
                cur, f"SELECT artifact_bytes, COALESCE(artifact_quota, ?), COALESCE(task_artifact_quota, ?) FROM goals"
                     f" WHERE id = ?{suffix}", (self.quotas.artifact_bytes, self.quotas.task_artifact_bytes,
                                                task.goal_id)))
            existing = self._one(cur, f"SELECT {rows.ARTIFACT_COLS} FROM artifacts WHERE goal_id = ? AND "
                                      "sha256 = ?", (task.goal_id, sha))
            if existing is not None:
                return rows.artifact(existing)
            if used + len(data) > quota:
                raise QuotaExceededError("the goal's artifact bytes", len(data), used, quota, goal_id=task.goal_id,
                                         task_id=task_id)
            task_used = int(self._one(cur, "SELECT artifact_bytes FROM tasks WHERE id = ?", (task_id,))[0])
            if task_used + len(data) > task_quota:
                raise QuotaExceededError("the task's artifact bytes", len(data), task_used, task_quota,
                                         goal_id=task.goal_id, task_id=task_id)
            cur.execute("UPDATE goals SET artifact_bytes = artifact_bytes + ? WHERE id = ?", (len(data), task.goal_id))
            cur.execute("UPDATE tasks SET artifact_bytes = artifact_bytes + ? WHERE id = ?", (len(data), task_id))
            # The blob is written before the row commits: a crash leaves at worst an unreferenced blob.
            self._write_blob(sha, bytes(data))
            cur.execute(f"INSERT INTO artifacts ({rows.ARTIFACT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (sha, task.goal_id, task_id, len(data), media_type, author, now))
            self._event(cur, "artifact.submitted", now, {"goal": task.goal_id, "task": task_id, "sha256": sha,
                                                         "size": len(data), "author": author, "token": token})
            return Artifact(sha, task.goal_id, task_id, len(data), media_type, author, now)

    def get_artifact(self, goal_id: str, sha256: str) -> Artifact:
        """Artifact metadata, or ``NotFoundError``."""
        with self._e.read() as cur:
            row = self._one(cur, f"SELECT {rows.ARTIFACT_COLS} FROM artifacts WHERE goal_id = ? AND sha256 = ?",
                            (goal_id, sha256))
        if row is None:
            raise NotFoundError("artifact", sha256)
        return rows.artifact(row)

    def read_artifact(self, goal_id: str, sha256: str) -> bytes:
        """Artifact bytes, verified against their hash."""
        self.get_artifact(goal_id, sha256)
        data = self._blob_path(sha256).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise NotFoundError("artifact blob (corrupt)", sha256)
        return data

    # -- findings -------------------------------------------------------------------------------------------
    def _resolve(self, cur: Cursor, goal_id: str, citation: Citation) -> None:
        if citation.kind is CitationKind.POST:
            # digits only, within a 64-bit integer: int() would also take ' 7', '1_0' or '٣', and a number past
            # 2**63 - 1 overflows SQLite's binding (an OverflowError, not a typed answer)
            ref = citation.ref
            if not (ref.isascii() and ref.isdigit()) or len(ref) > 19 or int(ref) > _MAX_SEQ:
                raise InvalidInputError(f"post citation {citation.ref!r} is not a sequence number",
                                        field="citations")
            seq = int(ref)
            row = self._one(cur, "SELECT 1 FROM posts WHERE goal_id = ? AND seq = ?", (goal_id, seq))
        elif citation.kind is CitationKind.ARTIFACT:
            row = self._one(cur, "SELECT 1 FROM artifacts WHERE goal_id = ? AND sha256 = ?", (goal_id, citation.ref))
        elif citation.kind is CitationKind.SOURCE:
            # a file of the run, not a row: the plane checks the quote against the run's sources before it stores
            if not citation.quote:
                raise InvalidInputError(f"source citation {citation.ref!r} quotes nothing", field="citations")
            return
        else:
            row = self._one(cur, "SELECT 1 FROM findings WHERE goal_id = ? AND id = ?", (goal_id, citation.ref))
        if row is None:
            raise InvalidInputError(f"citation {citation.kind.value}:{citation.ref} does not resolve in this goal",
                                    field="citations")

    def submit_finding(self, task_id: str, token: int, *, author: str, title: str, body: str,
                       citations: Sequence[Citation] = ()) -> Finding:
        """Record a finding; every citation must resolve within the goal."""
        author = _text(author, "author", limit=200)
        title = _text(title, "title", limit=1000)
        body = _text(body, "body", limit=self.finding_limit)
        cites: list[Citation] = []
        for c in citations:
            if not isinstance(c, Citation) or not isinstance(c.ref, str) or not isinstance(c.quote, str):
                raise InvalidInputError("citations must be Citation(kind, ref, quote)", field="citations")
            cites.append(Citation(_enum(CitationKind, c.kind, "citations.kind"), c.ref, c.quote))
        if len(cites) > 1000:
            raise PayloadTooLargeError("citations", len(cites), 1000)
        now = self._now()
        finding_id = new_id("fnd")
        with self._e.write() as cur:
            task = self._fence(cur, task_id, token, now)
            for c in cites:
                self._resolve(cur, task.goal_id, c)
            score = self._cited_score(cur, task.goal_id, cites)
            cur.execute("INSERT INTO findings (id, goal_id, task_id, group_name, author, title, body, citations,"
                        " status, score, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (finding_id, task.goal_id, task_id, task.group, author, title, body,
                         rows.citations_json(cites), FindingStatus.SUBMITTED.value, score, now))
            self._event(cur, "finding.submitted", now, {
                "goal": task.goal_id, "task": task_id, "finding": finding_id, "author": author, "token": token,
                "body_sha256": hashlib.sha256(body.encode()).hexdigest(), "score": score,
                "citations": [c.to_dict() for c in cites]})
            return Finding(finding_id, task.goal_id, task_id, task.group, author, title, body, tuple(cites),
                           FindingStatus.SUBMITTED, score, now)

    def _cited_score(self, cur: Cursor, goal_id: str, cites: Sequence[Citation]) -> int | None:
        """A finding's score: the best search score of the artifacts it cites (``None`` when none is scored)."""
        shas = sorted({c.ref for c in cites if c.kind is CitationKind.ARTIFACT})
        if not shas:
            return None
        marks = ", ".join("?" for _ in shas)
        row = self._one(cur, f"SELECT MAX(score) FROM scores WHERE goal_id = ? AND split = 'search' AND sha256 IN "
                             f"({marks})", (goal_id, *shas))
        return None if row is None or row[0] is None else int(row[0])

    def read_findings(self, goal_id: str, *, group: str | None = None, after: str | None = None,
                      limit: int = 100) -> list[Finding]:
        """Findings in submission order, after the finding id ``after``."""
        limit = _int(limit, "limit", minimum=1)
        sql, params = f"SELECT {rows.FINDING_COLS} FROM findings WHERE goal_id = ?", [goal_id]
        with self._e.read() as cur:
            if after is not None:
                row = self._one(cur, "SELECT n FROM findings WHERE id = ? AND goal_id = ?", (after, goal_id))
                if row is None:
                    raise NotFoundError("finding", after)
                sql += " AND n > ?"
                params.append(row[0])
            if group is not None:
                sql += " AND group_name = ?"
                params.append(group)
            cur.execute(sql + " ORDER BY n LIMIT ?", [*params, min(limit, 10_000)])
            return [rows.finding(r) for r in cur.fetchall()]

    def get_finding(self, finding_id: str) -> Finding:
        """One finding, or ``NotFoundError``."""
        with self._e.read() as cur:
            row = self._one(cur, f"SELECT {rows.FINDING_COLS} FROM findings WHERE id = ?", (finding_id,))
        if row is None:
            raise NotFoundError("finding", finding_id)
        return rows.finding(row)

    def set_finding_status(self, finding_id: str, status: FindingStatus, *, score: int | None = None) -> Finding:
        """Verify or reject a submitted finding."""
        status = _enum(FindingStatus, status, "status")
        if score is not None:
            _int(score, "score", minimum=-(2**62))
        now = self._now()
        with self._e.write() as cur:
            row = self._one(cur, f"SELECT {rows.FINDING_COLS} FROM findings WHERE id = ?", (finding_id,))
            if row is None:
                raise NotFoundError("finding", finding_id)
            current = rows.finding(row)
            if status not in FINDING_TRANSITIONS[current.status]:
                raise IllegalTransitionError("finding", finding_id, current.status.value, status.value)
            cur.execute("UPDATE findings SET status = ?, score = ? WHERE id = ? AND status = ?",
                        (status.value, score, finding_id, current.status.value))
            self._event(cur, "finding.status", now, {"goal": current.goal_id, "finding": finding_id,
                                                     "status": status.value, "score": score})
            row = self._one(cur, f"SELECT {rows.FINDING_COLS} FROM findings WHERE id = ?", (finding_id,))
            return rows.finding(row)

    # -- ledger ---------------------------------------------------------------------------------------------
    def set_price(self, price: Price) -> None:
        """Insert or replace a model's price."""
        model = _text(price.model, "model", limit=200)
        inp = micro_usd(price.input_per_mtok, field="input_per_mtok")
        out = micro_usd(price.output_per_mtok, field="output_per_mtok")
        now = self._now()
        with self._e.write() as cur:
            cur.execute("INSERT INTO prices (model, input_per_mtok, output_per_mtok) VALUES (?, ?, ?) "
                        "ON CONFLICT (model) DO UPDATE SET input_per_mtok = excluded.input_per_mtok, "
                        "output_per_mtok = excluded.output_per_mtok", (model, inp, out))
            self._event(cur, "price.set", now, {"model": model, "input_per_mtok": inp, "output_per_mtok": out})

    def get_price(self, model: str) -> Price:
        """A model's price, or ``NotFoundError``."""
        with self._e.read() as cur:
            row = self._one(cur, "SELECT model, input_per_mtok, output_per_mtok FROM prices WHERE model = ?",
                            (model,))
        if row is None:
            raise NotFoundError("price", model)
        return Price(row[0], row[1], row[2])

    def _reservation_row(self, cur: Cursor, reservation_id: str) -> Reservation:
        row = self._one(cur, f"SELECT {rows.RESERVATION_COLS} FROM reservations WHERE id = ?", (reservation_id,))
        if row is None:
            raise NotFoundError("reservation", reservation_id)
        return rows.reservation(row)

    def reserve(self, task_id: str, token: int, *, model: str, amount: int, method: str,
                body_digest: str | None = None) -> Reservation:
        """Hold ``amount`` on the task's envelope and count one call, in one transaction: inside the claim's live
        slice only the task's row is written (the slice was carved from the goal's envelope at claim); without
        one (a claim whose slice never moved) the goal's row is charged too, as before escrow.

        ``body_digest`` names the call's request body: the same body again from the same worker while a hold
        of it is ``unknown`` is a ``DuplicateOfUnknownError`` (nothing held), on every replica; while another
        replica holds it (``held``), a ``DuplicateInFlightError``.

        Why two conditional updates instead of read, check, write: every model call passes here while it
        holds the write lock, so each envelope is charged by one ``UPDATE ... WHERE <every rule> RETURNING``
        (which also locks the row under PostgreSQL, as the fence's ``FOR UPDATE`` did); only a refusal reads
        the rows again, to name the rule that refused.
        """
        amount = micro_usd(amount, field="amount")
        model = _text(model, "model", limit=200)
        method = _text(method, "method", limit=100)
        token = _int(token, "fencing_token", minimum=1)
        now = self._now()
        with self._e.write() as cur:
            row = self._one(cur, f"UPDATE tasks SET {_CHARGE} WHERE id = ? AND "
                                 "fencing_token = ? AND state = 'claimed' AND lease_expires_at > ? AND "
                                 f"{_AFFORDS} RETURNING goal_id, worker_id, {_SLICE_OF_HOLD}, call_cap",
                            (amount, amount, task_id, token, now, amount, amount, now))
            if row is None:
                self._refuse_reserve(cur, task_id, token, now, amount)
            goal_id, worker_id, slice_token, own_calls = row
            return self._hold(cur, goal_id, task_id, worker_id, token, amount, model, method, now, body_digest,
                              slice_token, own_calls=bool(own_calls))

    def reserve_for_worker(self, worker_id: str, token_hash: str, *, model: str, amount: int,
                           method: str, body_digest: str | None = None) -> Reservation:
        """``reserve`` on the worker's live claim, checking the worker's token in the same transaction.

        Why: a model call would otherwise read the worker (revocation), then its claim, then write: three
        trips to the store on the path of every call. Here the task's conditional charge finds the claim and
        checks the worker itself; only a refusal reads rows again, to say which rule refused.
        """
        amount = micro_usd(amount, field="amount")
        model = _text(model, "model", limit=200)
        method = _text(method, "method", limit=100)
        now = self._now()
        worker_id = _text(worker_id, "worker_id", limit=100)
        with self._e.write() as cur:
            # The claim's conditions are repeated outside the subquery: PostgreSQL re-checks those (not the
            # subquery) on the row it locked, should another transaction have changed it meanwhile.
            row = self._one(cur, f"UPDATE tasks SET {_CHARGE} WHERE id = ("
                                 "SELECT t.id FROM tasks t JOIN workers w ON w.id = t.worker_id "
                                 "WHERE t.worker_id = ? AND t.state = 'claimed' AND t.lease_expires_at > ? "
                                 "AND w.revoked = 0 AND w.token_hash = ? "
                                 "ORDER BY t.lease_expires_at DESC LIMIT 1) "
                                 "AND worker_id = ? AND state = 'claimed' AND lease_expires_at > ? "
                                 f"AND {_AFFORDS} RETURNING id, goal_id, fencing_token, {_SLICE_OF_HOLD}, call_cap",
                            (amount, amount, worker_id, now, token_hash, worker_id, now, amount, amount, now))
            if row is None:
                self._refuse_worker_reserve(cur, worker_id, token_hash, now, amount)
            task_id, goal_id, token, slice_token, own_calls = row
            return self._hold(cur, goal_id, task_id, worker_id, int(token), amount, model, method, now,
                              body_digest, slice_token, own_calls=bool(own_calls))

    def _refuse_worker_reserve(self, cur: Cursor, worker_id: str, token_hash: str, now: float,
                               amount: int) -> NoReturn:
        worker = self._one(cur, "SELECT revoked, token_hash FROM workers WHERE id = ?", (worker_id,))
        if worker is None:
            raise InvalidTokenError("unknown worker")
        if worker[0]:
            raise InvalidTokenError(f"worker {worker_id} has been revoked")
        if worker[1] != token_hash:
            raise InvalidTokenError("token is not the worker's current token")
        claim = self._one(cur, "SELECT id, fencing_token FROM tasks WHERE worker_id = ? AND state = 'claimed' "
                               "AND lease_expires_at > ? ORDER BY lease_expires_at DESC LIMIT 1", (worker_id, now))
        if claim is None:
            raise ConflictError(f"worker {worker_id} holds no live claim; claim a task first")
        self._refuse_reserve(cur, claim[0], int(claim[1]), now, amount)

    def _hold(self, cur: Cursor, goal_id: str, task_id: str, worker_id: str, token: int, amount: int, model: str,
              method: str, now: float, body_digest: str | None = None, slice_token: int | None = None, *,
              own_calls: bool = False) -> Reservation:
        """The rest of a reservation once the task's envelope took it: the goal's envelope (only when the claim
        has no live slice: ``slice_token`` None), the hold, its event. ``own_calls``: the task has a call cap of
        its own (allocated from the goal's when it was made); a task without one on a goal that caps calls takes
        this call from the goal's unallocated ones."""
        reservation_id = new_id("rsv")
        if body_digest is not None:
            body_digest = _text(body_digest, "body_digest", limit=128)
        values = (reservation_id, goal_id, task_id, model, amount, method, now, now, worker_id, self.plane_id,
                  body_digest, slice_token)
        if body_digest is None:
            cur.execute(_INSERT_HOLD, values)
        else:
            # one statement checks and writes: nothing is inserted when a call of this body is lost or in flight
            if self.plane_id is None:
                written = self._one(cur, _INSERT_HOLD_UNLESS_LOST, (*values, worker_id, body_digest))
            else:
                written = self._one(cur, _INSERT_HOLD_UNLESS_LOST_OR_BUSY,
                                    (*values, worker_id, body_digest, worker_id, body_digest, self.plane_id))
            if written is None:  # raised inside the transaction: the task's charge is rolled back with it
                self._refuse_duplicate(cur, worker_id, body_digest)
        # Inside a live slice the goal's row is not touched: the slice was carved from it at claim (money, and
        # calls when the goal caps them), so its checks already hold; the deadline was read by the task's update.
        pooled = 0 if own_calls else 1
        if slice_token is None and self._one(
                cur, "UPDATE goals SET reserved = reserved + ?, calls = calls + 1, allocated_calls = allocated_calls "
                     "+ CASE WHEN call_cap > 0 THEN ? ELSE 0 END WHERE id = ? AND "
                     "(deadline IS NULL OR deadline > ?) AND budget - reserved - settled - escrowed >= ? AND "
                     "(call_cap = 0 OR (calls + escrowed_calls < call_cap AND (? = 0 OR allocated_calls < call_cap))) "
                     "RETURNING id", (amount, pooled, goal_id, now, amount, pooled)) is None:
            goal = self._goal_row(cur, goal_id)
            deadline, cap, calls, allocated_calls, available = self._one(
                cur, "SELECT deadline, call_cap, calls + escrowed_calls, allocated_calls, "
                     "budget - reserved - settled - escrowed FROM goals WHERE id = ?", (goal_id,))
            if deadline is not None and now >= deadline:
                raise DeadlinePassedError(goal.id, deadline)
            if cap and int(calls) >= int(cap):
                raise CallCapExceededError(f"goal {goal.id}", int(cap))
            if cap and pooled and int(allocated_calls) >= int(cap):
                raise CallCapExceededError(f"goal {goal.id} (its calls not allocated to a task's own cap)", int(cap))
            raise BudgetExceededError(f"goal {goal.id}", amount, int(available))
        self._event(cur, "reservation.held", now, {"goal": goal_id, "task": task_id,
                                                   "reservation": reservation_id, "model": model,
                                                   "amount": amount, "method": method, "token": token})
        return Reservation(reservation_id, goal_id, task_id, model, amount, None, ReservationState.HELD, method,
                           now, now, worker_id=worker_id)

    def _refuse_duplicate(self, cur: Cursor, worker_id: str, body_digest: str) -> NoReturn:
        """Explain why a hold of ``body_digest`` was not written: a call of that body is lost, or in flight on
        another replica (maybe one killed with the call in flight, whose hold stays held until a sweep marks it
        unknown, while its client, an SDK, resends the body at once elsewhere)."""
        lost = self._one(cur, "SELECT id FROM reservations WHERE worker_id = ? AND body_digest = ? AND "
                              "state = 'unknown' LIMIT 1", (worker_id, body_digest))
        if lost is not None:
            raise DuplicateOfUnknownError(str(lost[0]))
        busy = self._one(cur, "SELECT id FROM reservations WHERE worker_id = ? AND body_digest = ? AND "
                              "state = 'held' AND plane_id <> ? LIMIT 1", (worker_id, body_digest, self.plane_id))
        if busy is None:  # the hold refused by the insert's own snapshot is gone from this read's: refuse anyway
            raise DuplicateInFlightError("(ended meanwhile)")
        raise DuplicateInFlightError(str(busy[0]))

    def _refuse_reserve(self, cur: Cursor, task_id: str, token: int, now: float, amount: int) -> NoReturn:
        """Explain why the task's conditional charge matched no row, in the order the rules are documented."""
        task = self._task_row(cur, task_id)
        self._check_claim(task, token, now)
        goal = self._goal_row(cur, task.goal_id)
        if goal.deadline is not None and now >= goal.deadline:
            raise DeadlinePassedError(goal.id, goal.deadline)
        if task.envelope.call_cap and task.envelope.calls >= task.envelope.call_cap:
            raise CallCapExceededError(f"task {task.id}", task.envelope.call_cap)
        in_slice = self._slice_available(cur, task.id)
        if in_slice < task.envelope.available:
            raise BudgetExceededError(f"task {task.id} (its slice)", amount, in_slice)
        raise BudgetExceededError(f"task {task.id}", amount, task.envelope.available)

    def _finish(self, reservation_id: str, target: ReservationState, actual: int | None,
                allowed_from: frozenset[ReservationState], tokens: tuple[int, int] = (0, 0)) -> Reservation:
        now = self._now()
        with self._e.write() as cur:
            # The common case (a broker's own hold, still held) in one statement that checks and writes; any other
            # (an unknown hold reconciled, a refusal to explain) reads the row first.
            finished = None
            was = ReservationState.HELD
            if was in allowed_from:
                finished = self._one(cur, _FINISH_HELD, (target.value, actual, actual, actual, now, *tokens,
                                                         reservation_id))
            if finished is None:
                was = self._reservation_row(cur, reservation_id).state
                if was not in allowed_from:
                    raise IllegalTransitionError("reservation", reservation_id, was.value, target.value)
                # Conditional on the state just read: under PostgreSQL a concurrent finish of the same hold (a
                # late settle racing an operator's reconcile) matches no row here, so the envelopes move only once.
                finished = self._one(cur, _FINISH_FROM,
                                     (target.value, actual, actual, actual, now, *tokens, reservation_id, was.value))
                if finished is None:
                    raise IllegalTransitionError("reservation", reservation_id, "(changed meanwhile)", target.value)
            current = rows.reservation(finished)  # as it now stands
            overage = current.overage
            charged = 0 if actual is None else actual - overage
            if overage:
                log.warning("reservation %s: actual cost %d exceeds the held worst case %d; charged %d",
                            reservation_id, actual, current.amount, charged)
            slice_token = finished[-1]  # the slice the hold was charged to (None: the goal's row)
            if target is not ReservationState.UNKNOWN:
                # Lock order: the reservation (just updated), its task, then the goal. A hold of a slice still
                # live is charged to its task's row only; one of a slice returned since (its held amount went
                # to the goal's row with it) or of no slice is charged to the goal's row too.
                # A task ended with its budget pinned to what it spent and held (done, failed or cancelled, see
                # _give_back) gives up what this hold did not use, as it gave up the rest of its unspent budget:
                # it can spend nothing more. (SET reads the row before the update, RETURNING after it.)
                in_slice = "slice_token IS NOT NULL AND slice_token = ?"
                pinned = "state IN ('done', 'cancelled', 'failed') AND budget = reserved + settled"
                unused = current.amount - charged
                task_row = self._one(cur, f"UPDATE tasks SET budget = budget - CASE WHEN {pinned} THEN ? ELSE 0 END, "
                                          "reserved = reserved - ?, settled = settled + ?, "
                                          f"slice_reserved = slice_reserved - CASE WHEN {in_slice} THEN ? ELSE 0 END, "
                                          f"slice_settled = slice_settled + CASE WHEN {in_slice} THEN ? ELSE 0 END "
                                          f"WHERE id = ? RETURNING CASE WHEN {in_slice} THEN 1 ELSE 0 END, "
                                          f"CASE WHEN {pinned} THEN 1 ELSE 0 END, parent_id",
                                     (unused, current.amount, charged, slice_token, current.amount, slice_token,
                                      charged, current.task_id, slice_token))
                if task_row is not None and task_row[1] and unused:  # the ancestors before the goal's row
                    parent = None if task_row[2] is None else str(task_row[2])
                    self._hand_up(cur, parent, unused, current.goal_id)
                if task_row is None or not task_row[0]:
                    cur.execute("UPDATE goals SET reserved = reserved - ?, settled = settled + ? WHERE id = ?",
                                (current.amount, charged, current.goal_id))
            self._event(cur, f"reservation.{target.value}", now, {
                "goal": current.goal_id, "task": current.task_id, "reservation": reservation_id,
                "amount": current.amount, "actual": actual, "charged": charged, "overage": overage,
                "from": was.value, "input_tokens": tokens[0], "output_tokens": tokens[1]})
        return current

    _OPEN = frozenset({ReservationState.HELD, ReservationState.UNKNOWN})

    def settle(self, reservation_id: str, actual: int, *, input_tokens: int = 0,
               output_tokens: int = 0) -> Reservation:
        """Replace a hold by the actual cost (charged up to the hold; any excess is recorded as overage).

        ``input_tokens`` and ``output_tokens`` are what the call used, kept for the run's report.
        """
        actual = micro_usd(actual, field="actual")
        tokens = (_tokens(input_tokens, "input_tokens"), _tokens(output_tokens, "output_tokens"))
        return self._finish(reservation_id, ReservationState.SETTLED, actual, self._OPEN, tokens)

    def release_reservation(self, reservation_id: str) -> Reservation:
        """Drop a hold; nothing is spent."""
        return self._finish(reservation_id, ReservationState.RELEASED, None, self._OPEN)

    def mark_unknown(self, reservation_id: str) -> Reservation:
        """The request left and the answer was lost: keep the hold until an operator reconciles."""
        return self._finish(reservation_id, ReservationState.UNKNOWN, None, frozenset({ReservationState.HELD}))

    def reconcile(self, reservation_id: str, actual: int | None) -> Reservation:
        """Settle an open reservation at ``actual``, or release it when ``actual`` is ``None``.

        Open means ``unknown`` (the answer was lost) or ``held``: a broker settles after its answer went out,
        so one that died in between leaves its hold ``held`` for good. Reconciling a hold whose call is
        still running makes that call's own settlement fail (logged by the broker): the operator's figure
        stands, and the envelopes move once.
        """
        if actual is None:
            return self._finish(reservation_id, ReservationState.RELEASED, None, self._OPEN)
        actual = micro_usd(actual, field="actual")
        return self._finish(reservation_id, ReservationState.SETTLED, actual, self._OPEN)

    def get_reservation(self, reservation_id: str) -> Reservation:
        """One reservation, or ``NotFoundError``."""
        with self._e.read() as cur:
            return self._reservation_row(cur, reservation_id)

    def list_reservations(self, goal_id: str, *, state: ReservationState | None = None) -> list[Reservation]:
        """A goal's reservations, oldest first."""
        sql, params = f"SELECT {rows.RESERVATION_COLS} FROM reservations WHERE goal_id = ?", [goal_id]
        if state is not None:
            sql += " AND state = ?"
            params.append(_enum(ReservationState, state, "state").value)
        with self._e.read() as cur:
            cur.execute(sql + " ORDER BY created_at, id", params)
            return [rows.reservation(r) for r in cur.fetchall()]

    # -- workers --------------------------------------------------------------------------------------------
    def add_worker(self, worker_id: str, goal_id: str, group: str, token_hash: str, expires_at: float) -> Worker:
        """Register a worker and the hash of its capability token."""
        now = self._now()
        with self._e.write() as cur:
            self._goal_row(cur, goal_id)
            cur.execute(f"INSERT INTO workers ({rows.WORKER_COLS}) VALUES (?, ?, ?, ?, ?, 0, ?) "
                        "ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash, "
                        "expires_at = excluded.expires_at, revoked = 0",
                        (worker_id, goal_id, group, token_hash, expires_at, now))
            self._event(cur, "worker.added", now, {"goal": goal_id, "worker": worker_id, "group": group,
                                                   "expires_ms": _ms(expires_at)})
            return Worker(worker_id, goal_id, group, token_hash, expires_at, False, now)

    def get_worker(self, worker_id: str) -> Worker:
        """One worker, or ``NotFoundError``."""
        with self._e.read() as cur:
            row = self._one(cur, f"SELECT {rows.WORKER_COLS} FROM workers WHERE id = ?", (worker_id,))
        if row is None:
            raise NotFoundError("worker", worker_id)
        return rows.worker(row)

    def list_workers(self, goal_id: str) -> list[Worker]:
        """A goal's workers."""
        with self._e.read() as cur:
            cur.execute(f"SELECT {rows.WORKER_COLS} FROM workers WHERE goal_id = ? ORDER BY created_at, id",
                        (goal_id,))
            return [rows.worker(r) for r in cur.fetchall()]

    def revoke_worker(self, worker_id: str) -> Worker:
        """Revoke a worker's token."""
        now = self._now()
        with self._e.write() as cur:
            row = self._one(cur, f"UPDATE workers SET revoked = 1 WHERE id = ? RETURNING {rows.WORKER_COLS}",
                            (worker_id,))
            if row is None:
                raise NotFoundError("worker", worker_id)
            worker = rows.worker(row)
            self._event(cur, "worker.revoked", now, {"goal": worker.goal_id, "worker": worker_id})
            return worker

    # -- audit events ---------------------------------------------------------------------------------------
    def record_event(self, kind: str, data: dict[str, object]) -> None:
        """Append an audit event for a change made outside the store."""
        kind = _text(kind, "kind", limit=200)
        now = self._now()
        with self._e.write() as cur:
            self._event(cur, kind, now, dict(data))

    def sequence_events(self) -> int:
        """Give every committed, unsequenced event its leaf index, in order; return the new leaf count."""
        with self._e.write() as cur:
            if self._e.postgres:
                # Only events of transactions older than every running one: a later commit can never
                # slip in before them, so leaf order is final once given.
                cur.execute("SELECT pg_advisory_xact_lock(727002)")
                ready = "leaf_index IS NULL AND txid < pg_snapshot_xmin(pg_current_snapshot())"
            else:
                # One writer at a time commits events in id order: everything after the last sequenced id.
                last = self._one(cur, "SELECT id FROM events WHERE leaf_index = (SELECT MAX(leaf_index) FROM events "
                                      "WHERE leaf_index IS NOT NULL)", ())
                ready = f"id > {int(last[0]) if last else 0}"
            base = self._one(cur, "SELECT COALESCE(MAX(leaf_index) + 1, 0) FROM events WHERE leaf_index IS NOT NULL",
                             ())[0]
            cur.execute(f"UPDATE events SET leaf_index = s.k FROM (SELECT id, ? + ROW_NUMBER() OVER (ORDER BY id) - 1"
                        f" AS k FROM events WHERE {ready}) AS s WHERE events.id = s.id", (base,))
            return int(self._one(cur, "SELECT COALESCE(MAX(leaf_index) + 1, 0) FROM events "
                                      "WHERE leaf_index IS NOT NULL", ())[0])

    def read_events(self, start: int, end: int) -> list[Event]:
        """Sequenced events with ``start <= leaf_index < end``."""
        with self._e.read() as cur:
            cur.execute(f"SELECT {rows.EVENT_COLS} FROM events WHERE leaf_index >= ? AND leaf_index < ? "
                        "ORDER BY leaf_index", (start, end))
            return [rows.event(r) for r in cur.fetchall()]

    def unsequenced_events(self, limit: int = 100) -> list[Event]:
        """Events with no leaf index yet, oldest id first, at most ``limit`` (read-only)."""
        limit = _int(limit, "limit", minimum=1)
        with self._e.read() as cur:
            cur.execute(f"SELECT {rows.EVENT_COLS} FROM events WHERE leaf_index IS NULL ORDER BY id LIMIT ?",
                        (min(limit, 10_000),))
            return [rows.event(r) for r in cur.fetchall()]

    def list_artifacts(self, goal_id: str) -> list[Artifact]:
        """A goal's artifact rows, oldest first."""
        with self._e.read() as cur:
            cur.execute(f"SELECT {rows.ARTIFACT_COLS} FROM artifacts WHERE goal_id = ? ORDER BY created_at, sha256",
                        (goal_id,))
            return [rows.artifact(r) for r in cur.fetchall()]
