"""How a worker's context is built from its prior scored attempts (``[workers] history``).

- ``scored_history``: the top-K scored attempts its group has made so far (its own and, on a shared board, its
  peers'), best first, with their scores, are packed into the context of every next attempt.
- ``single_draft_refinement``: only the best draft so far is kept; the next attempt refines it.

Either way the conversation restarts after each scored attempt from the brief plus that block, so the context
stays the size the setting says instead of growing with every attempt. A scored attempt is posted on the
group's board (``attempt score N:`` then the attempt), which is where a later attempt, a later agent run on the
task, or a peer on the same board reads it from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

SCORED_HISTORY = "scored_history"
SINGLE_DRAFT = "single_draft_refinement"
MODES = frozenset({SCORED_HISTORY, SINGLE_DRAFT})

#: Characters of one attempt kept in a post and in the context.
ATTEMPT_CHARS = 1500
_POST = re.compile(r"^attempt score (?P<score>-?\d+):\n(?P<content>.*)\Z", re.S)

#: The blocks' wording (data: a prompt is configuration, not logic).
INSTRUCTIONS = ("Submit each attempt with submit_artifact; you are told its score (higher is better). When you "
                "cannot improve further, call submit_finding with your best attempt and its score.")
HISTORY_HEAD = "The best scored attempts so far, best first (higher is better):"
DRAFT_HEAD = "The best draft so far; refine it into a better attempt:"
COUNT = "{count} attempts have been scored."


@dataclass(frozen=True, slots=True)
class Attempt:
    """One scored attempt."""

    score: int
    content: str


def attempt_post(score: int, content: str) -> str:
    """The board post that records a scored attempt."""
    return f"attempt score {score}:\n{content[:ATTEMPT_CHARS]}"


def attempts_on(bodies: Iterable[str]) -> list[Attempt]:
    """The scored attempts recorded on a board's posts (their bodies)."""
    out = []
    for body in bodies:
        if m := _POST.match(body):
            out.append(Attempt(int(m["score"]), m["content"]))
    return out


def best(attempts: Iterable[Attempt], k: int) -> list[Attempt]:
    """The ``k`` best distinct attempts, best first (the earliest of equal scores first)."""
    seen: set[str] = set()
    unique = []
    for attempt in attempts:
        if attempt.content not in seen:
            seen.add(attempt.content)
            unique.append(attempt)
    return sorted(unique, key=lambda a: -a.score)[:k]


def context_block(mode: str, attempts: Iterable[Attempt], top_k: int) -> str:
    """The block a worker's next attempt starts from: empty when nothing was scored yet. It says how many
    attempts were scored in all, which is also what tells one attempt's context from the next when the best
    ones have not changed."""
    made = list(attempts)
    kept = best(made, 1 if mode == SINGLE_DRAFT else top_k)
    if not kept:
        return ""
    head = DRAFT_HEAD if mode == SINGLE_DRAFT else HISTORY_HEAD
    return "\n".join([f"{COUNT.format(count=len(made))} {head}",
                      *(f"[score {a.score}] {a.content[:ATTEMPT_CHARS]}" for a in kept)])
