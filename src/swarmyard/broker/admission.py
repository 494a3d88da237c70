"""Admission: route a request, bound its input, price it and reserve its worst case, before any byte leaves.

Admission (token, claim, price and the durable reservation together) runs on the event loop itself when the
store can take it without waiting: SQLite with its write lock free, a route whose input is bounded by bytes.
Otherwise it goes to the broker's store threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from swarmyard.auth.tokens import TokenAuthority, token_hash
from swarmyard.broker import ledger
from swarmyard.broker.chat import ChatRequest, Usage
from swarmyard.broker.providers.protocol import Provider
from swarmyard.broker.settings import BrokerSettings, ModelRoute, Tokenizer
from swarmyard.broker.tokencount import ByteBoundCounter, TokenCounter, cl100k, input_bound
from swarmyard.clock import Clock
from swarmyard.domain import Price, Reservation
from swarmyard.errors import (
    BudgetExceededError,
    ConflictError,
    ContextLengthError,
    DeadlinePassedError,
    NotFoundError,
)
from swarmyard.store.protocol import LedgerStore, Store
from swarmyard.store.threads import StoreThreads, without_waiting

# A price read from the store is reused this long: a price change reaches new reservations within it
_PRICE_TTL_S = 1.0
#: Largest request body admitted on the event loop: bounding its input by bytes takes well under a millisecond.
_INLINE_BODY_BYTES = 64 * 1024


class RoutePrices:
    """Each route's price, read from the store (else the route's default) and reused for ``ttl_s`` of ``now``'s
    time: a price change reaches new reservations within it. Admission's holds and the plane's claim floor read
    prices through one of these each."""

    def __init__(self, store: LedgerStore, now: Callable[[], float], ttl_s: float = _PRICE_TTL_S) -> None:
        self._store = store
        self._now = now
        self._ttl_s = ttl_s
        self._prices: dict[str, tuple[float, Price]] = {}

    def of(self, route: ModelRoute) -> Price:
        now = self._now()
        cached = self._prices.get(route.name)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            price = self._store.get_price(route.name)
        except NotFoundError:
            price = route.default_price
        self._prices[route.name] = (now + self._ttl_s, price)
        return price


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed auth and holds a reservation."""

    reservation: Reservation
    worker_id: str
    price: Price
    counter: TokenCounter
    input_tokens: int
    max_tokens: int

    def usage(self, reported: Usage | None, output_text: str) -> Usage:
        """The usage to settle at: the upstream's record, else the input as bounded and the output counted."""
        if reported is not None:
            return reported
        return Usage(self.input_tokens, self.counter.count(output_text) if output_text else 0)


class Admission:
    """Routes, bounds, prices and reserves; one per broker."""

    def __init__(self, store: Store, tokens: TokenAuthority, providers: Mapping[str, Provider],
                 settings: BrokerSettings, clock: Clock, threads: StoreThreads) -> None:
        self.store = store
        self.tokens = tokens
        self.providers = providers
        self.settings = settings
        self.clock = clock
        self._threads = threads
        self._prices = RoutePrices(store, time.monotonic)

    def route(self, model: str) -> ModelRoute:
        """The route serving ``model`` (``NotFoundError`` when none does)."""
        route = self.settings.by_name.get(model)
        if route is None:
            raise NotFoundError("model", model)
        return route

    def counter(self, route: ModelRoute) -> TokenCounter:
        """How ``route``'s input and output are counted."""
        if route.tokenizer is Tokenizer.CL100K:
            return cl100k()
        if route.tokenizer is Tokenizer.PROVIDER:
            own = self.providers[route.provider].counter(route.upstream)
            if own is not None:
                return own
        return ByteBoundCounter()

    async def admit(self, token: str, chat: ChatRequest, route: ModelRoute, size: int,
                    body_digest: str | None = None) -> Admitted:
        """Admit right here on the event loop when that cannot block it; otherwise on the store threads.

        It cannot block when the store answers without waiting (SQLite, whose write lock is free: taken, the
        attempt fails at once having done nothing, and the call queues for the threads) and counting the
        input is a length, not a tokenizer's work (a byte-bounded route, a small body). That saves the two
        thread hand-offs, a good part of what the broker adds to a call.
        """
        if route.tokenizer is Tokenizer.BYTES and size <= _INLINE_BODY_BYTES:
            done, admitted = without_waiting(self.store, lambda: self._admit(token, chat, route, body_digest))
            if done and admitted is not None:
                return admitted
        return await self._threads.run(lambda: self._admit(token, chat, route, body_digest))

    def _admit(self, token: str, chat: ChatRequest, route: ModelRoute, body_digest: str | None) -> Admitted:
        signed = self.tokens.verify_signed(token)  # a forged or expired token costs no token counting
        if chat.max_tokens is not None and chat.max_tokens > route.max_output_tokens:
            # Agent CLIs send their own large defaults (Claude Code asks for 32,000); the model cannot write
            # past the route's limit anyway, so the request is held (and reserved) at that limit.
            chat = replace(chat, max_tokens=route.max_output_tokens)
        price = self._prices.of(route)
        counter = self.counter(route)
        inputs = input_bound(chat, counter)
        room = route.output_room(inputs)
        if room < self.settings.min_output_tokens:
            # refused before anything is held: the model could not even read the whole conversation
            raise ContextLengthError(route.name, inputs, route.context_tokens)
        max_tokens = chat.max_tokens
        if max_tokens is not None:
            max_tokens = min(max_tokens, room)
            # The common case: the worst case is known before the store is asked, so the worker's token, its
            # claim and both envelopes are checked and charged in one transaction (one trip to the store).
            reservation = self.store.reserve_for_worker(
                signed.worker_id, token_hash(token), model=route.name,
                amount=ledger.worst_case(inputs, max_tokens, price), method=counter.method,
                body_digest=body_digest)
            return Admitted(reservation, signed.worker_id, price, counter, inputs, max_tokens)
        identity = self.tokens.verify(token)
        claim = self.store.current_claim(identity.worker_id)
        if claim is None:
            raise ConflictError(f"worker {identity.worker_id} holds no live claim; claim a task first")
        task = claim.task
        goal = self.store.get_goal(task.goal_id)
        if goal.deadline is not None and self.clock.now() >= goal.deadline:
            raise DeadlinePassedError(goal.id, goal.deadline)
        # the tighter envelope decides, and is the one a refusal names
        envelopes = [
            (f"task {task.id}", task.envelope.available),
            (f"goal {goal.id}", goal.envelope.available),
        ]
        name, available = min(envelopes, key=lambda pair: pair[1])
        max_tokens = ledger.largest_affordable(available, inputs, price, room)
        if max_tokens < self.settings.min_output_tokens:
            raise BudgetExceededError(
                name, ledger.worst_case(inputs, self.settings.min_output_tokens, price), available
            )
        amount = ledger.worst_case(inputs, max_tokens, price)
        reservation = self.store.reserve(
            task.id, claim.token, model=route.name, amount=amount, method=counter.method,
            body_digest=body_digest)
        return Admitted(reservation, identity.worker_id, price, counter, inputs, max_tokens)
