"""Holds: every reservation the broker admits ends exactly once, settled, released or ``unknown``.

The rule, once the request's bytes may have left: a whole answer whose usage is known settles; anything else
(a lost answer, a cut stream, a worker gone mid-stream, an answer that could not be passed on, a settlement
the store refused) is ``unknown``. Only an upstream's error status (nothing generated, nothing to bill) or a
failure before the request left releases.

Every outcome is written by one path, ``Holds._end``: right here on the event loop when the store can take it
without waiting (SQLite with its write lock free), else on the broker's store threads. A release or an
``unknown`` is written before the worker hears of it. A settlement is not waited for: it runs on the loop's
next turn, once the answer's last bytes are out, so the worker does not pay a store commit on every call.
Until it lands the worst case stays held, which only ever refuses too early. If the broker dies in between,
the hold stays ``held`` (visible in ``swarmyard budget``; ``swarmyard budget reconcile`` settles or releases
it); ``Holds.wait_settled`` waits for the last ones.

A worker whose call went ``unknown`` may send the same body again (opencode and aider resend after a 502 even
with ``x-should-retry: false``): it is refused (409 ``duplicate_of_unknown``) before anything is held or sent.
Every hold records a digest of its request body (``body_digest``) and the reservation refuses, in its own
transaction, a body of the same worker whose hold is ``unknown``: so a resend is refused by every ``serve``
process and replica over the store, and after a replica died with the call in flight too (its hold is marked
``unknown`` by a live replica). ``Holds.refuse_resend`` answers the common case first, from the digests of the
calls this process lost, without a store trip. A hold that was reconciled since no longer refuses anything.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
from enum import StrEnum
from typing import assert_never

import anyio

from swarmyard.broker import ledger
from swarmyard.broker.admission import Admitted
from swarmyard.broker.chat import Usage
from swarmyard.broker.providers.protocol import CallState
from swarmyard.domain import ReservationState
from swarmyard.errors import (
    ContextLengthError,
    DuplicateOfUnknownError,
    NotFoundError,
    ProviderError,
    StoreBusyError,
    SwarmyardError,
    UpstreamLostError,
    UpstreamUnknownError,
)
from swarmyard.store.engine import connection_lost
from swarmyard.store.protocol import Store
from swarmyard.store.threads import StoreThreads, without_waiting

log = logging.getLogger(__name__)

#: How many lost bodies the broker remembers per worker (the oldest is forgotten first).
_REMEMBERED_PER_WORKER = 64
#: How many times an outcome is written when the store's connection is lost under it.
_WRITE_TRIES = 3


class Outcome(StrEnum):
    """How a hold ends."""

    SETTLED = "settled"
    RELEASED = "released"
    UNKNOWN = "unknown"


class Hold:
    """One admitted request's reservation, from admission to its one outcome."""

    __slots__ = ("admitted", "body", "ended")

    def __init__(self, admitted: Admitted, body: bytes) -> None:
        self.admitted = admitted
        self.body = body  # kept (not hashed) until the call is lost: only then is its digest needed
        self.ended = False


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def body_digest(body: bytes) -> str:
    """The digest a hold records of its request's body (hex)."""
    return _digest(body).hex()


class Holds:
    """Ends holds (settle, release, mark unknown) and remembers the bodies of lost calls."""

    def __init__(self, store: Store, threads: StoreThreads) -> None:
        self.store = store
        self._threads = threads
        self._pending: set[asyncio.Task[None]] = set()  # settlements not yet written
        self._unwritten = 0  # outcomes not yet written; wait_settled waits for zero
        self._written = threading.Condition()
        self._lost_bodies: dict[str, dict[bytes, str]] = {}  # worker -> body digest -> reservation id

    # -- outcomes -------------------------------------------------------------------------------------------

    def settle_soon(self, hold: Hold, usage: Usage) -> None:
        """Settle at ``usage`` on the loop's next turn (the answer's last bytes are written in this one)."""
        if not self._begin(hold):
            return
        task = asyncio.ensure_future(self._end(hold, Outcome.SETTLED, usage))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def release(self, hold: Hold) -> None:
        """Nothing can have been billed: give the whole hold back."""
        if self._begin(hold):
            with anyio.CancelScope(shield=True):
                await self._end(hold, Outcome.RELEASED)

    async def lose(self, hold: Hold, exc: BaseException) -> UpstreamUnknownError:
        """The cost is unknown: mark the hold so, remember its body, and say what to answer."""
        reservation_id = hold.admitted.reservation.id
        if self._begin(hold):
            self._remember(hold)
            log.warning("reservation %s is unknown: %s", reservation_id, type(exc).__name__)
            with anyio.CancelScope(shield=True):
                await self._end(hold, Outcome.UNKNOWN)
        return UpstreamUnknownError(
            f"the upstream answer was lost after the request was sent; reservation "
            f"{reservation_id} is held until reconciled",
            reservation_id=reservation_id,
        )

    async def fail(self, hold: Hold, state: CallState, exc: BaseException) -> SwarmyardError:
        """End the hold of a call that raised ``exc``: released or unknown; say what to answer."""
        # an error status is an answer: the provider refused, nothing was generated, nothing to bill
        answered = isinstance(exc, (ProviderError, ContextLengthError)) and not isinstance(exc, UpstreamLostError)
        if isinstance(exc, UpstreamLostError) or (state.sent and not answered):
            return await self.lose(hold, exc)
        await self.release(hold)
        if isinstance(exc, SwarmyardError) and answered:
            return exc
        log.error("provider failed before sending", exc_info=exc)
        return ProviderError(
            f"provider failed before the request was sent ({type(exc).__name__})", retryable=True
        )

    def _begin(self, hold: Hold) -> bool:
        """Whether this is the first outcome asked for ``hold`` (later ones are ignored); counted as unwritten
        from here, so that ``wait_settled`` called as soon as the answer is out waits for it."""
        if hold.ended:
            return False
        hold.ended = True
        with self._written:
            self._unwritten += 1
        return True

    async def _end(self, hold: Hold, outcome: Outcome, usage: Usage | None = None) -> None:
        """Write ``outcome`` (after ``_begin``): here when the store can take it without waiting, else on the
        store threads."""
        try:
            done, _ = without_waiting(self.store, lambda: self._write(hold, outcome, usage))
            if not done:
                await self._write_on_threads(hold, outcome, usage)
        except Exception:
            # the hold stays as it was (or was reconciled meanwhile): visible, and reconcilable
            log.exception("reservation %s could not be marked %s", hold.admitted.reservation.id, outcome)
        finally:
            with self._written:
                self._unwritten -= 1
                if not self._unwritten:
                    self._written.notify_all()

    async def _write_on_threads(self, hold: Hold, outcome: Outcome, usage: Usage | None) -> None:
        """Write ``outcome`` on the store threads, again on a new connection if the store's was lost under it
        (a PostgreSQL server that restarted: each try waits for the server as long as the engine's pool does).

        A lost connection may have taken the commit with it: a later try writes only if the hold is still
        ``held``, so an outcome that landed (or an operator's reconcile meanwhile) is not written twice.
        """
        write = self._write
        for tries_left in reversed(range(_WRITE_TRIES)):
            try:
                try:
                    await self._threads.run(functools.partial(write, hold, outcome, usage))
                except RuntimeError:  # the threads are shut down (the broker is closing): write it here
                    write(hold, outcome, usage)
                return
            except Exception as exc:
                if not tries_left or not connection_lost(exc):
                    raise
                log.warning("reservation %s: the store's connection was lost while marking it %s (%s); "
                            "trying again", hold.admitted.reservation.id, outcome, type(exc).__name__)
                write = self._write_if_held

    def _write_if_held(self, hold: Hold, outcome: Outcome, usage: Usage | None) -> None:
        if self.store.get_reservation(hold.admitted.reservation.id).state is ReservationState.HELD:
            self._write(hold, outcome, usage)

    def _write(self, hold: Hold, outcome: Outcome, usage: Usage | None) -> None:
        reservation_id = hold.admitted.reservation.id
        match outcome:
            case Outcome.SETTLED:
                assert usage is not None
                try:
                    self.store.settle(
                        reservation_id,
                        ledger.actual_cost(usage.input_tokens, usage.output_tokens, hold.admitted.price),
                        input_tokens=usage.input_tokens,
                        output_tokens=usage.output_tokens,
                    )
                except StoreBusyError:
                    # the write lock was taken on the event loop's no-wait path: the store threads settle it
                    # (marked unknown here, it would stay unknown whenever the lock was free again by then)
                    raise
                except SwarmyardError:
                    # refused (a usage the store will not take): the cost is not known after all
                    log.exception("reservation %s could not be settled; marking it unknown", reservation_id)
                    self.store.mark_unknown(reservation_id)
            case Outcome.RELEASED:
                self.store.release_reservation(reservation_id)
            case Outcome.UNKNOWN:
                self.store.mark_unknown(reservation_id)
            case _:
                assert_never(outcome)

    def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Block until every outcome asked for is written (False if ``timeout_s`` ran out first)."""
        with self._written:
            return self._written.wait_for(lambda: not self._unwritten, timeout_s)

    async def drain(self) -> None:
        """Wait for the settlements still on their way (the broker is closing)."""
        if self._pending:
            await asyncio.gather(*self._pending)

    # -- resends of lost calls ------------------------------------------------------------------------------

    def _remember(self, hold: Hold) -> None:
        bodies = self._lost_bodies.setdefault(hold.admitted.worker_id, {})
        bodies[_digest(hold.body)] = hold.admitted.reservation.id
        if len(bodies) > _REMEMBERED_PER_WORKER:
            del bodies[next(iter(bodies))]

    async def refuse_resend(self, worker_id: str, body: bytes) -> None:
        """Raise ``DuplicateOfUnknownError`` if ``body`` is one this worker sent before whose hold is still
        ``unknown``. Costs a dict lookup unless the worker has lost a call."""
        bodies = self._lost_bodies.get(worker_id)
        if not bodies:
            return
        digest = _digest(body)
        reservation_id = bodies.get(digest)
        if reservation_id is None:
            return
        try:
            state = (await self._threads.run(lambda: self.store.get_reservation(reservation_id))).state
        except NotFoundError:
            state = None
        if state is ReservationState.UNKNOWN:
            raise DuplicateOfUnknownError(reservation_id)
        del bodies[digest]  # reconciled since: the body may be sent again
