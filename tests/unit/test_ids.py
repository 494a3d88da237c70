"""Ids sort in the order one process made them, also within one millisecond."""

from __future__ import annotations

import threading

from swarmyard.ids import new_id


def test_ids_made_in_one_millisecond_sort_in_the_order_they_were_made() -> None:
    ids = [new_id("rsv") for _ in range(5_000)]  # thousands of ids share each millisecond
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ids_made_by_many_threads_are_distinct() -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_id("task") for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every)
    assert all(out == sorted(out) for out in made)
