"""The ``Store`` protocol: every durable fact of a run goes through it.

Two engines implement it and pass one contract suite: SQLite (WAL, embedded default) and PostgreSQL.
Every write that names a task takes that task's fencing token and is refused with
``StaleFencingTokenError`` or ``LeaseExpiredError`` unless it is the current claim with a live lease.
Every state change also appends an audit event in the same transaction.

``Store`` is the union of one protocol per concern (``LifecycleStore``, ``TasksStore``, ``BoardStore``,
``FindingsStore``, ``ExploreStore``, ``LedgerStore``, ``WorkersStore``, ``ReplicasStore``, ``AuditStore``), each
method in exactly one of them: a caller that needs only one concern takes that protocol, not the whole store.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from swarmyard.domain import (
    Artifact,
    Citation,
    Claim,
    Direction,
    Event,
    ExploreSettings,
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
    ScoreRecord,
    Task,
    TaskSpec,
    TaskState,
    Worker,
)
from swarmyard.store.directions import ScoreKey

#: Default limits; a store may be opened with others.
DEFAULT_POST_LIMIT_BYTES = 16 * 1024
DEFAULT_FINDING_LIMIT_BYTES = 64 * 1024
DEFAULT_ARTIFACT_LIMIT_BYTES = 16 * 1024 * 1024

#: A goal's quotas unless its spec says otherwise (see :class:`~swarmyard.domain.Quotas`).
DEFAULT_QUOTAS = Quotas()


class LifecycleStore(Protocol):
    """The store itself: its URL, how it takes writes, and its connections."""

    url: str
    #: True when the store takes one write at a time (SQLite's write lock): more threads than one or two
    #: would only queue on it.
    single_writer: bool

    def close(self) -> None:
        """Release connections."""
        ...

    def nowait(self) -> AbstractContextManager[bool]:
        """A block in which this thread's writes fail with ``StoreBusyError`` rather than wait for the write
        lock; it yields False where the store cannot do that, and writes wait as usual."""
        ...


class TasksStore(Protocol):
    """Goals and their tasks, and the claims on tasks: leases, fencing tokens and the slices of the budget
    claims carve."""

    # -- goals and tasks ------------------------------------------------------------------------------------
    def create_goal(self, spec: GoalSpec) -> Goal:
        """Create a goal and its envelope."""
        ...

    def get_goal(self, goal_id: str) -> Goal:
        """The goal, or ``NotFoundError``."""
        ...

    def list_goals(self) -> list[Goal]:
        """Every goal, oldest first."""
        ...

    def create_task(self, goal_id: str, spec: TaskSpec) -> Task:
        """Create a top-level task; its envelope is carved from the goal's unallocated budget."""
        ...

    def delegate(self, parent_id: str, token: int, spec: TaskSpec) -> Task:
        """Create a sub-task under a claimed task, one level deeper, its envelope carved from the parent's."""
        ...

    def get_task(self, task_id: str) -> Task:
        """The task, or ``NotFoundError``."""
        ...

    def cancel_task(self, task_id: str, reason: str) -> Task:
        """End a pending or claimed task for good; the unspent part of its envelope goes to its nearest live
        ancestor, else to the goal's unallocated budget."""
        ...

    def fail_unaffordable(self, goal_id: str, min_slice_micro_usd: int, *, group: str | None = None) -> list[Task]:
        """Fail, each exactly once, the goal's claimable tasks (of ``group``) whose envelope cannot afford one
        call's worst case, or that have no model call left and can get none back (those ``claim`` refuses a
        claimer that makes calls); their unspent budget goes where a cancelled task's goes."""
        ...

    def list_tasks(self, goal_id: str, *, state: TaskState | None = None, group: str | None = None) -> list[Task]:
        """A goal's tasks, in creation order."""
        ...

    # -- claims ---------------------------------------------------------------------------------------------
    def claim(self, goal_id: str, worker_id: str, lease_s: float, *, task_id: str | None = None,
              group: str | None = None, min_slice_micro_usd: int = 0, calls: bool = False) -> Claim | None:
        """Claim ``task_id`` or any claimable task of the goal (in ``group``); ``None`` if nothing is claimable.
        The claim carves the task's slice of the budget from the goal's envelope. For a claimer that makes model
        calls (``calls``, or one naming ``min_slice_micro_usd``, one call's worst case) a task that cannot make
        one is skipped, and, when nothing else is claimable, refused: ``BudgetExceededError`` for a slice too
        small, ``NoCallsLeftError`` for a task with no call left."""
        ...

    def return_ended_slices(self, goal_id: str | None = None, *, every: bool = False) -> list[str]:
        """Give back to their goals the slices of claims that ended without doing so (expired leases; with
        ``every``, the goal's live claims too), each exactly once; the ids of the tasks."""
        ...

    def renew(self, task_id: str, token: int, lease_s: float) -> Claim:
        """Extend a live claim's lease."""
        ...

    def release(self, task_id: str, token: int) -> Task:
        """Give a claimed task back (it becomes pending)."""
        ...

    def complete(self, task_id: str, token: int, result: str | None = None) -> Task:
        """Mark a claimed task done."""
        ...

    def fail(self, task_id: str, token: int, reason: str) -> Task:
        """Mark a claimed task failed."""
        ...

    def current_claim(self, worker_id: str) -> Claim | None:
        """The worker's live claim (the most recent one whose lease has not run out), if any."""
        ...

    def check_fence(self, task_id: str, token: int) -> Task:
        """Raise unless ``token`` is the task's current claim with a live lease; return the task."""
        ...


class BoardStore(Protocol):
    """A goal's board: posts under a claimed task, or the operator's."""

    def post(self, task_id: str, token: int, kind: PostKind, body: str, *, author: str,
             group: str | None = None) -> Post:
        """Append a post to the goal's board under a claimed task; ``group`` defaults to the task's."""
        ...

    def post_as_operator(self, goal_id: str, kind: PostKind, body: str, *, author: str, group: str) -> Post:
        """Append a post with no task (coordinator consolidations, operator notes)."""
        ...

    def read_board(self, goal_id: str, *, after: int = 0, limit: int = 100, group: str | None = None,
                   kinds: Sequence[PostKind] | None = None, author: str | None = None) -> list[Post]:
        """Posts with ``seq > after`` in sequence order, at most ``limit``."""
        ...


class FindingsStore(Protocol):
    """Findings and the content-addressed artifacts they cite."""

    def put_artifact(self, task_id: str, token: int, data: bytes, *, author: str,
                     media_type: str = "application/octet-stream") -> Artifact:
        """Store a blob content-addressed by SHA-256 under a claimed task (idempotent per goal and hash)."""
        ...

    def get_artifact(self, goal_id: str, sha256: str) -> Artifact:
        """Artifact metadata, or ``NotFoundError``."""
        ...

    def read_artifact(self, goal_id: str, sha256: str) -> bytes:
        """Artifact bytes (verified against the hash)."""
        ...

    def list_artifacts(self, goal_id: str) -> list[Artifact]:
        """A goal's artifact rows, oldest first."""
        ...

    def submit_finding(self, task_id: str, token: int, *, author: str, title: str, body: str,
                       citations: Sequence[Citation] = ()) -> Finding:
        """Record a finding; every citation must resolve within the goal."""
        ...

    def read_findings(self, goal_id: str, *, group: str | None = None, after: str | None = None,
                      limit: int = 100) -> list[Finding]:
        """Findings in submission order."""
        ...

    def get_finding(self, finding_id: str) -> Finding:
        """One finding, or ``NotFoundError``."""
        ...

    def set_finding_status(self, finding_id: str, status: FindingStatus, *, score: int | None = None) -> Finding:
        """Verify or reject a submitted finding."""
        ...


class ExploreStore(Protocol):
    """``explore``: a group's directions and the artifacts' scores (see ``swarmyard.store.directions``)."""

    def offer_directions(self, goal_id: str, group: str, names: Sequence[str], *, patience: int,
                         adopt_margin: int) -> ExploreSettings:
        """Set the group's ``explore`` settings and list its offered directions (both idempotent)."""
        ...

    def explore_settings(self, goal_id: str, group: str) -> ExploreSettings | None:
        """The group's ``explore`` settings, or ``None`` when the group does not explore."""
        ...

    def list_directions(self, goal_id: str, group: str | None = None) -> list[Direction]:
        """The goal's directions (of ``group``) with their live holders and best scores."""
        ...

    def claim_direction(self, task_id: str, token: int, names: Sequence[str], *, author: str) -> Direction | None:
        """Take the first of ``names`` no live claim holds, under the caller's claim; ``None`` when all are held."""
        ...

    def record_score(self, goal_id: str, sha256: str, score: int, *, split: str = "search",
                     task_id: str | None = None, worker_id: str | None = None) -> ScoreRecord:
        """Record an artifact's score, attributed to the task and worker that submitted it (by default the
        artifact's own), their group and the direction that task holds now."""
        ...

    def list_scores(self, goal_id: str, *, worker_id: str | None = None, task_id: str | None = None,
                    split: str | None = "search") -> list[ScoreRecord]:
        """The goal's scores on ``split`` (every split: ``None``), oldest first."""
        ...

    def best_scores(self, goal_id: str, *, by: ScoreKey, group: str | None = None,
                    split: str = "search") -> dict[str, int]:
        """The best score per worker, direction, group or task."""
        ...


class LedgerStore(Protocol):
    """The ledger: model prices and the reservations (holds) that charge the envelopes."""

    def set_price(self, price: Price) -> None:
        """Insert or replace a model's price."""
        ...

    def get_price(self, model: str) -> Price:
        """A model's price, or ``NotFoundError``."""
        ...

    def reserve(self, task_id: str, token: int, *, model: str, amount: int, method: str,
                body_digest: str | None = None) -> Reservation:
        """Hold ``amount`` on the task's and the goal's envelopes and count one call, in one transaction
        (``DuplicateOfUnknownError`` when ``body_digest`` is that of this worker's call whose hold is unknown)."""
        ...

    def reserve_for_worker(self, worker_id: str, token_hash: str, *, model: str, amount: int,
                           method: str, body_digest: str | None = None) -> Reservation:
        """``reserve`` on the worker's live claim, in the same transaction checking that the worker is not
        revoked and ``token_hash`` is its current token (``InvalidTokenError``; ``ConflictError`` when it
        holds no live claim)."""
        ...

    def settle(self, reservation_id: str, actual: int, *, input_tokens: int = 0,
               output_tokens: int = 0) -> Reservation:
        """Replace a hold by the actual cost (a held or unknown reservation), recording the tokens used."""
        ...

    def release_reservation(self, reservation_id: str) -> Reservation:
        """Drop a hold (a held or unknown reservation); nothing is spent."""
        ...

    def mark_unknown(self, reservation_id: str) -> Reservation:
        """The request left and the answer was lost: keep the hold until an operator reconciles."""
        ...

    def reconcile(self, reservation_id: str, actual: int | None) -> Reservation:
        """Settle an unknown reservation at ``actual``, or release it when ``actual`` is ``None``."""
        ...

    def get_reservation(self, reservation_id: str) -> Reservation:
        """One reservation, or ``NotFoundError``."""
        ...

    def list_reservations(self, goal_id: str, *, state: ReservationState | None = None) -> list[Reservation]:
        """A goal's reservations, oldest first."""
        ...


class WorkersStore(Protocol):
    """Workers and their capability tokens (stored hashed)."""

    def add_worker(self, worker_id: str, goal_id: str, group: str, token_hash: str, expires_at: float) -> Worker:
        """Register a worker and the hash of its capability token."""
        ...

    def get_worker(self, worker_id: str) -> Worker:
        """One worker, or ``NotFoundError``."""
        ...

    def list_workers(self, goal_id: str) -> list[Worker]:
        """A goal's workers."""
        ...

    def revoke_worker(self, worker_id: str) -> Worker:
        """Revoke a worker's token."""
        ...


class ReplicasStore(Protocol):
    """What several ``serve`` replicas share: rate buckets and the registry of live replicas (see
    ``swarmyard.store.replicas``)."""

    def take_rate_token(self, key: str, rate_per_s: float, burst: int) -> float:
        """Take one token from ``key``'s shared bucket: 0.0 when taken, else the seconds until one is free."""
        ...

    def rate_token_folded(self, key: str, rate_per_s: float, burst: int) -> AbstractContextManager[None]:
        """A block (one tool call) that takes one token from ``key``'s bucket as the first statement of its first
        write transaction on this thread (``RateLimitedError`` there when none is free, and that write does
        nothing); a block that commits no write takes it on its own as it ends."""
        ...

    def register_plane(self, plane_id: str) -> None:
        """This store serves replica ``plane_id``: record it alive and tag the holds it makes with it."""
        ...

    def plane_seen(self, plane_id: str) -> None:
        """Replica ``plane_id`` is alive now."""
        ...

    def sweep_dead_planes(self, grace_s: float) -> list[str]:
        """Mark ``unknown`` the holds still held by replicas unseen for ``grace_s`` seconds, and return the slices
        of expired claims to their goals; the ids of the holds marked."""
        ...


class AuditStore(Protocol):
    """The audit events: recorded with every change, sequenced into the audit log's leaves."""

    def record_event(self, kind: str, data: dict[str, object]) -> None:
        """Append an audit event for a change made outside the store (a machine created, a score issued)."""
        ...

    def sequence_events(self) -> int:
        """Give every committed, unsequenced event its leaf index, in order; return the new leaf count."""
        ...

    def read_events(self, start: int, end: int) -> list[Event]:
        """Sequenced events with ``start <= leaf_index < end``."""
        ...

    def unsequenced_events(self, limit: int = 100) -> list[Event]:
        """Events with no leaf index yet, oldest id first, at most ``limit`` (read-only: ``audit verify``)."""
        ...


class Store(LifecycleStore, TasksStore, BoardStore, FindingsStore, ExploreStore, LedgerStore, WorkersStore,
            ReplicasStore, AuditStore, Protocol):
    """The durable state of goals, tasks, claims, the board, findings, artifacts, the ledger and the audit events."""
