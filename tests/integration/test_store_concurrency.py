"""Processes claim from one SQLite file, and from PostgreSQL, at once: every task exactly once, every hold charged
once."""

from __future__ import annotations

import pytest

from swarmyard.bench.store import duplicates, measure, measure_holds, measure_takes


@pytest.mark.slow
@pytest.mark.parametrize("raw", [False], ids=["store"])
def test_eight_processes_never_claim_a_task_twice(store_url: str, raw: bool) -> None:
    run = measure(store_url, processes=8, tasks=240, raw=raw, posts_per_claim=1)
    assert duplicates(run.claims) == 0
    assert len(run.claims) == 240
    tokens = [token for _, token in run.claims]
    assert len(set(tokens)) == len(tokens), "fencing tokens are store-wide and never reused"
    assert run.posts == 240


@pytest.mark.slow
def test_concurrent_holds_on_one_goal_charge_its_envelope_exactly(store_url: str) -> None:
    """Six processes reserve and settle on one goal at once: the goal's envelope moves by every settle, once."""
    wall, trips, settled = measure_holds(store_url, processes=6, calls=15)
    assert trips == 90
    assert settled == 90 * 7  # each hold of 10 settled at 7: no lost update, no double charge
    assert wall > 0


@pytest.mark.slow
def test_concurrent_takes_from_one_shared_rate_bucket_are_all_counted(store_url: str) -> None:
    """Four processes take from one key's bucket at once: with room for all, every take is granted once."""
    wall, taken = measure_takes(store_url, processes=4, takes=20, shared=True)
    assert taken == 80 and wall > 0
