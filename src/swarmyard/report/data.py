"""What a run report shows, gathered from the store plus the coordinator's per-worker timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmyard.domain import Finding, Goal, Post, Reservation, ReservationState, Task


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

    @property
    def row(self) -> str:
        """The timeline row: the worker slot (a slot runs several agents, each with its own worker id)."""
        return self.slot or self.worker_id


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
    wall_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def spent_micro_usd(self) -> int:
        """Settled spend plus what is still held or unknown (the honest upper bound)."""
        return sum(
            r.actual
            if r.state is ReservationState.SETTLED and r.actual is not None
            else (r.amount if r.state in (ReservationState.HELD, ReservationState.UNKNOWN) else 0)
            for r in self.reservations
        )

    @property
    def calls(self) -> int:
        """Model calls that were reserved (released ones never reached a provider)."""
        return sum(1 for r in self.reservations if r.state is not ReservationState.RELEASED)

    def spend_by_worker(self) -> dict[str, int]:
        """Settled micro-USD per worker, attributed through the task each reservation was made under."""
        owner = {t.id: t.worker_id or "unclaimed" for t in self.tasks}
        out: dict[str, int] = {}
        for r in self.reservations:
            if r.state is ReservationState.SETTLED and r.actual is not None:
                key = owner.get(r.task_id, "unclaimed")
                out[key] = out.get(key, 0) + r.actual
        return out
