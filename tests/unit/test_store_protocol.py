"""The ``Store`` protocol is the union of its concern protocols, each member in exactly one of them, and
``SqlStore`` answers every member with the protocol's parameters and defaults (mypy checks the types; it lets an
implementation's default differ from the protocol's, which would change what a caller that omits it gets)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Protocol

from swarmyard.store import SqlStore, open_store
from swarmyard.store.protocol import Store


def _concerns() -> list[type]:
    return [base for base in Store.__bases__ if base is not Protocol]


def _members(cls: type) -> set[str]:
    """What ``cls`` itself declares: its methods and its annotated attributes."""
    own = {name for name, value in vars(cls).items() if inspect.isfunction(value) and not name.startswith("__")}
    return own | set(vars(cls).get("__annotations__", {}))


def test_every_member_of_store_is_in_exactly_one_concern() -> None:
    concerns = _concerns()
    assert len(concerns) == 9
    assert all(getattr(c, "_is_protocol", False) for c in concerns)
    assert _members(Store) == set()  # Store adds nothing of its own
    owners: dict[str, list[str]] = {}
    for concern in concerns:
        assert _members(concern), concern.__name__
        for name in _members(concern):
            owners.setdefault(name, []).append(concern.__name__)
    assert {name: found for name, found in owners.items() if len(found) != 1} == {}
    # every method a Store has comes from one of them
    methods = {name for name, value in inspect.getmembers(Store, inspect.isfunction) if not name.startswith("_")}
    assert methods <= set(owners)
    assert {"url", "single_writer", "close", "claim", "post", "reserve", "record_event"} <= set(owners)


def test_sql_store_answers_every_member_with_the_protocols_parameters(tmp_path: Path) -> None:
    mismatched: dict[str, tuple[str, str]] = {}
    for concern in _concerns():
        for name, method in vars(concern).items():
            if not inspect.isfunction(method) or name.startswith("__"):
                continue
            implemented = getattr(SqlStore, name)
            want = [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]
            got = [(p.name, p.kind, p.default) for p in inspect.signature(implemented).parameters.values()]
            if want != got:
                mismatched[name] = (str(want), str(got))
    assert mismatched == {}
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        assert isinstance(store.url, str) and store.url.endswith("store.db")
        assert isinstance(store.single_writer, bool)
    finally:
        store.close()
