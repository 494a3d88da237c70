"""The store: one protocol, two engines (SQLite embedded by default, PostgreSQL for several hosts).

``open_store("sqlite:///runs/x/store.db")`` or ``open_store("postgresql://...")``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from swarmyard.clock import Clock
from swarmyard.errors import UserError
from swarmyard.store.protocol import Store
from swarmyard.store.sql import BROADCAST_GROUP, SqlStore


def open_store(url: str, *, clock: Clock | None = None, blob_dir: Path | None = None, serving: bool = False,
               **limits: Any) -> SqlStore:
    """Open (and migrate) the store at ``url``: ``sqlite:///path`` or ``postgresql://...``.

    ``serving``: for a long-lived process that answers requests from it (the control plane, the broker, a
    run's coordinator), where SQLite's WAL is then checkpointed by a thread of its own, never inside a commit.

    Artifacts go to ``blob_dir``: by default ``blobs/`` beside a SQLite file; for PostgreSQL ``$SWARMYARD_BLOBS``,
    else ``$XDG_DATA_HOME/swarmyard/blobs`` (a folder every host of a shared run must see).
    """
    from swarmyard.store.engine import PostgresEngine, SqliteEngine

    pool_size = int(limits.pop("pool_size", 16))
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_absolute() and url.startswith("sqlite:////"):
            path = Path("/" + str(path))
        if str(path) != ":memory:" and path.parent.is_dir() and not path.exists():
            # Created 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's own mode.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        engine = SqliteEngine(path, checkpoint_every_commits=200 if serving else None)
        return SqlStore(url, engine, clock=clock, blob_dir=blob_dir or path.parent / "blobs", **limits)
    if url.startswith(("postgresql://", "postgres://")):
        data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
        default_blobs = Path(os.environ.get("SWARMYARD_BLOBS") or data_home / "swarmyard" / "blobs")
        return SqlStore(url, PostgresEngine(url, max_size=pool_size), clock=clock, blob_dir=blob_dir or default_blobs,
                        **limits)
    raise UserError(f"unknown store URL {url!r}: use sqlite:///path or postgresql://...")


__all__ = ["BROADCAST_GROUP", "SqlStore", "Store", "open_store"]
