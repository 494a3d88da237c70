"""Policies as pure logic: groups per worker and task, direction switching, adoption and consolidation."""

from __future__ import annotations

from swarmyard.config import PolicyConfig, PolicyKind
from swarmyard.domain import Direction, Finding, FindingStatus
from swarmyard.rules.policies import (
    DirectionTracker,
    best_findings,
    consolidation_text,
    direction_to_adopt,
    explore_move,
    explore_order,
    make_policy,
)


def _d(name: str, holder: str | None = None, *, taken: bool = False, attempts: int = 0) -> Direction:
    return Direction("goal", "explore", name, True, holder, None if holder is None else "task", None, None,
                     taken=taken or holder is not None, attempts=attempts)


def test_independent_gives_each_worker_its_own_group() -> None:
    policy = make_policy(PolicyConfig(kind=PolicyKind.INDEPENDENT))
    assert [policy.worker_group(i) for i in range(3)] == ["w0", "w1", "w2"]
    assert [policy.task_groups(i, 3) for i in range(4)] == [["w0"], ["w1"], ["w2"], ["w0"]]
    assert policy.rounds == 1


def test_team_and_explore_share_one_board() -> None:
    for kind in (PolicyKind.TEAM, PolicyKind.EXPLORE):
        policy = make_policy(PolicyConfig(kind=kind))
        assert len({policy.worker_group(i) for i in range(5)}) == 1
        assert policy.task_groups(3, 5) == [policy.worker_group(0)]


def test_groups_copy_every_task_into_every_manned_group() -> None:
    policy = make_policy(PolicyConfig(kind=PolicyKind.GROUPS, groups=3, rounds=2))
    assert [policy.worker_group(i) for i in range(4)] == ["g0", "g1", "g2", "g0"]
    assert policy.task_groups(0, 3) == ["g0", "g1", "g2"]
    assert policy.task_groups(0, 2) == ["g0", "g1"]  # a group with no worker gets no task
    # a group with more workers than tasks gets a copy per worker, the tasks dealt in order: g0 has 2 of 4 workers
    assert policy.task_groups(0, 4) == ["g0", "g0", "g1", "g2"]
    assert [policy.task_groups(i, 4, 2) for i in range(2)] == [["g0", "g1", "g2"]] * 2
    wide = make_policy(PolicyConfig(kind=PolicyKind.GROUPS, groups=2))
    # five workers a group, three tasks: the first two tasks twice each, the third once
    assert [wide.task_groups(i, 10, 3) for i in range(3)] == [["g0", "g0", "g1", "g1"]] * 2 + [["g0", "g1"]]
    assert policy.rounds == 2


def test_switch_after_k_attempts_without_improvement() -> None:
    tracker = DirectionTracker("pruning", patience=3)
    for score in (10, 12, 12, 11):
        tracker.record(score)
    assert not tracker.should_switch  # 12 was an improvement; two stale since
    tracker.record(None)
    assert tracker.should_switch
    directions = [_d("pruning", "me"), _d("distillation", "peer"), _d("quantisation")]
    move = explore_move("pruning", [10, 12, 12, 11, None], directions, "me", [], {}, 3, 10)
    assert (move.direction, move.reason, move.best, move.stale) == ("quantisation", "switch", 12, 3)
    tracker.switch("quantisation")
    assert (tracker.best, tracker.stale, tracker.should_switch) == (None, 0, False)


def test_stays_when_everything_is_held() -> None:
    move = explore_move("a", [None], [_d("a", "me"), _d("b", "peer")], "me", [], {"b": 99}, 1, 5)
    assert (move.direction, move.reason) == ("a", "stay")  # b is better, but a live peer holds it


def test_untried_means_untried_by_anyone_in_the_run_then_least_tried() -> None:
    # b was abandoned by a peer (taken, 3 attempts); d was never taken by anyone: d comes first, though this
    # worker tried neither
    directions = [_d("a", "me", attempts=1), _d("b", taken=True, attempts=3), _d("c", "peer"), _d("d")]
    move = explore_move("a", [5, 5], directions, "me", [], {"b": 5}, 1, 10)
    assert (move.direction, move.reason, move.fallbacks) == ("d", "switch", ("b",))
    # all taken: the least tried by anyone, before the order the swarm file gives
    tried = [_d("x", taken=True, attempts=4), _d("y", taken=True, attempts=2), _d("z", taken=True, attempts=2)]
    assert explore_order(tried, "me", []) == ["y", "z", "x"]
    # on a tie, what this worker has not tried itself comes first
    assert explore_order(tried, "me", ["y"]) == ["z", "y", "x"]
    assert explore_order([_d("a", "peer")], "me", []) == []


def test_adopt_only_when_clearly_better() -> None:
    assert direction_to_adopt(50, {"x": 55}, margin=10) is None
    assert direction_to_adopt(50, {"x": 60, "y": 70}, margin=10) == "y"
    assert direction_to_adopt(None, {"x": 1}, margin=10) == "x"
    assert direction_to_adopt(50, {}, margin=0) is None
    free = [_d("mine", "me"), _d("theirs", taken=True), _d("close", taken=True)]
    assert explore_move("mine", [40], free, "me", [], {"theirs": 80}, 3, 10).reason == "adopt"
    assert explore_move("mine", [40], free, "me", [], {"close": 45}, 3, 10).reason == "stay"
    # while a direction nobody has taken is left, a peer's abandoned one is not adopted, however good
    assert explore_move("mine", [40], [*free, _d("new")], "me", [], {"theirs": 80}, 3, 10).reason == "stay"
    assert explore_move("mine", [40, 40, 40, 40], [*free, _d("new")], "me", [], {"theirs": 80}, 3, 10).direction == "new"
    # untried free directions are asked for first; a peer's live hold is never asked for
    assert explore_order([_d("a", "peer"), _d("b", taken=True, attempts=1), _d("c")], "me", tried=["b"]) == ["c", "b"]


def _finding(fid: str, group: str, score: int | None, at: float) -> Finding:
    return Finding(
        fid, "goal", "task", group, "w", f"title {fid}", f"body {fid}", (), FindingStatus.SUBMITTED, score, at
    )


def test_best_findings_per_group_and_broadcast_text() -> None:
    findings = [
        _finding("f1", "g0", 5, 1),
        _finding("f2", "g0", 9, 2),
        _finding("f3", "g1", None, 3),
        _finding("f4", "g1", None, 4),
        _finding("f5", "g0", None, 5),
    ]
    best = best_findings(findings, top=1)
    assert {g: [f.id for f in items] for g, items in best.items()} == {"g0": ["f2"], "g1": ["f4"]}
    text = consolidation_text(0, best)
    assert "round 1" in text and "[f2] group g0 (score 9)" in text and "[f4] group g1" in text


def test_the_lead_prompt_shares_its_room_between_findings_and_ends_with_the_instructions() -> None:
    from dataclasses import replace

    from swarmyard.domain import Envelope, Goal
    from swarmyard.swarm.setup import lead_prompt

    goal = Goal("g", "bet or not?", 1, 1, None, 1, "team", None, 0.0, Envelope(1, 0, 0, 0, 0))
    long = replace(_finding("f1", "g0", None, 1), body="x" * 10_000)
    prompt = lead_prompt(goal, "Say go or no-go.", [long, _finding("f2", "g0", None, 2)])
    assert prompt.startswith("Objective: bet or not?")
    assert "[f1] title f1" in prompt and "[f2] title f2" in prompt and "body f2" in prompt
    assert "x" * 2400 in prompt and "x" * 2401 not in prompt  # 4,800 characters for two findings
    assert prompt.index("Say go or no-go.") > prompt.index("body f2")
    assert prompt.rstrip().endswith("in brackets.")
