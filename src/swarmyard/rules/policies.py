"""Exploration policies as pure logic: who shares a board with whom, how many rounds, what to broadcast.

- ``independent`` (best@n): each worker its own group; nobody reads anybody.
- ``team`` (team@n): one group, shared board and findings.
- ``explore``: one group of slots; each holds at most one direction, claimed in the store (never two holders);
  after ``patience`` scored attempts in a row without improvement a worker moves to a free direction (one nobody
  in the run has tried first, then the least tried: ``explore_order``), and it adopts a free direction only when
  peers scored it clearly better (``explore_move``; the plane applies it).
- ``groups``: several groups, each with its own formulation, explore apart for up to ``rounds`` rounds, every
  worker of a group with a task of its own each round; after each round the best findings of every group by
  score are broadcast to all groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from swarmyard.config import PolicyConfig, PolicyKind
from swarmyard.domain import Direction, Finding


class Policy(Protocol):
    """How a policy partitions workers and tasks."""

    @property
    def kind(self) -> PolicyKind:
        """Which policy this is."""
        ...

    @property
    def rounds(self) -> int:
        """How many rounds of tasks the run has."""
        ...

    def worker_group(self, worker_index: int) -> str:
        """The group (board) of the ``worker_index``-th worker."""
        ...

    def task_groups(self, task_index: int, worker_count: int, task_count: int = 1) -> list[str]:
        """The groups that get a copy of the ``task_index``-th of ``task_count`` tasks: one copy per time a group
        is listed."""
        ...


@dataclass(frozen=True, slots=True)
class Independent:
    """Each worker alone; task ``i`` goes to worker ``i mod n``'s group."""

    kind: PolicyKind = PolicyKind.INDEPENDENT
    rounds: int = 1

    def worker_group(self, worker_index: int) -> str:
        """``w0``, ``w1``, ...: one group per worker."""
        return f"w{worker_index}"

    def task_groups(self, task_index: int, worker_count: int, task_count: int = 1) -> list[str]:
        """The one worker group the task belongs to."""
        return [self.worker_group(task_index % worker_count)]


@dataclass(frozen=True, slots=True)
class Team:
    """Everyone on one board."""

    kind: PolicyKind = PolicyKind.TEAM
    rounds: int = 1
    group: str = "team"

    def worker_group(self, worker_index: int) -> str:
        """The one group."""
        return self.group

    def task_groups(self, task_index: int, worker_count: int, task_count: int = 1) -> list[str]:
        """The one group."""
        return [self.group]


@dataclass(frozen=True, slots=True)
class Explore:
    """One board of slots; every task is a slot whose direction workers post and read."""

    kind: PolicyKind = PolicyKind.EXPLORE
    rounds: int = 1
    group: str = "explore"

    def worker_group(self, worker_index: int) -> str:
        """The one group: directions must be visible to every slot."""
        return self.group

    def task_groups(self, task_index: int, worker_count: int, task_count: int = 1) -> list[str]:
        """The one group."""
        return [self.group]


@dataclass(frozen=True, slots=True)
class Groups:
    """``count`` groups apart, ``rounds`` rounds, every task copied into every group, each group's copy with the
    group's own formulation (``prompts[i]`` for ``g{i}``, when the swarm file gives one).

    A group with more workers than there are tasks gets more copies, so every worker of it has a task of its own
    each round: its round holds as many tasks as it has workers, the tasks dealt in order (one task and two
    workers: two attempts at it, each under its own claim)."""

    count: int = 2
    rounds: int = 2
    kind: PolicyKind = PolicyKind.GROUPS
    prompts: tuple[str, ...] = ()

    def group_prompt(self, group: str) -> str:
        """The formulation of ``group`` (``g0``, ``g1``, ...), ``""`` when it has none."""
        index = int(group[1:]) if group[:1] == "g" and group[1:].isdigit() else -1
        return self.prompts[index] if 0 <= index < len(self.prompts) else ""

    def worker_group(self, worker_index: int) -> str:
        """``g0``, ``g1``, ...: workers dealt round-robin."""
        return f"g{worker_index % self.count}"

    def workers_in(self, group_index: int, worker_count: int) -> int:
        """How many of ``worker_count`` workers group ``g{group_index}`` gets (dealt round-robin)."""
        return len(range(group_index, worker_count, self.count))

    def task_groups(self, task_index: int, worker_count: int, task_count: int = 1) -> list[str]:
        """Every group that has at least one worker works every task, once, or more often where the group has
        more workers than there are tasks: the group's ``max(task_count, workers)`` places are dealt to the tasks
        in order, so task ``i`` gets places ``i``, ``i + task_count``, ..."""
        out: list[str] = []
        for g in range(min(self.count, worker_count)):
            places = max(task_count, self.workers_in(g, worker_count))
            out += [f"g{g}"] * len(range(task_index, places, max(1, task_count)))
        return out


def group_prompt(policy: Policy, group: str) -> str:
    """The formulation a policy gives ``group``'s copy of every task (only ``groups`` gives any)."""
    return policy.group_prompt(group) if isinstance(policy, Groups) else ""


def make_policy(config: PolicyConfig) -> Policy:
    """The policy a swarm file names."""
    match config.kind:
        case PolicyKind.INDEPENDENT:
            return Independent()
        case PolicyKind.TEAM:
            return Team()
        case PolicyKind.EXPLORE:
            return Explore()
        case PolicyKind.GROUPS:
            prompts = config.group_prompts
            return Groups(count=len(prompts), rounds=config.rounds, prompts=prompts)


# -- explore: directions ----------------------------------------------------------------------


@dataclass(slots=True)
class DirectionTracker:
    """One slot's attempts at its current direction, to decide when to switch."""

    direction: str
    patience: int = 3
    best: int | None = None
    stale: int = 0
    history: list[int | None] = field(default_factory=list)

    def record(self, score: int | None) -> None:
        """Count one attempt; only a strictly better score resets the count."""
        self.history.append(score)
        if score is not None and (self.best is None or score > self.best):
            self.best = score
            self.stale = 0
        else:
            self.stale += 1

    @property
    def should_switch(self) -> bool:
        """``patience`` attempts in a row without improvement."""
        return self.stale >= self.patience

    def switch(self, direction: str) -> None:
        """Start over on a new direction."""
        self.direction, self.best, self.stale = direction, None, 0


def direction_to_adopt(own_best: int | None, peer_best: Mapping[str, int], margin: int) -> str | None:
    """A peer direction whose best score beats ours by at least ``margin`` (the best such), else ``None``."""
    if not peer_best:
        return None
    direction, score = max(peer_best.items(), key=lambda item: (item[1], item[0]))
    baseline = own_best if own_best is not None else -(2**62)
    return direction if score >= baseline + margin and (own_best is None or score > own_best) else None


@dataclass(frozen=True, slots=True)
class Move:
    """Where an ``explore`` worker goes after an attempt: stay, switch to a free direction, or adopt a better one."""

    direction: str
    previous: str
    reason: Literal["stay", "switch", "adopt"]
    #: the worker's best score and its attempts in a row without a better one, on ``previous``
    best: int | None
    stale: int
    patience: int
    #: on a switch, the free directions to take instead, in order, should a peer take ``direction`` first
    fallbacks: tuple[str, ...] = ()


def explore_move(current: str, attempts: Sequence[int | None], directions: Sequence[Direction], me: str,
                 tried: Sequence[str], peer_best: Mapping[str, int], patience: int, margin: int) -> Move:
    """The next direction of worker ``me`` holding ``current``, from its ``attempts`` on it (oldest first), the
    group's ``directions`` and the best score peers reached on each (``peer_best``): once every direction has been
    taken by someone, a free direction whose peers' best beats the worker's own by ``margin`` is adopted; after ``patience`` attempts in a row without a better
    score the worker switches to the free direction ``explore_order`` puts first (one nobody in the run has tried,
    else the least tried); otherwise it stays. A direction another live claim holds is never chosen, and a worker
    never adopts its own abandoned score."""
    tracker = DirectionTracker(current, patience=patience)
    for score in attempts:
        tracker.record(score)
    best, stale = tracker.best, tracker.stale
    free_best = {d.name: peer_best[d.name] for d in directions
                 if d.holder is None and d.name in peer_best and d.name != current}
    # untried first across the run: while some direction was never taken by anyone, nobody adopts one a peer left
    never_taken = any(not d.taken and d.holder is None and d.name != current for d in directions)
    adopt = None if never_taken else direction_to_adopt(best, free_best, margin)
    if adopt is not None:
        return Move(adopt, current, "adopt", best, stale, patience)
    if tracker.should_switch:
        order = [d for d in explore_order(directions, me, [*tried, current]) if d != current]
        if order:
            return Move(order[0], current, "switch", best, stale, patience, tuple(order[1:]))
    return Move(current, current, "stay", best, stale, patience)


def explore_order(directions: Sequence[Direction], me: str, tried: Sequence[str]) -> list[str]:
    """The free directions a worker asks for, best first: those no claim of the run has taken yet, then the least
    tried (fewest scored attempts by anyone), then those this worker has not ``tried`` itself, then the group's
    order. Untried is counted across the whole run, not per worker: a worker that would prefer what it alone has
    not tried moves onto directions peers abandoned while others were never tried at all."""
    mine = set(tried)
    free = [(i, d) for i, d in enumerate(directions) if d.holder is None or d.holder == me]
    ranked = sorted(free, key=lambda item: (item[1].taken, item[1].attempts, item[1].name in mine, item[0]))
    return [d.name for _, d in ranked]


# -- groups: consolidation ----------------------------------------------------------------------


def best_findings(findings: Sequence[Finding], top: int) -> dict[str, list[Finding]]:
    """Per group, its ``top`` best findings: highest score first, unscored last, newest first on ties."""
    by_group: dict[str, list[Finding]] = {}
    for finding in findings:
        by_group.setdefault(finding.group, []).append(finding)

    def rank(f: Finding) -> tuple[int, int, float]:
        return (1 if f.score is not None else 0, f.score or 0, f.created_at)

    return {group: sorted(items, key=rank, reverse=True)[:top] for group, items in sorted(by_group.items())}


def consolidation_text(round_index: int, best: Mapping[str, Sequence[Finding]]) -> str:
    """The broadcast post that carries every group's best findings into the next round."""
    lines = [f"Consolidation after round {round_index + 1}: the best findings of every group."]
    for group, items in best.items():
        for f in items:
            score = "" if f.score is None else f" (score {f.score})"
            lines.append(f"- [{f.id}] group {group}{score}: {f.title}: {f.body[:400]}")
    return "\n".join(lines)
