"""The ``explore`` policy inside the built-in agent: directions on the board, scores, switching and adopting.

A worker posts its direction (``direction: NAME``, kind ``direction``) where every slot of the goal reads it.
Every artifact it submits is one attempt: the evaluator's score (when one is configured) is posted as
``score N on direction: NAME``. After ``patience`` attempts in a row without a better score the worker switches
to a direction no active peer holds; it adopts a peer's direction only when that direction's best posted score
beats its own best by at least ``adopt_margin``. The decisions are the pure functions of
``swarmyard.swarm.policies``; this module only reads and writes the board's text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from swarmyard.swarm.policies import DirectionTracker, free_direction, next_direction

_DIRECTION = re.compile(r"^direction: (?P<name>.+)$")
_SCORE = re.compile(r"^score (?P<score>-?\d+) on direction: (?P<name>.+)$")


def direction_post(name: str) -> str:
    """The body of a post that takes a direction."""
    return f"direction: {name}"


def score_post(score: int, name: str) -> str:
    """The body of a post that reports an attempt's score."""
    return f"score {score} on direction: {name}"


def score_of(result: Any) -> int | None:
    """The integer score in a ``submit_artifact`` answer, or ``None`` (no evaluator, or a failed scoring)."""
    score = result.get("score") if isinstance(result, dict) else None
    value = score.get("score") if isinstance(score, dict) else score
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True)
class BoardView:
    """What the board says about directions: who holds which (latest post wins) and each direction's best."""

    held: dict[str, str] = field(default_factory=dict)
    best: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, posts: Iterable[Mapping[str, Any]]) -> BoardView:
        """Parse board posts (oldest first)."""
        view = cls()
        for post in posts:
            author, body = str(post.get("author", "")), str(post.get("body", "")).strip()
            if m := _SCORE.match(body):
                name, score = m["name"], int(m["score"])
                view.best[name] = max(score, view.best.get(name, score))
            elif m := _DIRECTION.match(body):
                view.held[author] = m["name"]
        return view

    def held_by_others(self, me: str) -> list[str]:
        """Directions that peers other than ``me`` hold now."""
        return [d for author, d in self.held.items() if author != me]


@dataclass(slots=True)
class Explorer:
    """One worker's direction and its attempts."""

    offered: tuple[str, ...]
    patience: int = 3
    adopt_margin: int = 10
    tracker: DirectionTracker = field(default_factory=lambda: DirectionTracker(""))

    def choose(self, view: BoardView, me: str, fallback: str) -> str:
        """The first direction: an offered one no peer holds, else ``fallback`` (the task's own title)."""
        direction = free_direction(self.offered, view.held_by_others(me)) or fallback
        self.tracker = DirectionTracker(direction, patience=self.patience)
        return direction

    def attempt(self, score: int | None, view: BoardView, me: str) -> str | None:
        """Count one attempt; the direction to move to, or ``None`` to stay."""
        self.tracker.record(score)
        peers = {d: s for d, s in view.best.items() if d != self.tracker.direction}
        offered = self.offered or tuple(dict.fromkeys([*view.held.values(), *view.best]))
        target = next_direction(self.tracker, offered, view.held_by_others(me), peers, self.adopt_margin)
        if target == self.tracker.direction:
            return None
        self.tracker.switch(target)
        return target
