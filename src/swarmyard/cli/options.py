"""Options shared by the noun modules."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.store import SqlStore, open_store

DEFAULT_STORE = "sqlite:///swarmyard.db"

StoreOption = typer.Option(DEFAULT_STORE, "--store", envvar="SWARMYARD_STORE",
                           help="Store URL: sqlite:///path or postgresql://...")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
ServerOption = typer.Option(None, "--server", envvar="SWARMYARD_SERVER",
                            help="A running control plane (socket path, URL, or replicas' URLs separated by "
                            "commas); uses its operator API.")
TokenFileOption = typer.Option(Path("operator-token"), "--operator-token-file", envvar="SWARMYARD_OPERATOR_TOKEN_FILE",
                               help="The operator token written by `swarmyard serve`.")


def store_at(url: str, *, serving: bool = False) -> SqlStore:
    """Open the store named on the command line (``serving``: for a server's own store, see ``open_store``)."""
    return open_store(url, serving=serving)
