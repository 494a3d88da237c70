"""The nouns of a run that only the host side uses (the store, the control plane, the coordinator): goals and their
specs, task specs, claims, reservations, prices, workers, events, and the ``explore`` settings and score records.

Import them from :mod:`swarmyard.domain`, as every other noun: this module is loaded the first time one of them is
asked for there, so the built-in agent (which reads none of them) does not build their classes at its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmyard.domain.shared import Envelope, ReservationState, Task


@dataclass(frozen=True, slots=True)
class Quotas:
    """What one goal may store in total, whatever its workers submit: kept on the goal's row when it is created
    (a goal made before quotas existed gets the store's), enforced in the same transaction as each write.

    ``task_artifact_bytes`` is each task's share of ``artifact_bytes`` (per task, not per worker: a worker token is
    bound to its task's claims, and a task's retries by other workers share its share). Content-addressed
    duplicates within a goal are stored once and counted once. Board quotas count workers' posts only: the
    coordinator's and the operator's posts are never refused, so a worker cannot crowd them out.
    """

    artifact_bytes: int = 256 * 1024 * 1024
    task_artifact_bytes: int = 64 * 1024 * 1024
    board_posts: int = 10_000
    board_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class GoalSpec:
    """What a caller asks for when creating a goal."""

    objective: str
    budget_micro_usd: int
    call_cap: int
    deadline: float | None = None
    max_depth: int = 2
    policy: str = "team"
    evaluator: str | None = None
    #: ``None``: the store's defaults
    quotas: Quotas | None = None


@dataclass(frozen=True, slots=True)
class Goal:
    """The objective of one run with its budget envelope."""

    id: str
    objective: str
    budget_micro_usd: int
    call_cap: int
    deadline: float | None
    max_depth: int
    policy: str
    evaluator: str | None
    created_at: float
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What a caller asks for when creating a task."""

    title: str
    prompt: str = ""
    group: str = "main"
    budget_micro_usd: int = 0
    call_cap: int = 0
    parent_id: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's hold on a task: its fencing token and lease expiry."""

    task: Task
    token: int
    worker_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class Reservation:
    """A worst-case hold on a task's and its goal's envelopes for one model call."""

    id: str
    goal_id: str
    task_id: str
    model: str
    amount: int
    actual: int | None
    state: ReservationState
    method: str
    created_at: float
    updated_at: float
    overage: int = 0
    #: the provider's reported (or the broker's counted) tokens, set when the call is settled
    input_tokens: int = 0
    output_tokens: int = 0
    #: the worker that held the task's claim when the call was reserved
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price in micro-USD per million tokens."""

    model: str
    input_per_mtok: int
    output_per_mtok: int


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker known to the control plane; its capability token is stored only as a hash."""

    id: str
    goal_id: str
    group: str
    token_hash: str
    expires_at: float
    revoked: bool
    created_at: float


@dataclass(frozen=True, slots=True)
class Event:
    """One audit event: a state change, as the canonical JSON that becomes a Merkle leaf."""

    id: int
    leaf_index: int | None
    kind: str
    body: bytes
    created_at: float
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExploreSettings:
    """The ``explore`` policy's settings for one group of a goal, kept in the store so the plane acts on them."""

    goal_id: str
    group: str
    #: attempts in a row without a better score before a worker is moved to a free direction
    patience: int
    #: how much better a free direction's best score must be than the worker's own for it to adopt that direction
    adopt_margin: int


@dataclass(frozen=True, slots=True)
class ScoreRecord:
    """One evaluator score of an artifact, with who made the artifact, in which group and on which direction."""

    goal_id: str
    task_id: str
    worker_id: str
    group: str
    direction: str | None
    sha256: str
    split: str
    score: int
    created_at: float
