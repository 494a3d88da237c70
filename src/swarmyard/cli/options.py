"""Options shared by the noun modules."""

from __future__ import annotations

import typer

from swarmyard.store import SqlStore, open_store

DEFAULT_STORE = "sqlite:///swarmyard.db"

StoreOption = typer.Option(DEFAULT_STORE, "--store", envvar="SWARMYARD_STORE",
                           help="Store URL: sqlite:///path or postgresql://...")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")


def store_at(url: str) -> SqlStore:
    """Open the store named on the command line."""
    return open_store(url)
