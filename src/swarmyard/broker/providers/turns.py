"""Turn-taking among a provider's callers, so that a run of concurrent workers is reproducible.

Workers that share a board (a team) read each other's attempts: what worker B's next request holds depends on
whether worker A's attempt was posted before B built it, which the scheduler decides. A provider that takes
turns answers its ``seats`` callers one at a time in a fixed order (the order of their first requests' text, not
of their arrival), and passes the turn on only when the caller it answered comes back with its next request:
by then that caller has acted on the answer (submitted, been scored, posted, read the board) and built its next
context, while every other caller was waiting. So every context is built at the same point of the same sequence
of turns, whatever the scheduling.

A caller leaves the rotation when the provider gave it its last answer (``leave``) or the broker refused its call
(a cap or the budget ran out: ``refused``). A caller that neither comes back nor leaves (it crashed) holds the
turn for ``stall_s`` (ten minutes by default: a loaded host can take a minute to boot a machine or score an
attempt, and moving on early is what would make the run differ); then the rotation goes on without it and the
run is no longer reproducible, which is logged. Callers that arrive after the seats are taken (the lead, a retried worker) are not held.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field

import anyio

log = logging.getLogger(__name__)

#: ids in a request's text (``wrk_...``, ``fnd_...``): random, so never part of a caller's key
_IDS = re.compile(r"\b[a-z]{2,8}_[0-9a-hjkmnp-tv-z]{26}\b")
#: how often a waiting caller looks again
_POLL_S = 0.002


def stable_text(text: str) -> str:
    """``text`` with its ids blanked: what a key may be derived from."""
    return _IDS.sub("ID", text)


@dataclass
class Turns:
    """One rotation of ``seats`` callers (see the module)."""

    seats: int
    stall_s: float = 600.0
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    #: caller -> the key its first request gave it (its place in the order)
    _keys: dict[str, str] = field(default_factory=dict, init=False)
    _order: list[str] = field(default_factory=list, init=False)
    _gone: set[str] = field(default_factory=set, init=False)
    _turn: int = field(default=0, init=False)
    #: the caller answered last, whose next request (or leaving) passes the turn
    _answered: str | None = field(default=None, init=False)
    _changed: float = field(default_factory=time.monotonic, init=False)
    broken: bool = field(default=False, init=False)

    def key(self, caller: str) -> str:
        """The caller's key (its first request's text, ids blanked, hashed); ``""`` for a caller not seated."""
        return self._keys.get(caller, "")

    async def wait(self, caller: str, text: str) -> None:
        """Return when it is ``caller``'s turn (at once for a caller outside the rotation)."""
        with self._lock:
            if caller not in self._keys and len(self._keys) < self.seats and not self._order:
                self._keys[caller] = hashlib.sha256(stable_text(text).encode()).hexdigest()
                self._touch()
            if caller == self._answered:
                self._answered = None
                self._advance(caller)
        while True:
            with self._lock:
                if self._may_go(caller):
                    self._answered = caller if caller in self._order else None
                    self._touch()
                    return
                if time.monotonic() - self._changed > self.stall_s:
                    self._unstick()
            await anyio.sleep(_POLL_S)

    def leave(self, caller: str) -> None:
        """``caller`` makes no more calls (its last answer was given, or the broker refused it)."""
        with self._lock:
            if caller not in self._keys and not self._order and len(self._keys) < self.seats:
                # refused before its first call reached the provider: its seat is taken, and empty
                self._keys[caller] = ""
            if caller not in self._keys or caller in self._gone:
                return
            self._gone.add(caller)
            if self._answered == caller:
                self._answered = None
                self._advance(caller)
            self._touch()

    def _touch(self) -> None:
        self._changed = time.monotonic()

    def _seated(self) -> bool:
        if not self._order and len(self._keys) >= self.seats:
            self._order = sorted(self._keys, key=lambda c: (self._keys[c], c))
        return bool(self._order)

    def _may_go(self, caller: str) -> bool:
        if caller not in self._keys or caller in self._gone:
            return True  # not in the rotation: the lead, a late or retried worker
        if not self._seated() or self._answered is not None:
            return False
        live = [c for c in self._order if c not in self._gone]
        return not live or live[self._turn % len(live)] == caller

    def _advance(self, after: str) -> None:
        """The turn goes to the caller after ``after`` in the order, among those still in it."""
        if not self._order:
            return
        live = [c for c in self._order if c not in self._gone]
        if not live:
            return
        later = [i for i, c in enumerate(live) if self._order.index(c) > self._order.index(after)]
        self._turn = later[0] if later else 0

    def _unstick(self) -> None:
        """Nothing moved for ``stall_s``: go on without whoever holds the rotation up."""
        self.broken = True
        if not self._order:
            log.warning("turns: %d of %d callers came within %.0f s; going on with them (this run may not be "
                        "reproducible)", len(self._keys), self.seats, self.stall_s)
            self._order = sorted(self._keys, key=lambda c: (self._keys[c], c))
        elif self._answered is not None:
            log.warning("turns: a caller neither came back nor left within %.0f s; going on without it (this "
                        "run may not be reproducible)", self.stall_s)
            stuck = self._answered
            self._gone.add(stuck)
            self._answered = None
            self._advance(stuck)
        self._touch()
