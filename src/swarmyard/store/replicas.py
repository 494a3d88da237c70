"""The store's part of several control-plane replicas: shared rate buckets, and the holds of a dead replica.

Rate buckets: a worker's token bucket is one row, taken from with one conditional upsert
(``INSERT ... ON CONFLICT DO UPDATE ... WHERE the refilled bucket holds a token RETURNING``). Under PostgreSQL
concurrent takes of one bucket queue on its row lock and each sees the last one's result, so replicas share
one bucket exactly: a worker that spreads its calls over N replicas still gets ``rate`` calls a second, not
N times that. A tool call takes its token inside its own write transaction (``rate_token_folded``), so it makes
one write, not two. ``updated_at`` only moves forward, so replicas whose clocks disagree cannot refill a bucket
twice for the same interval: the refill is bounded by the fastest clock.

Replicas: every serving process registers a row in ``planes`` and renews its ``seen_at``; every hold it makes
carries its id. A replica killed with calls in flight leaves their holds ``held`` (it settles after the answer
went out, and it will never answer); once its row is older than the grace period another replica marks those
holds ``unknown``, the state of a call whose outcome is not known, which keeps the amount held until an
operator reconciles it. A replica that was only slow and settles later still can (settle takes an ``unknown``
hold), so the envelopes move once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from swarmyard.domain import Reservation
from swarmyard.errors import IllegalTransitionError, InvalidInputError, RateLimitedError
from swarmyard.store.engine import Cursor, Engine

_KEY_LIMIT = 200


class ReplicaStore:
    """Rate buckets and the replica registry; mixed into ``SqlStore``, whose plumbing it uses."""

    _e: Engine
    #: the serving replica whose holds this store makes (``register_plane``); None outside ``serve``
    plane_id: str | None = None

    def _now(self) -> float:
        raise NotImplementedError

    @staticmethod
    def _one(cur: Cursor, sql: str, params: Sequence[Any]) -> Any:
        raise NotImplementedError

    def mark_unknown(self, reservation_id: str) -> Reservation:
        raise NotImplementedError

    def return_ended_slices(self, goal_id: str | None = None, *, every: bool = False) -> list[str]:
        raise NotImplementedError

    # -- rate buckets -------------------------------------------------------------------------------------
    @staticmethod
    def _bucket_args(key: str, rate_per_s: float, burst: int) -> None:
        if not isinstance(key, str) or not key or len(key) > _KEY_LIMIT:
            raise InvalidInputError(f"a rate bucket key is 1 to {_KEY_LIMIT} characters", field="key")
        if not rate_per_s > 0 or burst < 1:
            raise InvalidInputError("rate_per_s must be positive and burst at least 1", field="rate_per_s")

    def _take(self, cur: Cursor, key: str, rate_per_s: float, burst: int) -> float:
        """The take, inside a write transaction: 0.0 when taken, else the seconds until a token is free."""
        least, greatest = ("LEAST", "GREATEST") if self._e.postgres else ("MIN", "MAX")
        now, cap, rate = self._now(), float(burst), float(rate_per_s)
        refilled = (f"{least}(?, rate_buckets.tokens + {greatest}(0.0, ? - rate_buckets.updated_at) * ?)")
        taken = self._one(cur, "INSERT INTO rate_buckets (key, tokens, updated_at) VALUES (?, ?, ?) "
                               f"ON CONFLICT (key) DO UPDATE SET tokens = {refilled} - 1.0, "
                               f"updated_at = {greatest}(rate_buckets.updated_at, ?) "
                               f"WHERE {refilled} >= 1.0 RETURNING tokens",
                          (key, cap - 1.0, now, cap, now, rate, now, cap, now, rate))
        if taken is not None:
            return 0.0
        row = self._one(cur, f"SELECT {refilled.replace('rate_buckets.', '')} FROM rate_buckets WHERE key = ?",
                        (cap, now, rate, key))
        tokens = float(row[0]) if row is not None else 0.0
        return max(0.0, (1.0 - tokens) / rate)

    def take_rate_token(self, key: str, rate_per_s: float, burst: int) -> float:
        """Take one token from ``key``'s bucket (``rate_per_s`` sustained, ``burst`` at once): 0.0 when taken,
        else the seconds until one is free (nothing is taken)."""
        self._bucket_args(key, rate_per_s, burst)
        with self._e.write() as cur:
            return self._take(cur, key, rate_per_s, burst)

    @contextmanager
    def rate_token_folded(self, key: str, rate_per_s: float, burst: int) -> Iterator[None]:
        """A block (one tool call) that takes one token from ``key``'s bucket in its own first write transaction.

        The take is that transaction's first statement, so a tool call that writes makes one write transaction,
        not two. Refused, it raises ``RateLimitedError`` there and that transaction does nothing. A block that
        commits no write on this thread (a read, or a write that failed) takes its token on its own as it
        ends, and raises ``RateLimitedError`` then when none is free, so every call is counted either way.
        """
        self._bucket_args(key, rate_per_s, burst)
        refused = False

        def take(cur: Cursor) -> None:
            nonlocal refused
            wait_s = self._take(cur, key, rate_per_s, burst)
            if wait_s > 0:
                refused = True
                raise RateLimitedError(f"{key} is over {rate_per_s:g} calls/s", retry_after_s=round(wait_s, 3))

        folded = self._e.fold(take)
        try:
            yield
        finally:
            self._e.unfold(folded)
            if not folded.done and not refused:
                wait_s = self.take_rate_token(key, rate_per_s, burst)
                if wait_s > 0:
                    raise RateLimitedError(f"{key} is over {rate_per_s:g} calls/s", retry_after_s=round(wait_s, 3))

    # -- replicas -----------------------------------------------------------------------------------------
    def register_plane(self, plane_id: str) -> None:
        """This store serves replica ``plane_id``: record it as alive, and tag every hold it makes with it."""
        self.plane_id = plane_id
        self.plane_seen(plane_id)

    def plane_seen(self, plane_id: str) -> None:
        """Replica ``plane_id`` is alive now."""
        now = self._now()
        with self._e.write() as cur:
            cur.execute("INSERT INTO planes (id, started_at, seen_at) VALUES (?, ?, ?) "
                        "ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at", (plane_id, now, now))

    def sweep_dead_planes(self, grace_s: float) -> list[str]:
        """Mark ``unknown`` every hold still ``held`` by a replica not seen for ``grace_s`` seconds, forget
        replicas with nothing left held, and return the ids of the holds marked. The slices of claims whose
        lease expired (their worker or its replica died) go back to their goals here too, exactly once."""
        stale_before = self._now() - grace_s
        with self._e.read() as cur:
            cur.execute("SELECT r.id FROM reservations r JOIN planes p ON p.id = r.plane_id "
                        "WHERE r.state = 'held' AND p.seen_at < ? ORDER BY r.created_at", (stale_before,))
            held = [str(r[0]) for r in cur.fetchall()]
        marked = []
        for reservation_id in held:
            try:
                self.mark_unknown(reservation_id)
            except IllegalTransitionError:
                continue  # settled or released meanwhile (a late settlement, another replica's sweep)
            marked.append(reservation_id)
        with self._e.write() as cur:
            cur.execute("DELETE FROM planes WHERE seen_at < ? AND NOT EXISTS (SELECT 1 FROM reservations r "
                        "WHERE r.plane_id = planes.id AND r.state = 'held')", (stale_before,))
        self.return_ended_slices()
        return marked
