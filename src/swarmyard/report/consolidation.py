"""How often a group's next best attempt built on what another group broadcast (the ``groups`` policy).

After a round the coordinator posts one broadcast, the same ``consolidation`` post on every group's board,
carrying each group's best findings. For every broadcast and every group that worked the round after it, the
group's best attempt of that round is its finding with the best score (the finding's own, from the artifacts it
cites, else the best its task's artifacts were scored; unscored findings rank last, the earliest wins a tie).
That attempt:

- **built on** the broadcast when it cites a finding of another group that the broadcast carried, or cites the
  broadcast post itself on its group's board (which carried another group's findings): the worker said it used
  them. Citations are the evidence; a score alone is not;
- **improved on** it when it scored strictly above the best score the broadcast carried from other groups: it
  came after and did better, whether it said so or not.

A pair counts only when the broadcast carried at least one finding of another group. The round after a broadcast
is told by time: the tasks made after its posts and before the next broadcast's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarmyard.domain import CitationKind, Finding, Post, PostKind, Task

_CARRIED = re.compile(r"\[(fnd_[0-9a-z]+)\]")


@dataclass(frozen=True, slots=True)
class Followup:
    """One group's best attempt in the round after one broadcast, and how it relates to that broadcast."""

    broadcast: int  # 1 for the first broadcast of the run
    group: str
    finding: str  # the best attempt's finding id
    score: int | None
    #: the best score among the other groups' findings the broadcast carried (``None``: none was scored)
    carried_best: int | None
    built_on: bool
    improved_on: bool


@dataclass(frozen=True, slots=True)
class CrossGroup:
    """Every (broadcast, group) pair of a run, and the counts the figures report."""

    broadcasts: int
    followups: tuple[Followup, ...]

    @property
    def built_on(self) -> int:
        """Best attempts that cite another group's broadcast findings, or the broadcast."""
        return sum(1 for f in self.followups if f.built_on)

    @property
    def improved_on(self) -> int:
        """Best attempts that scored above the best the broadcast carried from other groups."""
        return sum(1 for f in self.followups if f.improved_on)


def _score(f: Finding, task_scores: Mapping[str, int]) -> int | None:
    return f.score if f.score is not None else task_scores.get(f.task_id)


def _best(findings: Sequence[Finding], task_scores: Mapping[str, int]) -> Finding | None:
    def rank(f: Finding) -> tuple[int, int, float]:
        score = _score(f, task_scores)
        return (0 if score is not None else 1, -(score or 0), f.created_at)

    return min(findings, key=rank, default=None)


def _broadcasts(posts: Sequence[Post]) -> list[list[Post]]:
    """The consolidation posts, one list per broadcast (its copies share one text), oldest first."""
    by_text: dict[str, list[Post]] = {}
    for post in sorted(posts, key=lambda p: p.seq):
        if post.kind is PostKind.CONSOLIDATION:
            by_text.setdefault(post.body, []).append(post)
    return list(by_text.values())


def cross_group(tasks: Sequence[Task], findings: Sequence[Finding], posts: Sequence[Post],
                task_scores: Mapping[str, int]) -> CrossGroup:
    """The run's cross-group figure, from its tasks, findings, board and best score per task."""
    broadcasts = _broadcasts(posts)
    by_id = {f.id: f for f in findings}
    out: list[Followup] = []
    for n, copies in enumerate(broadcasts):
        start = max(p.created_at for p in copies)
        end = min((p.created_at for p in broadcasts[n + 1]), default=None) if n + 1 < len(broadcasts) else None
        carried = [by_id[ref] for ref in dict.fromkeys(_CARRIED.findall(copies[0].body)) if ref in by_id]
        for post in copies:
            group = post.group
            window = {t.id for t in tasks if t.group == group and t.created_at >= start
                      and (end is None or t.created_at < end)}
            others = [f for f in carried if f.group != group]
            best = _best([f for f in findings if f.task_id in window], task_scores)
            if best is None or not others:
                continue
            other_ids = {f.id for f in others}
            cited = any((c.kind is CitationKind.FINDING and c.ref in other_ids)
                        or (c.kind is CitationKind.POST and c.ref == str(post.seq)) for c in best.citations)
            scores = [s for f in others if (s := _score(f, task_scores)) is not None]
            carried_best = max(scores, default=None)
            score = _score(best, task_scores)
            improved = score is not None and carried_best is not None and score > carried_best
            out.append(Followup(n + 1, group, best.id, score, carried_best, cited, improved))
    return CrossGroup(len(broadcasts), tuple(out))
