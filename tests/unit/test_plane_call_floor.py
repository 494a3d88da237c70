"""The least call the plane's claim tool asks a task to afford: the broker's own worst case of the smallest
request, for the model the claim names, else the cheapest honest bound over every route."""

from __future__ import annotations

from pathlib import Path

from swarmyard.broker import ledger
from swarmyard.broker.settings import ModelRoute
from swarmyard.broker.tokencount import REQUEST_OVERHEAD_TOKENS
from swarmyard.clock import FakeClock
from swarmyard.domain import Price
from swarmyard.plane.tools import CallFloor
from swarmyard.store import open_store

CHEAP = ModelRoute("cheap", "p", input_per_mtok=1_000_000, output_per_mtok=2_000_000)
DEAR = ModelRoute("dear", "p", input_per_mtok=0, output_per_mtok=10_000_000, max_output_tokens=300)
WINDOWED = ModelRoute("windowed", "p", input_per_mtok=0, output_per_mtok=10_000_000, context_tokens=8_000)


def test_the_floor_is_the_named_models_least_hold_else_the_cheapest_routes(tmp_path: Path) -> None:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}", clock=clock)
    try:
        floor = CallFloor(store, [CHEAP, DEAR, WINDOWED], 16, clock)
        # no model named, or one not routed: 16 input tokens and one output token at the cheapest route for them
        assert floor() == floor("unknown", 512) == 10  # "dear" (its input is free): 16 x 0 + 1 x 10
        assert CallFloor(store, [CHEAP], 16, clock)() == REQUEST_OVERHEAD_TOKENS * 1 + 1 * 2 == 18
        # a named model: its max_tokens, at most what the route may answer
        assert floor("dear", 512) == ledger.worst_case(REQUEST_OVERHEAD_TOKENS, 300, DEAR.default_price) == 3_000
        assert floor("dear", 100) == 1_000 and floor("dear") == 10
        # a route that knows its window may hold as little as min_output_tokens (a nearly full window)
        assert floor("windowed", 512) == 16 * 10 == 160
        # the store's price wins over the route's default, as admission reads it (after its cache expires)
        store.set_price(Price("dear", 0, 20_000_000))
        assert floor("dear", 100) == 1_000
        clock.advance(2)
        assert floor("dear", 100) == 2_000
        assert CallFloor(store, [], 16, clock)() == 0
    finally:
        store.close()
