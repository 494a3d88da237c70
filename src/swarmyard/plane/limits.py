"""Request limits: the body size cap, the JSON nesting cap, and a per-worker token bucket that answers 429
with ``Retry-After``."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import AsyncIterator
from itertools import accumulate
from operator import sub

from swarmyard.clock import Clock
from swarmyard.errors import NestingTooDeepError, PayloadTooLargeError, RateLimitedError

#: How deep a JSON request body may nest (objects and arrays). Real requests stay far below it (a tool schema
#: inside a chat request is about 15 levels); a parser without its own limit overflows its C stack on a body
#: of a million ``[`` (orjson before 3.9.15 crashed the whole server).
MAX_JSON_DEPTH = 64

_STRINGS = re.compile(rb'"[^"]*"')  # once escaped backslashes and quotes are gone
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_RUNS = re.compile(rb"\[+|\]+")


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


def check_nesting(raw: bytes, limit: int = MAX_JSON_DEPTH, *, field: str = "body") -> None:
    """Refuse (``NestingTooDeepError``, 400) a JSON text whose arrays and objects nest deeper than ``limit``,
    without parsing it: this runs before any parser sees the bytes.

    Only brackets outside strings count. The work is a few passes in C over the body: strings cut out, every
    byte but brackets dropped, and innermost pairs peeled off while that shrinks the rest by an eighth or more
    (each peel lowers the depth by exactly one); what is left is long runs, whose depth is a running sum.
    A malformed body may be refused here as too deep where a parser would call it malformed: a 400 either way.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = _STRINGS.sub(b"", unescaped).translate(_BRACES_AS_BRACKETS, _NOT_BRACKETS)
    peeled = 0
    while peeled < limit:
        if b"[" * (limit - peeled + 1) in marks:
            raise NestingTooDeepError(limit, field=field)
        shorter = marks.replace(b"[]", b"")
        if not shorter:
            return
        shrunk = len(marks) - len(shorter)
        marks, peeled = shorter, peeled + 1
        if shrunk * 8 < len(marks):
            break
    # Runs alternate (an opening run, a closing run, ...): the depth peaks at the end of each opening run.
    runs = list(map(len, _RUNS.findall(marks.lstrip(b"]"))))
    opened = accumulate(runs[0::2])
    closed = accumulate(runs[1::2], initial=0)
    if max(map(sub, opened, closed), default=0) + peeled > limit:
        raise NestingTooDeepError(limit, field=field)


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


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` is whole seconds; round up so a client that obeys it is never early."""
    return str(max(1, math.ceil(seconds)))
