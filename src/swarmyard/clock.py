"""Time as an injected dependency, so lease and deadline tests never sleep."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds since the Unix epoch."""

    def now(self) -> float:
        """The current time in seconds."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """The current time in seconds."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to; safe to share between threads."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The current fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` and return the new time."""
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when`` (never backwards)."""
        with self._lock:
            if when < self._now:
                raise ValueError("a clock never goes backwards")
            self._now = when
