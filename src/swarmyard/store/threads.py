"""Store calls off the event loop, handed to a few dedicated threads in batches.

Why not ``loop.run_in_executor``: at thousands of tool calls a second the hop itself was the largest single
cost of a call after the store (profiled with ``swarmyard bench plane``: about 0.2 ms of CPU per call for a
concurrent future, its wrapping asyncio future, a condition-variable wake-up of an executor thread and one
self-pipe write back to the loop per call). Here a call is appended to a queue and a thread is woken only
when one is idle; a thread takes a share of whatever is queued, runs it, and hands all its results back to
the loop with one ``call_soon_threadsafe``. Under load most calls ride along with others, so the wake-ups
and self-pipe writes are paid per batch, not per call. Every call still runs on a store thread, never on the
event loop (a SQLite write may wait for another process's write lock; a PostgreSQL statement is a round
trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from swarmyard.errors import StoreBusyError

if TYPE_CHECKING:
    from swarmyard.store.protocol import LifecycleStore

T = TypeVar("T")
_Job = tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]
_Done = tuple[asyncio.Future[Any], bool, Any]

#: The most calls one thread takes at once, and the longest a finished call's answer waits for its batch-mates.
_MAX_BATCH = 32
_MAX_HOLD_S = 0.002


class StoreThreads:
    """``await threads.run(fn)`` runs the blocking ``fn`` on one of ``count`` store threads."""

    def __init__(self, count: int, *, name: str = "swarmyard-store", idle_exit_s: float = 30.0) -> None:
        if count < 1:
            raise ValueError("at least one store thread is needed")
        self._count = count
        self._name = name
        self._idle_exit_s = idle_exit_s
        self._queue: deque[_Job] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._idle = 0
        self._live = 0
        self._closed = False
        self._threads: set[threading.Thread] = set()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a store thread and return (or raise) what it does."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the store threads are shut down")
            self._queue.append((fn, future, loop))
            if self._idle:
                self._ready.notify()
            elif self._live < self._count:
                # Threads start on demand and leave after a quiet spell: an app that is built and dropped
                # (tests, a finished `swarmyard run`) leaves no thread behind for long.
                self._live += 1
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.add(thread)
                thread.start()
        return await future

    def _take(self) -> list[_Job] | None:
        with self._ready:
            while not self._queue:
                if self._closed:
                    self._leave()
                    return None
                self._idle += 1
                woken = self._ready.wait(self._idle_exit_s)
                self._idle -= 1
                if not woken and not self._queue:
                    self._leave()
                    return None
            # A fair share, so that with several threads (PostgreSQL round trips) the calls run side by side.
            share = min(_MAX_BATCH, max(1, -(-len(self._queue) // self._count)))
            batch = [self._queue.popleft() for _ in range(min(share, len(self._queue)))]
            if self._queue and self._idle:
                self._ready.notify()
            return batch

    def _leave(self) -> None:
        # Called with the lock held.
        self._live -= 1
        self._threads.discard(threading.current_thread())

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            done: dict[asyncio.AbstractEventLoop, list[_Done]] = {}
            flushed = time.perf_counter()
            for fn, future, loop in batch:
                try:
                    result: _Done = (future, True, fn())
                except BaseException as exc:  # handed to the awaiting coroutine, which re-raises it
                    result = (future, False, exc)
                done.setdefault(loop, []).append(result)
                if time.perf_counter() - flushed > _MAX_HOLD_S:
                    # A slow call (a large blob, a slow round trip) must not hold its batch-mates' answers.
                    _hand_back(done)
                    done, flushed = {}, time.perf_counter()
            _hand_back(done)

    def shutdown(self) -> None:
        """Let the threads finish what is queued and exit (calls made afterwards are refused)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        with self._ready:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=30)


def _hand_back(done: dict[asyncio.AbstractEventLoop, list[_Done]]) -> None:
    for loop, results in done.items():
        # A closed loop raises RuntimeError: nobody is waiting for these results any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, results)


def _deliver(results: list[_Done]) -> None:
    for future, ok, value in results:
        if future.cancelled():
            continue  # the caller gave up (shutdown, disconnect); the call itself has run
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def without_waiting(store: LifecycleStore, call: Callable[[], T]) -> tuple[bool, T | None]:
    """``call()`` right here, on the calling thread, if ``store`` can take it without waiting: (True, its
    result); else (False, None), having done nothing, and the caller hands it to the store threads instead.
    Its other errors are raised.

    Why: on the event loop a call that would wait blocks every request, but one that cannot (SQLite with its
    write lock free) is cheaper here than the two thread hand-offs.
    """
    with store.nowait() as nowait:
        if nowait:
            try:
                return True, call()
            except StoreBusyError:
                pass
    return False, None
