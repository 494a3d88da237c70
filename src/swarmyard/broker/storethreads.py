"""The broker's store threads: calls a request waits for go first, settlements when none is waiting.

Why not a ``ThreadPoolExecutor``: its queue is FIFO, so a call's admission (on the request's critical path)
queues behind settlements of calls already answered (off it). Here a settlement runs only when no admission
waits, and after the threads went idle it waits ``grace_s`` more for one, so that the next call, which
usually arrives right behind an answer, is admitted first and the settlement runs while that call's
upstream answer is on its way. A settlement never waits longer than ``max_delay_s`` behind admissions:
a held worst case only ever refuses too early, but it should not stay held under a steady load.

On SQLite the broker runs one thread: SQLite admits one writer at a time anyway, and a second writer thread
waits in SQLite's busy handler, which sleeps a millisecond or more; one thread queues them in order instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | None"]


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return  # the request went away; what the call did stands (a hold it made is released or reconciled)
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class StoreThreads:
    """``await threads.call(fn, *args)`` for the critical path; ``threads.later(fn, *args)`` for the rest.

    Jobs wait in two deques; a ``SimpleQueue`` carries one wake-up token per job (its put and get are C
    calls, several times cheaper than a ``threading.Condition`` on this path). A thread that holds tokens
    runs jobs until it has none left, so every queued job has a token somewhere.
    """

    def __init__(self, count: int, *, name: str = "broker-store", grace_s: float = 0.001,
                 max_delay_s: float = 0.05) -> None:
        self._now: deque[_Job] = deque()
        self._later: deque[tuple[float, _Job]] = deque()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._grace_s = grace_s
        self._max_delay_s = max_delay_s
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` on a store thread ahead of any queued settlement; its result or exception."""
        if self._closed:
            raise RuntimeError("the broker's store threads are closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._now.append((fn, args, loop, future))
        self._wake.put(None)
        return await future

    def later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` to run when no ``call`` waits (or ``max_delay_s`` from now at the latest)."""
        if self._closed:
            raise RuntimeError("the broker's store threads are closed")
        self._later.append((time.monotonic() + self._max_delay_s, (fn, args, None, None)))
        self._wake.put(None)

    def _take(self) -> tuple[_Job | None, int]:
        """The job to run next (None if another thread took it) and how many more tokens were taken."""
        later = self._later
        try:
            if later and later[0][0] <= time.monotonic():
                return later.popleft()[1], 0  # overdue: it goes before further admissions
            if self._now:
                return self._now.popleft(), 0
            if not later:
                return None, 0
            if not self._closed:
                # idle with only settlements queued: give a call arriving right behind the answer a moment
                try:
                    self._wake.get(timeout=self._grace_s)
                except queue.Empty:
                    pass
                else:
                    return (self._now.popleft() if self._now else later.popleft()[1]), 1
            return later.popleft()[1], 0
        except IndexError:  # another thread emptied the deque between the check and the pop
            return None, 0

    def _run(self) -> None:
        tokens = 0
        while True:
            if not tokens:
                self._wake.get()
                tokens = 1
            job, more = self._take()
            tokens += more - 1
            if job is None:
                if self._closed and not self._now and not self._later:
                    self._wake.put(None)  # pass a token on, so every thread sees the close
                    return
                continue
            fn, args, loop, future = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting request, which turns it into its answer
                error = exc
            if loop is not None and future is not None:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                    loop.call_soon_threadsafe(_deliver, future, result, error)
            del job, fn, args, result, error

    def close(self) -> None:
        """Run what is queued, then stop the threads (blocks until they are done)."""
        self._closed = True
        for _ in self._threads:
            self._wake.put(None)  # a token with no job: wakes a thread to see that it is closed
        for thread in self._threads:
            thread.join()
