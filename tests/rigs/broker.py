"""The real broker on loopback HTTP for one worker with a live claim, on a store of its own with a fake clock."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from conftest import ClaimedWorker, claimed_worker
from loopback import serve_in_thread
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.app import Broker
from swarmyard.clock import FakeClock
from swarmyard.domain import Price
from swarmyard.store import SqlStore, open_store


@dataclass(frozen=True)
class LoopbackBroker:
    """Where the broker answers, its store, the worker it serves and the broker itself."""

    url: str
    store: SqlStore
    worker: ClaimedWorker
    broker: Broker


@contextmanager
def loopback_broker(store_url: str, providers: Mapping[str, Any], routes: Sequence[ModelRoute], *, secret: bytes,
                    prices: Sequence[Price] = (), deadline_in_s: float | None = None,
                    **claim: int) -> Iterator[LoopbackBroker]:
    """The store at ``store_url`` (closed when the block ends), a worker with a live claim on a goal of its own
    (``claim``: :func:`conftest.claimed_worker`'s budgets and caps; ``deadline_in_s``: the goal's deadline from the
    fake clock's now), the store's ``prices``, and the broker with ``providers`` and ``routes`` served for it."""
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    try:
        deadline = None if deadline_in_s is None else clock.now() + deadline_in_s
        worker = claimed_worker(store, clock, secret=secret, deadline=deadline, **claim)
        for price in prices:
            store.set_price(price)
        app = create_broker_app(store, worker.tokens, dict(providers), BrokerSettings(routes=tuple(routes)), clock)
        with serve_in_thread(app) as url:
            yield LoopbackBroker(url, store, worker, app.state.broker)
    finally:
        store.close()
