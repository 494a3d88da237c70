"""The nouns of a run that both sides read: tasks and their envelopes, posts, findings and their citations, artifacts
and ``explore`` directions, with the states and kinds they carry (the built-in agent reads its answers into them).

Import them from :mod:`swarmyard.domain`.
"""

from __future__ import annotations

from dataclasses import dataclass
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
