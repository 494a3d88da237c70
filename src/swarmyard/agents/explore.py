"""The ``explore`` policy inside the built-in agent: its direction comes from the store, through the tools.

The worker takes a direction with ``claim_direction`` (the first one no live peer holds; where the swarm file
offers none, its task's own title), so two workers never hold one. Every scored ``submit_artifact`` answers with
the worker's move (``stay``, ``switch`` after ``patience`` attempts in a row without a better score, ``adopt`` a
free direction whose peers' best is clearly better), already taken for it in the store by the plane; the agent
only tells its model and posts the new direction on the board for its peers to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from swarmyard.plane.tool_results import DirectionMove, DirectionResult


class _Tools(Protocol):
    async def claim_direction(self, direction: str | None = None) -> DirectionResult: ...


def direction_post(name: str) -> str:
    """The body of the board post that says which direction a worker took."""
    return f"direction: {name}"


@dataclass(slots=True)
class Explorer:
    """One worker's direction: ``None`` while it holds none (every direction is held by a live peer)."""

    direction: str | None = None

    async def start(self, tools: _Tools, fallback: str) -> str | None:
        """Take the first free direction; where the group offers none, the task's own title."""
        taken = await tools.claim_direction()
        if taken.direction is None and not taken.directions and fallback.strip():
            taken = await tools.claim_direction(fallback.strip()[:200])
        name = None if taken.direction is None else taken.direction.name
        self.direction = name
        return name

    def brief(self) -> str:
        """What the model is told about its direction at the start."""
        if self.direction is None:
            return ("\n\nEvery direction is held by a live peer: work on your task as given. Submit each attempt "
                    "with submit_artifact.")
        return (f"\n\nYour direction: {self.direction}. Submit each attempt with submit_artifact; its answer gives "
                "the score and says when to change direction.")

    def after_attempt(self, move: DirectionMove | None) -> str | None:
        """Follow the move a scored attempt answered with (``None``: none, the attempt was not scored); what to
        tell the model when the direction changed."""
        if move is None:
            return None
        new, old, reason = move.direction, move.previous, move.reason
        self.direction = new
        if reason == "stay" or new == old:
            return None
        why = ("a free direction scored clearly better than yours" if reason == "adopt"
               else f"{move.stale} attempts in a row did not beat your best ({move.best})")
        return f"Change of direction: work on {new!r} from now on (was {old!r}): {why}."
