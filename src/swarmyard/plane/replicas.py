"""A serving process's place among the control-plane replicas of one store.

Each ``serve`` process registers itself in the store (``Store.register_plane``), so the holds its broker makes
carry its id, and renews its row every ``HEARTBEAT_S``. On the same beat it sweeps: the holds of a replica not
seen for ``GRACE_S`` (killed, its host gone) that are still ``held`` become ``unknown``, the state of a model
call whose outcome no one can know, so no hold is left open for good and the ledger says what is unresolved.
The grace is many beats long: a replica that was only slow and settles later still can (see
``swarmyard.store.replicas``). A replica sweeps only once its own beats have gone through for a whole grace
period: after a store outage, when no replica could renew, every live one has renewed again before anyone
judges the others dead.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from swarmyard.clock import Clock, SystemClock
from swarmyard.ids import new_id
from swarmyard.store.protocol import ReplicasStore

log = logging.getLogger(__name__)

#: Seconds between a replica's renewals of its row (and its sweeps of dead replicas' holds)
HEARTBEAT_S = 5.0
#: Seconds without a renewal after which a replica counts as dead
GRACE_S = 30.0


class ReplicaWatch:
    """Registers this process as a replica, renews it, and sweeps the holds of dead ones, on a thread."""

    def __init__(self, store: ReplicasStore, *, heartbeat_s: float = HEARTBEAT_S, grace_s: float = GRACE_S,
                 clock: Clock | None = None) -> None:
        self._store = store
        self._clock = clock or SystemClock()
        self._heartbeat_s = heartbeat_s
        self._grace_s = grace_s
        self.plane_id = new_id("pln")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)
        self._beating_since: float | None = None  # when the beats since the last failed one began

    def start(self) -> None:
        """Register (before any request is served: every hold is tagged) and start the beat."""
        self._store.register_plane(self.plane_id)
        self._beating_since = self._clock.now()
        self._thread.start()

    def beat(self) -> list[str]:
        """Renew this replica's row and, once its own beats have gone through for a grace period, sweep; the
        holds marked ``unknown``."""
        try:
            self._store.plane_seen(self.plane_id)
        except Exception:
            self._beating_since = None
            raise
        now = self._clock.now()
        if self._beating_since is None:
            self._beating_since = now
        if now - self._beating_since < self._grace_s:
            return []
        marked = self._store.sweep_dead_planes(self._grace_s)
        if marked:
            log.warning("marked %d hold(s) of a control plane replica gone for %g s unknown: %s", len(marked),
                        self._grace_s, ", ".join(marked))
        return marked

    def _run(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                self.beat()
            except Exception:  # a store outage: the next beat tries again
                log.exception("replica heartbeat failed")

    async def aclose(self) -> None:
        """Stop the beat (run by the server once no request is in flight)."""
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 30.0)
