"""The nouns of a run: goals, tasks, claims, posts, findings, artifacts, envelopes and reservations.

All are frozen dataclasses; states are ``StrEnum``s, whose transitions the store enforces
(``IllegalTransitionError``). Money is ``int`` micro-USD; times are float seconds
from the injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class TaskState(StrEnum):
    """Where a task is in its life."""

    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The group of a goal's synthesis task: its one worker is the lead, and what it submits must be its own.
LEAD_GROUP = "lead"
#: The group of a goal's planning task (``plan = N``): its one worker is the planner, whose finding is the
#: lenses, not a result of the run.
PLANNER_GROUP = "planner"


class PostKind(StrEnum):
    """What a board post is."""

    NOTE = "note"
    DIRECTION = "direction"
    PROGRESS = "progress"
    FAILURE = "failure"
    QUESTION = "question"
    CONSOLIDATION = "consolidation"


class FindingStatus(StrEnum):
    """Whether a finding has been checked."""

    SUBMITTED = "submitted"
    VERIFIED = "verified"
    REJECTED = "rejected"


FINDING_TRANSITIONS: dict[FindingStatus, frozenset[FindingStatus]] = {
    FindingStatus.SUBMITTED: frozenset({FindingStatus.VERIFIED, FindingStatus.REJECTED}),
    FindingStatus.VERIFIED: frozenset(),
    FindingStatus.REJECTED: frozenset(),
}


class CitationKind(StrEnum):
    """What a citation points at."""

    POST = "post"
    ARTIFACT = "artifact"
    FINDING = "finding"
    SOURCE = "source"  # a line of the run's source files (``path:line``) and the words quoted from it


class ReservationState(StrEnum):
    """A budget hold's life: held, then settled, released, or unknown until an operator reconciles it."""

    HELD = "held"
    SETTLED = "settled"
    RELEASED = "released"
    UNKNOWN = "unknown"


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
class Task:
    """A unit of work under a goal, with its claim (if any) and its envelope."""

    id: str
    goal_id: str
    parent_id: str | None
    depth: int
    group: str
    title: str
    prompt: str
    state: TaskState
    revision: int
    fencing_token: int | None
    worker_id: str | None
    lease_expires_at: float | None
    attempts: int
    result: str | None
    created_at: float
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's hold on a task: its fencing token and lease expiry."""

    task: Task
    token: int
    worker_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class Citation:
    """A reference from a finding to a post (by sequence number), an artifact (sha256), a finding (id) or a line
    of the run's sources (``path:line``, with ``quote``: the words taken from that line, checked by the plane)."""

    kind: CitationKind
    ref: str
    quote: str = ""

    def to_dict(self) -> dict[str, str]:
        """The citation as stored and logged: ``kind`` and ``ref``, and ``quote`` when it has one."""
        out = {"kind": self.kind.value, "ref": self.ref}
        if self.quote:
            out["quote"] = self.quote
        return out


@dataclass(frozen=True, slots=True)
class Post:
    """One board message."""

    goal_id: str
    seq: int
    kind: PostKind
    group: str
    author: str
    task_id: str | None
    fencing_token: int | None
    body: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Finding:
    """A worker's result with its citations."""

    id: str
    goal_id: str
    task_id: str
    group: str
    author: str
    title: str
    body: str
    citations: tuple[Citation, ...]
    status: FindingStatus
    score: int | None
    created_at: float


@dataclass(frozen=True, slots=True)
class Artifact:
    """A content-addressed blob submitted under a task."""

    sha256: str
    goal_id: str
    task_id: str
    size: int
    media_type: str
    author: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Envelope:
    """A budget account. ``available = limit - reserved - settled`` never goes below zero."""

    limit: int
    reserved: int
    settled: int
    call_cap: int
    calls: int

    @property
    def available(self) -> int:
        """What can still be reserved."""
        return self.limit - self.reserved - self.settled


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
class Direction:
    """An ``explore`` direction of a goal's group and who holds it now.

    A direction has at most one holder: a worker takes it under its task claim (one conditional statement in
    the store, like a task claim), and the hold lives as long as that claim's lease (renewed with it, dropped
    when the task is released, completed or failed, or when the worker takes another direction).
    """

    goal_id: str
    group: str
    name: str
    #: listed by the swarm file (``policy.directions``), not named by a worker
    offered: bool
    #: the worker holding it now, its task and since when; ``None`` when nobody holds it
    holder: str | None
    task_id: str | None
    taken_at: float | None
    #: the best search score recorded on this direction, by anyone
    best_score: int | None
    #: whether any claim of the run has ever taken it, and how many scored attempts were made on it (by anyone):
    #: ``explore`` hands out untried directions first, then the least tried
    taken: bool = False
    attempts: int = 0


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
