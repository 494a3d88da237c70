"""A run's figures, the seed's benchmark table: score, wall time, time per worker, model calls, tokens in and
out, settled spend, leftover holds and provider keys found in the machines.

``swarmyard run`` prints them as a table on stderr, and with ``--json`` as one object on stdout
(``RunFigures.to_dict``: ``score``, ``wall_s``, ``worker_s``, ``calls``, ``tokens_in``, ``tokens_out``,
``spend_micro_usd``, ``leftover_holds``, ``keys_found``, and for a run with broadcasts between rounds
``broadcast_followups``, ``built_on_broadcast`` and ``improved_on_broadcast``: see
``swarmyard.report.consolidation`` for what each counts; ``tasks_done``, and ``tasks_failed`` as a list of
``{"task", "title", "reason"}``, every failed task with the reason the store recorded).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from swarmyard.domain import ReservationState, TaskState
from swarmyard.money import format_usd
from swarmyard.report.data import ReportData

#: Reservation states that still hold money when the run is over: each is a leftover hold.
_HOLDING = (ReservationState.HELD, ReservationState.UNKNOWN)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """The figures of one run. ``score`` is the evaluator's final holdout score (``None``: no evaluator, or no
    holdout score); ``keys_found`` the places a provider key was seen in a machine (``None``: not scanned),
    ``keys_held`` whether the broker held any key to look for (a keyless run's 0 proves nothing);
    ``worker_s`` the mean wall time of a worker's agent run (the lead's included); ``broadcast_followups`` the
    (broadcast, group) pairs of a ``groups`` run, of which ``built_on_broadcast`` cited another group's broadcast
    and ``improved_on_broadcast`` scored above it (all three ``None``: the run broadcast nothing)."""

    run_id: str
    score: int | None
    wall_s: float
    worker_s: float
    workers: int
    calls: int
    tokens_in: int
    tokens_out: int
    spend_micro_usd: int
    leftover_holds: int
    keys_found: int | None
    keys_held: bool = False
    broadcast_followups: int | None = None
    built_on_broadcast: int | None = None
    improved_on_broadcast: int | None = None
    tasks_done: int = 0
    tasks_failed: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, data: ReportData, keys_found: int | None, *, keys_held: bool = False) -> RunFigures:
        """The figures of a finished run's report data."""
        spans = [s for s in data.spans if s.ended_at >= s.started_at]
        mean = sum(s.ended_at - s.started_at for s in spans) / len(spans) if spans else 0.0
        holdout = data.scores.holdout if data.scores is not None else None
        settled = sum(r.actual or 0 for r in data.reservations if r.state is ReservationState.SETTLED)
        cross = data.cross_group()
        broadcast = cross.broadcasts > 0
        return cls(
            run_id=data.run_id,
            score=holdout.score if holdout is not None else None,
            wall_s=round(data.wall_s, 2),
            worker_s=round(mean, 2),
            workers=len({s.row for s in spans}),
            calls=data.calls,
            tokens_in=data.input_tokens,
            tokens_out=data.output_tokens,
            spend_micro_usd=settled,
            leftover_holds=sum(1 for r in data.reservations if r.state in _HOLDING),
            keys_found=keys_found,
            keys_held=keys_held,
            broadcast_followups=len(cross.followups) if broadcast else None,
            built_on_broadcast=cross.built_on if broadcast else None,
            improved_on_broadcast=cross.improved_on if broadcast else None,
            tasks_done=sum(1 for t in data.tasks if t.state is TaskState.DONE),
            tasks_failed=[{"task": t.id, "title": t.title, "reason": t.result or ""}
                          for t in data.tasks if t.state is TaskState.FAILED],
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as one JSON object."""
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        """(figure, value) rows of the table."""
        return [
            ("score", "-" if self.score is None else f"{self.score:,}"),
            ("wall time", f"{self.wall_s:.2f} s"),
            ("time per worker", f"{self.worker_s:.2f} s ({self.workers} workers)"),
            ("model calls", str(self.calls)),
            ("input tokens", f"{self.tokens_in:,}"),
            ("output tokens", f"{self.tokens_out:,}"),
            ("settled spend", format_usd(self.spend_micro_usd)),
            ("leftover holds", str(self.leftover_holds)),
            ("provider keys found in sandboxes", self._keys()),
            *self._cross_group_rows(),
        ]

    def _keys(self) -> str:
        if self.keys_found is None:
            return "not scanned"
        if not self.keys_found and not self.keys_held:
            return "0 (no key held)"
        return str(self.keys_found)

    def _cross_group_rows(self) -> list[tuple[str, str]]:
        if self.broadcast_followups is None:
            return []
        of = f" of {self.broadcast_followups}"
        return [("best attempts built on another group's broadcast", f"{self.built_on_broadcast}{of}"),
                ("best attempts that beat another group's broadcast", f"{self.improved_on_broadcast}{of}")]
