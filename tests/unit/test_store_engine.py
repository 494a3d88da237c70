"""The SQLite engine: its WAL is checkpointed on a thread of its own, never inside a writer's commit; a block
that must not wait gets ``StoreBusyError`` at once when the write lock is taken."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from swarmyard.errors import StoreBusyError
from swarmyard.store.engine import SqliteEngine

ROWS, ROW_BYTES = 1_500, 3_000  # about 1,500 pages: past SQLite's default 1,000-page automatic checkpoint


def _fill(engine: SqliteEngine) -> None:
    with engine.write() as cur:
        cur.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    for _ in range(ROWS):
        with engine.write() as cur:
            cur.execute("INSERT INTO t (body) VALUES (?)", ("x" * ROW_BYTES,))


def test_commits_never_checkpoint_the_wal(tmp_path: Path) -> None:
    # the checkpointing thread is asked for a pass only after far more commits than this test makes
    engine = SqliteEngine(tmp_path / "store.db", checkpoint_every_commits=10 * ROWS)
    try:
        _fill(engine)
        assert engine.checkpointer is not None
        with engine.read() as cur:
            assert cur.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == engine.checkpointer.SAFETY_PAGES
        # with SQLite's default, the commit that crossed 1,000 pages would have copied them into the file
        assert (tmp_path / "store.db").stat().st_size < ROWS * ROW_BYTES // 4
        assert (tmp_path / "store.db-wal").stat().st_size > ROWS * ROW_BYTES
    finally:
        engine.close()
    assert engine.checkpointer is None


def test_only_a_serving_store_checkpoints_off_the_writers_path(tmp_path: Path) -> None:
    from swarmyard.store import open_store

    plain = open_store(f"sqlite:///{tmp_path / 'plain.db'}")
    serving = open_store(f"sqlite:///{tmp_path / 'serving.db'}", serving=True)
    try:
        plain.list_goals()
        serving.list_goals()
        assert plain._e.checkpointer is None
        assert serving._e.checkpointer is not None
    finally:
        plain.close()
        serving.close()


def test_the_checkpointing_thread_moves_the_wal_into_the_database(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path / "store.db", checkpoint_every_commits=ROWS // 3)
    try:
        _fill(engine)
        assert engine.checkpointer is not None
        assert engine.checkpointer.passed.wait(30)
        engine.checkpointer.passed.clear()
        for _ in range(ROWS // 3):  # a last pass after every row is in
            with engine.write() as cur:
                cur.execute("INSERT INTO t (body) VALUES ('late')")
        assert engine.checkpointer.passed.wait(30)
        assert (tmp_path / "store.db").stat().st_size > ROWS * ROW_BYTES
        with engine.read() as cur:
            assert cur.execute("SELECT count(*) FROM t").fetchone()[0] == ROWS + ROWS // 3
    finally:
        engine.close()


def test_a_nowait_write_fails_at_once_when_the_lock_is_taken_and_changes_nothing(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path / "store.db")
    try:
        with engine.write() as cur:
            cur.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process, as far as SQLite can tell
        with engine.nowait() as nowait, pytest.raises(StoreBusyError):
            assert nowait
            with engine.write() as cur:
                cur.execute("INSERT INTO t DEFAULT VALUES")
        with engine.nowait(), engine.read() as cur:  # WAL readers still read while a writer holds the lock
            assert cur.execute("SELECT count(*) FROM t").fetchone() == (0,)
        other.execute("COMMIT")
        with engine.nowait(), engine.write() as cur:  # free again: no waiting needed
            cur.execute("INSERT INTO t DEFAULT VALUES")
        with engine.write() as cur:  # outside the block, the waiting connection is used as before
            cur.execute("INSERT INTO t DEFAULT VALUES")
        with engine.read() as cur:
            assert cur.execute("SELECT count(*) FROM t").fetchone() == (2,)
        other.close()
    finally:
        engine.close()
