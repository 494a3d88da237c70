"""Eight processes claim from one SQLite file, and from PostgreSQL, at once: every task exactly once."""

from __future__ import annotations

import pytest

from swarmyard.bench.store import duplicates, measure


@pytest.mark.slow
@pytest.mark.parametrize("raw", [False], ids=["store"])
def test_eight_processes_never_claim_a_task_twice(store_url: str, raw: bool) -> None:
    run = measure(store_url, processes=8, tasks=240, raw=raw, posts_per_claim=1)
    assert duplicates(run.claims) == 0
    assert len(run.claims) == 240
    tokens = [token for _, token in run.claims]
    assert len(set(tokens)) == len(tokens), "fencing tokens are store-wide and never reused"
    assert run.posts == 240
