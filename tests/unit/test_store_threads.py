"""The plane's store threads: calls run off the event loop, results and typed errors come back to the caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from swarmyard.errors import StaleFencingTokenError
from swarmyard.store.threads import StoreThreads


def test_calls_run_on_store_threads_and_return_their_results() -> None:
    threads = StoreThreads(2)

    async def main() -> list[tuple[int, str]]:
        loop_thread = threading.current_thread().name
        got = await asyncio.gather(*(threads.run(lambda i=i: (i * i, threading.current_thread().name))
                                     for i in range(500)))
        assert all(name != loop_thread and name.startswith("swarmyard-store") for _, name in got)
        return got

    try:
        got = asyncio.run(main())
    finally:
        threads.shutdown()
    assert [v for v, _ in got] == [i * i for i in range(500)]


def test_a_typed_error_reaches_the_awaiting_caller_and_other_calls_go_on() -> None:
    threads = StoreThreads(1)

    def stale() -> int:
        raise StaleFencingTokenError("tsk_1", 1, 2)

    async def main() -> tuple[list[object], int]:
        results = await asyncio.gather(threads.run(stale), threads.run(lambda: 7), return_exceptions=True)
        return results, await threads.run(lambda: 8)

    try:
        (first, second), third = asyncio.run(main())
    finally:
        threads.shutdown()
    assert isinstance(first, StaleFencingTokenError) and first.status == 409
    assert second == 7 and third == 8


def test_two_event_loops_share_the_threads_and_each_gets_its_own_results() -> None:
    threads = StoreThreads(2)
    out: dict[str, list[int]] = {}

    def loop_in_thread(name: str, base: int) -> None:
        async def main() -> list[int]:
            return list(await asyncio.gather(*(threads.run(lambda i=i: base + i) for i in range(200))))

        out[name] = asyncio.run(main())

    workers = [threading.Thread(target=loop_in_thread, args=(n, b)) for n, b in (("a", 0), ("b", 10_000))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    threads.shutdown()
    assert out["a"] == list(range(200)) and out["b"] == [10_000 + i for i in range(200)]


def test_calls_after_shutdown_are_refused() -> None:
    threads = StoreThreads(1)
    threads.shutdown()
    with pytest.raises(RuntimeError):
        asyncio.run(threads.run(lambda: 1))
