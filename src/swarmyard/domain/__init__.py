"""The nouns of a run: goals, tasks, claims, posts, findings, artifacts, envelopes and reservations.

All are frozen dataclasses; states are ``StrEnum``s, whose transitions the store enforces
(``IllegalTransitionError``). Money is ``int`` micro-USD; times are float seconds
from the injected clock.

Import every noun from here. They live in two modules: :mod:`~swarmyard.domain.shared`, what the built-in agent
reads too (tasks, posts, findings, citations, artifacts, directions, envelopes, the states), and
:mod:`~swarmyard.domain.host`, what only the host side uses (goals and their specs, task specs, claims,
reservations, prices, workers, events, the ``explore`` settings and score records). The host's are loaded the
first time one of them is asked for here: the agent, started in every machine, does not build their classes (about
7 ms of CPU at each start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swarmyard.domain.shared import (
    FINDING_TRANSITIONS,
    LEAD_GROUP,
    PLANNER_GROUP,
    Artifact,
    Citation,
    CitationKind,
    Direction,
    Envelope,
    Finding,
    FindingStatus,
    Post,
    PostKind,
    ReservationState,
    Task,
    TaskState,
)

#: the nouns of :mod:`swarmyard.domain.host`, imported when one is first asked for
_HOST = frozenset({"Claim", "Event", "ExploreSettings", "Goal", "GoalSpec", "Price", "Quotas", "Reservation",
                   "ScoreRecord", "TaskSpec", "Worker"})

if TYPE_CHECKING:
    from swarmyard.domain.host import (
        Claim,
        Event,
        ExploreSettings,
        Goal,
        GoalSpec,
        Price,
        Quotas,
        Reservation,
        ScoreRecord,
        TaskSpec,
        Worker,
    )
else:
    def __getattr__(name: str) -> Any:
        if name in _HOST:
            from swarmyard.domain import host

            return getattr(host, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "FINDING_TRANSITIONS", "LEAD_GROUP", "PLANNER_GROUP", "Artifact", "Citation", "CitationKind", "Claim", "Direction",
    "Envelope", "Event", "ExploreSettings", "Finding", "FindingStatus", "Goal", "GoalSpec", "Post", "PostKind", "Price",
    "Quotas", "Reservation", "ReservationState", "ScoreRecord", "Task", "TaskSpec", "TaskState", "Worker",
]
