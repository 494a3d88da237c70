"""The cross-group figure of a ``groups`` run, from its tasks, findings, board and scores: which round follows a
broadcast, which attempt is a group's best, and when it built on or beat another group's broadcast."""

from __future__ import annotations

from swarmyard.domain import (
    Citation,
    CitationKind,
    Envelope,
    Finding,
    FindingStatus,
    Post,
    PostKind,
    Task,
    TaskState,
)
from swarmyard.report.consolidation import cross_group


def _task(tid: str, group: str, at: float) -> Task:
    return Task(tid, "goal", None, 0, group, tid, "", TaskState.DONE, 1, None, None, None, 1, None, at,
                Envelope(0, 0, 0, 1, 0))


def _finding(fid: str, task: str, group: str, score: int | None, at: float, *cites: Citation) -> Finding:
    return Finding(fid, "goal", task, group, "w", fid, "body", cites, FindingStatus.SUBMITTED, score, at)


def _broadcast(seq: int, group: str, at: float, *carried: str) -> Post:
    body = "Consolidation after round 1.\n" + "\n".join(f"- [{f}] group x: title" for f in carried)
    return Post("goal", seq, PostKind.CONSOLIDATION, group, "coordinator", None, None, body, at)


def test_a_groups_best_attempt_after_a_broadcast_is_counted_when_it_cites_it_or_beats_it() -> None:
    tasks = [_task("t0", "g0", 0), _task("t1", "g1", 0),  # round 1
             _task("t2", "g0", 10), _task("t3", "g0", 10), _task("t4", "g1", 10)]  # round 2
    findings = [
        _finding("fnd_a", "t0", "g0", 5, 1), _finding("fnd_b", "t1", "g1", 7, 2),
        # g0's best of round 2 scores 9 (> g1's 7) and cites g1's broadcast finding; its other attempt cites too,
        # but is not its best
        _finding("fnd_c", "t2", "g0", 9, 11, Citation(CitationKind.FINDING, "fnd_b")),
        _finding("fnd_d", "t3", "g0", 3, 12, Citation(CitationKind.POST, "1")),
        # g1's best has no score of its own: its task's best (4) counts, below g0's broadcast 5; it cites the
        # broadcast post on its own board
        _finding("fnd_e", "t4", "g1", None, 13, Citation(CitationKind.POST, "2")),
    ]
    posts = [_broadcast(1, "g0", 9, "fnd_a", "fnd_b"), _broadcast(2, "g1", 9, "fnd_a", "fnd_b")]
    cross = cross_group(tasks, findings, posts, {"t4": 4})
    assert cross.broadcasts == 1
    assert [(f.group, f.finding, f.score, f.carried_best, f.built_on, f.improved_on) for f in cross.followups] == [
        ("g0", "fnd_c", 9, 7, True, True), ("g1", "fnd_e", 4, 5, True, False)]
    assert (cross.built_on, cross.improved_on) == (2, 1)


def test_citing_ones_own_group_or_another_groups_copy_of_the_broadcast_is_not_building_on_it() -> None:
    tasks = [_task("t0", "g0", 0), _task("t1", "g1", 0), _task("t2", "g0", 10)]
    findings = [_finding("fnd_a", "t0", "g0", 5, 1), _finding("fnd_b", "t1", "g1", 7, 2),
                _finding("fnd_c", "t2", "g0", 6, 11, Citation(CitationKind.FINDING, "fnd_a"),
                         Citation(CitationKind.POST, "2"))]
    posts = [_broadcast(1, "g0", 9, "fnd_a", "fnd_b"), _broadcast(2, "g1", 9, "fnd_a", "fnd_b")]
    (followup,) = cross_group(tasks, findings, posts, {}).followups
    assert (followup.group, followup.built_on, followup.improved_on) == ("g0", False, False)


def test_no_broadcast_no_figure_and_a_broadcast_of_ones_own_findings_only_is_no_chance() -> None:
    tasks = [_task("t0", "g0", 0), _task("t1", "g0", 10)]
    findings = [_finding("fnd_a", "t0", "g0", 5, 1), _finding("fnd_b", "t1", "g0", 9, 11)]
    assert cross_group(tasks, findings, [], {}).broadcasts == 0
    cross = cross_group(tasks, findings, [_broadcast(1, "g0", 9, "fnd_a")], {})
    assert (cross.broadcasts, cross.followups) == (1, ())


def test_each_broadcast_is_followed_by_its_own_round_only() -> None:
    tasks = [_task("t0", "g0", 0), _task("t1", "g1", 0), _task("t2", "g0", 10), _task("t3", "g1", 10),
             _task("t4", "g0", 20)]
    findings = [_finding("fnd_a", "t0", "g0", 1, 1), _finding("fnd_b", "t1", "g1", 2, 2),
                _finding("fnd_c", "t2", "g0", 3, 11), _finding("fnd_d", "t3", "g1", 4, 12),
                _finding("fnd_e", "t4", "g0", 8, 21)]
    first = [_broadcast(1, "g0", 9, "fnd_a", "fnd_b"), _broadcast(2, "g1", 9, "fnd_a", "fnd_b")]
    second = [_broadcast(3, "g0", 19, "fnd_c", "fnd_d"), _broadcast(4, "g1", 19, "fnd_c", "fnd_d")]
    cross = cross_group(tasks, findings, first + second, {})
    # g0's round-3 attempt (8) is not counted against the first broadcast; g1 did not work round 3
    assert [(f.broadcast, f.group, f.finding, f.improved_on) for f in cross.followups] == [
        (1, "g0", "fnd_c", True), (1, "g1", "fnd_d", True), (2, "g0", "fnd_e", True)]
