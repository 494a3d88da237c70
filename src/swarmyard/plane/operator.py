"""The operator API: create goals and tasks, complete and cancel tasks, issue and revoke workers, read
everything, reconcile holds.

Each endpoint is one row of ``ENDPOINTS`` (method, path, query and body models, response model, handler);
the app routes and the OpenAPI schema are both built from that table. Handlers are blocking and run on a
worker thread. Every endpoint needs an operator token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.domain import GoalSpec, ReservationState, TaskSpec, TaskState
from swarmyard.errors import InvalidInputError, PayloadTooLargeError
from swarmyard.plane import models as m
from swarmyard.plane.completion import OPERATOR, complete_task
from swarmyard.plane.settings import PlaneSettings
from swarmyard.store.protocol import Store

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")
#: what an id in a path may be (the body's ``Id``, not only dots): anything else is refused before the store
#: sees it
_PATH_ID = re.compile(r"(?!\.+\Z)[A-Za-z0-9_.:-]{1,200}")


def check_path_id(name: str, value: str) -> str:
    """``value`` if it may be the id ``name`` in an operator path, else ``InvalidInputError`` (400).

    The server checks every path parameter with it before any store call (a NUL in one was a 500 on PostgreSQL,
    which cannot compare text holding one), and the CLI every id it puts in a path: a '/', '?', '#' or a dot
    segment in an id would aim the request at another endpoint."""
    if _PATH_ID.fullmatch(value) is None:
        raise InvalidInputError(f"{name} must be 1 to 200 of A-Z a-z 0-9 _ . : -", field=name)
    return value


def _decimal(value: object) -> int:
    """A query string as an integer, strictly: pydantic's lax ``int`` takes "1.0", "+1", "1_000" and " 1"."""
    if not isinstance(value, str) or _DECIMAL.fullmatch(value) is None:
        raise ValueError("must be a whole number in ASCII digits, without sign, spaces, '_' or leading zeros")
    return int(value)


#: a query cursor and a page size: digits only, then the same bounds as in a body
Cursor = Annotated[int, BeforeValidator(_decimal), Field(ge=0, le=2**62)]
QueryLimit = Annotated[int, BeforeValidator(_decimal), Field(ge=1, le=500)]


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TasksQuery(_Query):
    """Filters for a goal's tasks."""

    state: TaskState | None = None
    group: m.Group | None = None


class BoardQuery(_Query):
    """A cursor and filters for a goal's board."""

    after: Cursor = 0
    limit: QueryLimit = 100
    group: m.Group | None = None


class FindingsQuery(_Query):
    """A cursor and filters for a goal's findings."""

    after: m.Id | None = None
    limit: QueryLimit = 100
    group: m.Group | None = None


class ReservationsQuery(_Query):
    """Filter a goal's reservations by state."""

    state: ReservationState | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler receives: path parameters and the validated query and body."""

    path: Mapping[str, str]
    query: Any
    body: Any


Handler = Callable[["OperatorApi", Call], BaseModel]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One operator endpoint."""

    method: str
    path: str
    name: str
    summary: str
    response: type[BaseModel]
    handler: Handler
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    status: int = 200


class OperatorApi:
    """The operator's view of the store."""

    def __init__(self, store: Store, tokens: TokenAuthority, settings: PlaneSettings,
                 on_revoke: Callable[[str], None]) -> None:
        self.store = store
        self.tokens = tokens
        self.settings = settings
        self._on_revoke = on_revoke

    def create_goal(self, call: Call) -> m.GoalResult:
        """Create a goal."""
        b: m.CreateGoalRequest = call.body
        goal = self.store.create_goal(GoalSpec(
            objective=b.objective, budget_micro_usd=b.budget_micro_usd, call_cap=b.call_cap,
            deadline=b.deadline, max_depth=b.max_depth, policy=b.policy, evaluator=b.evaluator))
        return m.GoalResult.model_construct(goal=goal)

    def list_goals(self, call: Call) -> m.GoalsResult:
        """Every goal."""
        return m.GoalsResult.model_construct(goals=self.store.list_goals())

    def get_goal(self, call: Call) -> m.GoalResult:
        """One goal."""
        return m.GoalResult.model_construct(goal=self.store.get_goal(call.path["goal_id"]))

    def create_task(self, call: Call) -> m.TaskResult:
        """Create a top-level task."""
        b: m.CreateTaskRequest = call.body
        task = self.store.create_task(call.path["goal_id"], TaskSpec(
            title=b.title, prompt=b.prompt, group=b.group, budget_micro_usd=b.budget_micro_usd,
            call_cap=b.call_cap, priority=b.priority))
        return m.TaskResult.model_construct(task=task)

    def list_tasks(self, call: Call) -> m.TasksResult:
        """A goal's tasks."""
        q: TasksQuery = call.query
        goal = self.store.get_goal(call.path["goal_id"])
        tasks = self.store.list_tasks(goal.id, state=q.state, group=q.group)
        return m.TasksResult.model_construct(tasks=tasks)

    def get_task(self, call: Call) -> m.TaskResult:
        """One task."""
        return m.TaskResult.model_construct(task=self.store.get_task(call.path["task_id"]))

    def cancel_task(self, call: Call) -> m.TaskResult:
        """End a task for good; its unspent envelope goes back to its goal (or its parent)."""
        b: m.CancelTaskRequest = call.body
        return m.TaskResult.model_construct(task=self.store.cancel_task(call.path["task_id"], b.reason))

    def complete_task(self, call: Call) -> m.CompletionResult:
        """Complete a task that has a finding, as a run's coordinator does; a done task stays as it is."""
        task_id = check_path_id("task_id", call.path["task_id"])
        outcome, task = complete_task(self.store, task_id, OPERATOR)
        return m.CompletionResult.model_construct(outcome=outcome, task=task)

    def list_workers(self, call: Call) -> m.WorkersResult:
        """A goal's workers."""
        goal = self.store.get_goal(call.path["goal_id"])
        return m.WorkersResult.model_construct(
            workers=[m.WorkerView.of(w) for w in self.store.list_workers(goal.id)])

    def issue_worker(self, call: Call) -> m.IssuedWorker:
        """Register a worker and issue its token."""
        b: m.IssueWorkerRequest = call.body
        goal = self.store.get_goal(call.path["goal_id"])
        token, identity = self.tokens.issue(goal.id, b.group, ttl_s=b.ttl_s)
        worker = self.store.get_worker(identity.worker_id)
        return m.IssuedWorker.model_construct(worker=m.WorkerView.of(worker), token=token)

    def revoke_worker(self, call: Call) -> m.WorkersResult:
        """Revoke a worker's token; its next call is refused."""
        worker_id = call.path["worker_id"]
        self.store.get_worker(worker_id)  # 404 for an unknown id before any change
        self.tokens.revoke(worker_id)
        self._on_revoke(worker_id)
        return m.WorkersResult.model_construct(workers=[m.WorkerView.of(self.store.get_worker(worker_id))])

    def read_board(self, call: Call) -> m.BoardReadResult:
        """A goal's board, every group unless one is named."""
        q: BoardQuery = call.query
        goal = self.store.get_goal(call.path["goal_id"])
        posts = self.store.read_board(goal.id, after=q.after, limit=q.limit, group=q.group)
        return m.BoardReadResult.model_construct(posts=posts, cursor=posts[-1].seq if posts else q.after)

    def post(self, call: Call) -> m.PostResult:
        """A post with no task (a consolidation is seen by every group)."""
        b: m.OperatorPostRequest = call.body
        size = len(b.body.encode())
        if size > self.settings.max_post_bytes:
            raise PayloadTooLargeError("post", size, self.settings.max_post_bytes)
        goal = self.store.get_goal(call.path["goal_id"])
        post = self.store.post_as_operator(goal.id, b.kind, b.body, author="operator", group=b.group)
        return m.PostResult.model_construct(post=post)

    def read_findings(self, call: Call) -> m.FindingsResult:
        """A goal's findings."""
        q: FindingsQuery = call.query
        goal = self.store.get_goal(call.path["goal_id"])
        return m.FindingsResult.model_construct(
            findings=self.store.read_findings(goal.id, group=q.group, after=q.after, limit=q.limit))

    def list_reservations(self, call: Call) -> m.ReservationsResult:
        """A goal's reservations."""
        q: ReservationsQuery = call.query
        goal = self.store.get_goal(call.path["goal_id"])
        return m.ReservationsResult.model_construct(
            reservations=self.store.list_reservations(goal.id, state=q.state))

    def reconcile(self, call: Call) -> m.ReservationResult:
        """Settle or release an unknown reservation."""
        b: m.ReconcileRequest = call.body
        reservation = self.store.reconcile(call.path["reservation_id"], b.actual_micro_usd)
        return m.ReservationResult.model_construct(reservation=reservation)


_G = "/v1/operator/goals/{goal_id}"

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("POST", "/v1/operator/goals", "create_goal", "Create a goal", m.GoalResult,
             OperatorApi.create_goal, body=m.CreateGoalRequest, status=201),
    Endpoint("GET", "/v1/operator/goals", "list_goals", "List goals", m.GoalsResult, OperatorApi.list_goals),
    Endpoint("GET", _G, "get_goal", "Get a goal", m.GoalResult, OperatorApi.get_goal),
    Endpoint("POST", f"{_G}/tasks", "create_task", "Create a task", m.TaskResult, OperatorApi.create_task,
             body=m.CreateTaskRequest, status=201),
    Endpoint("GET", f"{_G}/tasks", "list_tasks", "List a goal's tasks", m.TasksResult, OperatorApi.list_tasks,
             query=TasksQuery),
    Endpoint("GET", "/v1/operator/tasks/{task_id}", "get_task", "Get a task", m.TaskResult,
             OperatorApi.get_task),
    Endpoint("POST", "/v1/operator/tasks/{task_id}/cancel", "cancel_task",
             "End a task; its unspent envelope goes back to its goal", m.TaskResult, OperatorApi.cancel_task,
             body=m.CancelTaskRequest),
    Endpoint("POST", "/v1/operator/tasks/{task_id}/complete", "complete_task",
             "Complete a task that has a finding (a done one is answered already_done)", m.CompletionResult,
             OperatorApi.complete_task, body=m.CompleteTaskRequest),
    Endpoint("GET", f"{_G}/workers", "list_workers", "List a goal's workers", m.WorkersResult,
             OperatorApi.list_workers),
    Endpoint("POST", f"{_G}/workers", "issue_worker", "Register a worker and issue its token", m.IssuedWorker,
             OperatorApi.issue_worker, body=m.IssueWorkerRequest, status=201),
    Endpoint("POST", "/v1/operator/workers/{worker_id}/revoke", "revoke_worker", "Revoke a worker's token",
             m.WorkersResult, OperatorApi.revoke_worker),
    Endpoint("GET", f"{_G}/board", "read_board", "Read a goal's board", m.BoardReadResult,
             OperatorApi.read_board, query=BoardQuery),
    Endpoint("POST", f"{_G}/board", "post", "Post to a goal's board (consolidations reach every group)",
             m.PostResult, OperatorApi.post, body=m.OperatorPostRequest, status=201),
    Endpoint("GET", f"{_G}/findings", "read_findings", "Read a goal's findings", m.FindingsResult,
             OperatorApi.read_findings, query=FindingsQuery),
    Endpoint("GET", f"{_G}/reservations", "list_reservations", "List a goal's reservations",
             m.ReservationsResult, OperatorApi.list_reservations, query=ReservationsQuery),
    Endpoint("POST", "/v1/operator/reservations/{reservation_id}/reconcile", "reconcile",
             "Settle or release an unknown reservation", m.ReservationResult, OperatorApi.reconcile,
             body=m.ReconcileRequest),
)
