"""What a run report shows, gathered from the store plus the coordinator's per-worker timeline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swarmyard.domain import Finding, Goal, Post, Reservation, ReservationState, Task
from swarmyard.report.consolidation import CrossGroup, cross_group


@dataclass(frozen=True, slots=True)
class WorkerSpan:
    """One agent run of one worker: when it ran, on which task, and how it ended."""

    worker_id: str
    task_id: str | None
    started_at: float
    ended_at: float
    ending: str
    steps: int = 0
    slot: str = ""
    #: the agent's exit code (``None``: it timed out, or never ran a process)
    exit_code: int | None = None
    #: why it ended badly, in a line (the last line of its stderr, say); empty when it did not
    error: str = ""

    @property
    def row(self) -> str:
        """The timeline row: the worker slot (a slot runs several agents, each with its own worker id)."""
        return self.slot or self.worker_id


@dataclass(frozen=True, slots=True)
class WorkerTotals:
    """What one worker row used: model calls, tokens in and out, and spend (settled, plus held or unknown)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    spent_micro_usd: int = 0

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


def reservation_cost(r: Reservation) -> int:
    """What a reservation counts as spent: its actual cost when settled, its hold while held or unknown."""
    if r.state is ReservationState.SETTLED and r.actual is not None:
        return r.actual
    return r.amount if r.state in (ReservationState.HELD, ReservationState.UNKNOWN) else 0


def worker_totals(
    reservations: tuple[Reservation, ...] | list[Reservation],
    rows: dict[str, str],
    task_owner: dict[str, str],
) -> dict[str, WorkerTotals]:
    """Totals per row: a call counts for the worker that held its task when it was reserved (``rows`` maps a
    worker id to its row, a worker slot); calls reserved before that was recorded fall back to the task's
    last claimant. Released calls never reached a provider and are not counted."""
    out: dict[str, WorkerTotals] = {}
    for r in reservations:
        if r.state is ReservationState.RELEASED:
            continue
        worker = r.worker_id or task_owner.get(r.task_id) or "unclaimed"
        key = rows.get(worker, worker)
        t = out.get(key, WorkerTotals())
        out[key] = WorkerTotals(t.calls + 1, t.input_tokens + r.input_tokens, t.output_tokens + r.output_tokens,
                                t.spent_micro_usd + reservation_cost(r))
    return out


@dataclass(frozen=True, slots=True)
class ScorePoint:
    """One evaluator score of an artifact: seconds into the run, the score, the worker row that made the artifact
    and the artifact's SHA-256."""

    at_s: float
    score: int
    worker: str
    sha256: str


@dataclass(frozen=True, slots=True)
class RunScores:
    """What the run's evaluator said: every search score (oldest first) and the one final holdout score.

    ``holdout_note`` says why there is no holdout score when there is none (no artifact was scored, or the
    evaluator had already answered this goal's holdout).
    """

    evaluator: str
    search: tuple[ScorePoint, ...] = ()
    holdout: ScorePoint | None = None
    holdout_note: str = ""
    #: the evaluator's Ed25519 public key (base64): every signed score of the run verifies with it
    public_key: str = ""

    @property
    def best(self) -> ScorePoint | None:
        """The first artifact to reach the best search score."""
        return max(self.search, key=lambda p: p.score, default=None)

    def best_over_time(self) -> list[ScorePoint]:
        """The search scores that raised the best so far: the best search score over time, and who reached it."""
        out: list[ScorePoint] = []
        for point in self.search:
            if not out or point.score > out[-1].score:
                out.append(point)
        return out


@dataclass(frozen=True, slots=True)
class ReportData:
    """Everything the report renders."""

    run_id: str
    goal: Goal
    tasks: tuple[Task, ...]
    findings: tuple[Finding, ...]
    posts: tuple[Post, ...]
    reservations: tuple[Reservation, ...]
    spans: tuple[WorkerSpan, ...] = ()
    synthesis: Finding | None = None
    audit_root: str | None = None
    audit_key: str | None = None  # the log's verifier key: ``swarmyard audit verify --log-key`` pins it
    wall_s: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    #: the evaluator's scores, when the run named one (``[evaluator]``)
    scores: RunScores | None = None
    #: the best search score of each task's artifacts (tasks without a scored artifact are absent)
    task_scores: Mapping[str, int] = field(default_factory=dict)

    @property
    def spent_micro_usd(self) -> int:
        """Settled spend plus what is still held or unknown (the honest upper bound)."""
        return sum(reservation_cost(r) for r in self.reservations)

    @property
    def input_tokens(self) -> int:
        """Input tokens of every settled call, as the provider reported them (or the broker counted)."""
        return sum(r.input_tokens for r in self.reservations)

    @property
    def output_tokens(self) -> int:
        """Output tokens of every settled call."""
        return sum(r.output_tokens for r in self.reservations)

    @property
    def calls(self) -> int:
        """Model calls that were reserved (released ones never reached a provider)."""
        return sum(1 for r in self.reservations if r.state is not ReservationState.RELEASED)

    def by_worker(self) -> dict[str, WorkerTotals]:
        """Calls, tokens and spend per timeline row (worker slot), sorted by row."""
        rows = {s.worker_id: s.row for s in self.spans}
        owner = {t.id: t.worker_id for t in self.tasks if t.worker_id}
        return dict(sorted(worker_totals(self.reservations, rows, owner).items()))

    def cross_group(self) -> CrossGroup:
        """How often a group's next best attempt built on another group's broadcast (``groups`` runs)."""
        return cross_group(self.tasks, self.findings, self.posts, self.task_scores)

    def spend_by_worker(self) -> dict[str, int]:
        """Micro-USD per timeline row (settled, plus held or unknown)."""
        return {row: t.spent_micro_usd for row, t in self.by_worker().items() if t.spent_micro_usd}
