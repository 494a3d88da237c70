"""The SQLite engine checkpoints its WAL on a thread of its own, never inside a writer's commit."""

from __future__ import annotations

from pathlib import Path

from swarmyard.store.engine import SqliteEngine

ROWS, ROW_BYTES = 1_500, 3_000  # about 1,500 pages: past SQLite's default 1,000-page automatic checkpoint


def _fill(engine: SqliteEngine) -> None:
    with engine.write() as cur:
        cur.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    for _ in range(ROWS):
        with engine.write() as cur:
            cur.execute("INSERT INTO t (body) VALUES (?)", ("x" * ROW_BYTES,))


def test_commits_never_checkpoint_the_wal(tmp_path: Path) -> None:
    # the checkpointing thread makes one pass at the first write, then waits an hour
    engine = SqliteEngine(tmp_path / "store.db", checkpoint_every_s=3600)
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


def test_the_checkpointing_thread_moves_the_wal_into_the_database(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path / "store.db", checkpoint_every_s=0.001)
    try:
        _fill(engine)
        assert engine.checkpointer is not None
        engine.checkpointer.passed.clear()
        with engine.write() as cur:
            cur.execute("INSERT INTO t (body) VALUES ('last')")
        assert engine.checkpointer.passed.wait(30)
        assert (tmp_path / "store.db").stat().st_size > ROWS * ROW_BYTES
        with engine.read() as cur:
            assert cur.execute("SELECT count(*) FROM t").fetchone()[0] == ROWS + 1
    finally:
        engine.close()
