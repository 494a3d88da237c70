"""Request and response bodies of the worker tools and the operator API, as pydantic models.

These models are the contract: requests are validated with them, strictly (a failure is a 400 naming the
field), and the OpenAPI schema at ``/openapi.json`` is written from them, so the published schema cannot drift.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from swarmyard.domain import (
    Artifact,
    CitationKind,
    Direction,
    Finding,
    Goal,
    Post,
    PostKind,
    Reservation,
    Task,
    Worker,
)
from swarmyard.plane.completion import Completion

Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")]
Token = Annotated[int, Field(ge=0, le=2**62)]
Limit = Annotated[int, Field(ge=1, le=500)]
MicroUSDField = Annotated[int, Field(ge=0, le=10**15)]
Group = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]
#: Post kinds a worker may use; ``consolidation`` is the coordinator's broadcast, from the operator only.
WorkerPostKind = Annotated[PostKind, Field(description="note, direction, progress, failure or question")]


class _Body(BaseModel):
    # strict: a count, a fencing token or an amount of money is a JSON integer, never "1", true or 1.0
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ClaimTaskRequest(_Body):
    """Claim a task of the worker's goal and group (a named one, or the next claimable). ``model`` and
    ``max_tokens``: what the worker's model calls will ask the broker for, when it knows; a task whose envelope
    cannot afford the least such call is refused (402 ``budget_exceeded``), and without them the least call of
    any model the broker routes. A task with no model call left (its own cap, or its goal's, used up) is skipped
    for one that has, and named when none has (402 ``no_calls_left``)."""

    task_id: Id | None = None
    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class _Fenced(_Body):
    task_id: Id
    fencing_token: Token


class HeartbeatRequest(_Fenced):
    """Renew the lease of the caller's claim."""


class BoardReadRequest(_Fenced):
    """Read the group's board after a cursor (a post sequence number)."""

    after: Annotated[int, Field(ge=0, le=2**62)] = 0
    limit: Limit = 100
    kinds: list[PostKind] | None = Field(default=None, max_length=10)


class BoardPostRequest(_Fenced):
    """Append a post to the group's board."""

    kind: WorkerPostKind = PostKind.NOTE
    body: Annotated[str, Field(min_length=1)]


#: Citations one finding may carry.
MAX_CITATIONS = 10_000
#: Characters a source citation may quote (a source line as textsearch returns it is at most 400 bytes).
MAX_QUOTE_CHARS = 1000


class CitationModel(_Body):
    """A reference to a post (its sequence number), an artifact (sha256), a finding (id) or a line of the run's
    sources (``path:line``, with ``quote``: words copied from that line, which the plane checks are there)."""

    kind: CitationKind
    ref: Annotated[str, Field(min_length=1, max_length=200)]
    quote: Annotated[str, Field(max_length=MAX_QUOTE_CHARS)] = ""


class SubmitFindingRequest(_Fenced):
    """Record a finding with its citations."""

    title: Annotated[str, Field(min_length=1, max_length=500)]
    body: Annotated[str, Field(min_length=1)]
    #: a lead cites every finding it synthesises, one a worker: room for the largest swarm planned (10,000
    #: workers); the request's byte bound (``max_request_bytes``) holds the body to 1 MiB whatever the count
    citations: list[CitationModel] = Field(default_factory=list, max_length=MAX_CITATIONS)


class ReadFindingsRequest(_Fenced):
    """Read the group's findings after a finding id, and the consolidations broadcast to every group."""

    after: Id | None = None
    limit: Limit = 100
    broadcast_after: Annotated[int, Field(ge=0, le=2**62)] = 0


class SubmitArtifactRequest(_Fenced):
    """Submit a blob (base64) and, when an evaluator is configured, have it scored."""

    data_base64: str
    media_type: Annotated[str, Field(min_length=1, max_length=200)] = "application/octet-stream"
    split: Annotated[str, Field(pattern=r"^[a-z_]{1,40}$")] = "search"


class ClaimDirectionRequest(_Fenced):
    """Take a direction of the ``explore`` policy: the one named, or the first free one (untried ones first)."""

    direction: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class ReadDirectionsRequest(_Fenced):
    """The group's directions: who holds each now and its best score."""


class DelegateRequest(_Fenced):
    """Create a sub-task below the caller's task, its envelope carved from the caller's."""

    title: Annotated[str, Field(min_length=1, max_length=500)]
    prompt: Annotated[str, Field(max_length=100_000)] = ""
    budget_micro_usd: MicroUSDField = 0
    call_cap: Annotated[int, Field(ge=0, le=10**9)] = 0
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0


# -- responses ---------------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=False)


class ClaimResult(_Out):
    """The claimed task with its fencing token, or ``task: null`` when nothing is claimable."""

    task: Task | None
    fencing_token: int | None
    lease_expires_at: float | None


class HeartbeatResult(_Out):
    """The lease's new expiry."""

    task_id: str
    fencing_token: int
    lease_expires_at: float


class BoardReadResult(_Out):
    """Posts in sequence order and the cursor to pass as ``after`` next time."""

    posts: list[Post]
    cursor: int


class PostResult(_Out):
    """The post as stored."""

    post: Post


class FindingResult(_Out):
    """The finding as stored."""

    finding: Finding


class ReadFindingsResult(_Out):
    """The group's findings, the consolidations broadcast to all groups, and both cursors."""

    findings: list[Finding]
    cursor: str | None
    broadcasts: list[Post]
    broadcast_cursor: int


class DirectionMove(_Out):
    """Under ``explore``, where an attempt leaves its worker: ``stay`` on ``previous``, ``switch`` to a free
    direction after ``patience`` attempts in a row without a better score, or ``adopt`` a free direction whose
    best score is clearly better. ``direction`` is what the worker holds now and works on next."""

    direction: str
    previous: str
    reason: str
    best: int | None
    stale: int
    patience: int


class ArtifactResult(_Out):
    """The stored artifact and, with an evaluator, its signed score (and, under ``explore``, the direction move)."""

    artifact: Artifact
    score: dict[str, Any] | None = None
    direction: DirectionMove | None = None


class DirectionResult(_Out):
    """The direction taken (``null`` when every one asked for is held) and the group's directions."""

    direction: Direction | None
    directions: list[Direction]


class DirectionsResult(_Out):
    """The group's directions with their live holders and best scores."""

    directions: list[Direction]


class TaskResult(_Out):
    """One task."""

    task: Task


class ErrorBody(_Out):
    """Every error: a stable ``code``, a message, whether a retry may help, and the ids involved."""

    model_config = ConfigDict(extra="allow", frozen=True)
    code: str
    message: str
    retryable: bool


class ErrorResult(_Out):
    """The JSON body of every error response."""

    error: ErrorBody


# -- operator API -------------------------------------------------------------------------------------------


class CreateGoalRequest(_Body):
    """A new goal."""

    objective: Annotated[str, Field(min_length=1, max_length=100_000)]
    budget_micro_usd: MicroUSDField
    call_cap: Annotated[int, Field(ge=0, le=10**9)]
    deadline: Annotated[float, Field(ge=0, le=1e11)] | None = None
    max_depth: Annotated[int, Field(ge=0, le=32)] = 2
    policy: Annotated[str, Field(pattern=r"^(independent|team|explore|groups)$")] = "team"
    evaluator: Annotated[str, Field(min_length=1, max_length=1000)] | None = None


class CreateTaskRequest(_Body):
    """A new top-level task."""

    title: Annotated[str, Field(min_length=1, max_length=500)]
    prompt: Annotated[str, Field(max_length=100_000)] = ""
    group: Group = "main"
    budget_micro_usd: MicroUSDField = 0
    call_cap: Annotated[int, Field(ge=0, le=10**9)] = 0
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0


class IssueWorkerRequest(_Body):
    """Register a worker of a goal and group and issue its capability token."""

    group: Group = "main"
    ttl_s: Annotated[float, Field(gt=0, le=30 * 86400)] = 86400.0


class OperatorPostRequest(_Body):
    """A post with no task: a consolidation broadcast to every group, or an operator note."""

    kind: PostKind = PostKind.CONSOLIDATION
    body: Annotated[str, Field(min_length=1)]
    group: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^(\*|[A-Za-z0-9_.-]+)$",
                                description="a group, or * for every group")] = "*"


class CancelTaskRequest(_Body):
    """Why a task is ended for good."""

    reason: Annotated[str, Field(max_length=10_000)] = ""


class CompleteTaskRequest(_Body):
    """Complete a task that has a finding (an empty object: the finding is what it is completed with)."""


class CompletionResult(_Out):
    """What completing a task did (``already_done`` when it was done before: nothing changed), and the task."""

    outcome: Completion
    task: Task


class ReconcileRequest(_Body):
    """Settle an unknown reservation at ``actual_micro_usd``, or release it with ``null``."""

    actual_micro_usd: MicroUSDField | None


class GoalResult(_Out):
    """One goal."""

    goal: Goal


class GoalsResult(_Out):
    """Goals, oldest first."""

    goals: list[Goal]


class TasksResult(_Out):
    """Tasks in creation order."""

    tasks: list[Task]


class WorkersResult(_Out):
    """A goal's workers (token hashes omitted)."""

    workers: list[WorkerView]


class WorkerView(_Out):
    """A worker as the operator sees it; the token hash never leaves the store."""

    id: str
    goal_id: str
    group: str
    expires_at: float
    revoked: bool
    created_at: float

    @classmethod
    def of(cls, worker: Worker) -> WorkerView:
        """The view of a stored worker."""
        return cls(id=worker.id, goal_id=worker.goal_id, group=worker.group, expires_at=worker.expires_at,
                   revoked=worker.revoked, created_at=worker.created_at)


class IssuedWorker(_Out):
    """A new worker and its token (shown once; only its hash is stored)."""

    worker: WorkerView
    token: str


class FindingsResult(_Out):
    """Findings in submission order."""

    findings: list[Finding]


class ReservationResult(_Out):
    """One reservation."""

    reservation: Reservation


class ReservationsResult(_Out):
    """A goal's reservations."""

    reservations: list[Reservation]

