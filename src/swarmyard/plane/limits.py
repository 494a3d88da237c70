"""Request limits: the body size cap and a per-worker token bucket that answers 429 with ``Retry-After``
(the JSON nesting cap is ``swarmyard.jsondepth``, shared with the broker).

The bucket is in memory for a store with one writer (SQLite: one host, where a write per call would queue on
its lock) and in the store for PostgreSQL, where several replicas serve the same workers."""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager

from swarmyard.clock import Clock
from swarmyard.errors import PayloadTooLargeError, RateLimitedError
from swarmyard.store.protocol import ReplicasStore


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """Read a request body, refusing (413) one that declares or turns out to be over ``limit`` bytes.

    The declared ``Content-Length`` is checked first so an oversized upload is refused before it is read;
    the running count covers chunked bodies that declare nothing.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError("request body", int(declared), limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError("request body", size, limit)
        parts.append(chunk)
    return b"".join(parts)


class RateLimiter:
    """A token bucket per key (a worker id): ``rate_per_s`` sustained, ``burst`` at once.

    Time comes from the injected clock, so tests refill the bucket by advancing a ``FakeClock``.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Clock, *, max_keys: int = 100_000) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be positive and burst at least 1")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, updated_at)
        self._lock = threading.Lock()

    def acquire(self, key: str) -> None:
        """Take one token for ``key`` or raise ``RateLimitedError`` saying how long until one is free."""
        now = self._clock.now()
        with self._lock:
            tokens, updated = self._buckets.get(key, (self._burst, now))
            tokens = min(self._burst, tokens + max(0.0, now - updated) * self._rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                wait_s = (1.0 - tokens) / self._rate
                raise RateLimitedError(f"{key} is over {self._rate:g} calls/s",
                                       retry_after_s=round(wait_s, 3))
            if len(self._buckets) >= self._max_keys and key not in self._buckets:
                # Forget the fullest half: those buckets would be full again by now anyway.
                for stale in sorted(self._buckets, key=lambda k: -self._buckets[k][0])[: self._max_keys // 2]:
                    del self._buckets[stale]
            self._buckets[key] = (tokens - 1.0, now)


class SharedRateLimiter:
    """The same token bucket per key, kept in the store (``Store.take_rate_token``), so every control-plane
    replica over one PostgreSQL store takes from one bucket: a worker spreading its calls over N replicas
    gets ``rate_per_s``, not N times it. Time is the store's clock.

    Inside ``calls()`` (one tool call on this thread) the take is folded into the call's own first write
    transaction (``Store.rate_token_folded``): one write per tool call, not two. A call that does its work
    before its token is known to be free is refused at once, with no store trip, by an in-memory bucket of the
    same rate in front: a worker within its rate at this replica never meets it (it refuses only a worker
    over its rate here alone, whom the shared bucket refuses too), and a worker over it gets no work done.
    """

    def __init__(self, store: ReplicasStore, rate_per_s: float, burst: int, clock: Clock) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be positive and burst at least 1")
        self._store = store
        self._rate = rate_per_s
        self._burst = burst
        self._here = RateLimiter(rate_per_s, burst, clock)
        self._call = threading.local()

    def acquire(self, key: str) -> None:
        """Take one token for ``key`` or raise ``RateLimitedError`` saying how long until one is free; inside
        ``calls()``, the take waits for the call's first write (or its end)."""
        stack: ExitStack | None = getattr(self._call, "stack", None)
        if stack is not None:
            self._here.acquire(key)
            stack.enter_context(self._store.rate_token_folded(key, self._rate, self._burst))
            self._call.stack = None  # one take per call
            return
        wait_s = self._store.take_rate_token(key, self._rate, self._burst)
        if wait_s > 0:
            raise RateLimitedError(f"{key} is over {self._rate:g} calls/s", retry_after_s=round(wait_s, 3))

    @contextmanager
    def calls(self) -> Iterator[None]:
        """One tool call on this thread: its ``acquire`` is folded into its first write transaction."""
        with ExitStack() as stack:
            self._call.stack = stack
            try:
                yield
            finally:
                self._call.stack = None


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` is whole seconds; round up so a client that obeys it is never early."""
    return str(max(1, math.ceil(seconds)))
