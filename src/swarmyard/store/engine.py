"""The two SQL engines behind one small interface: a read cursor and a write transaction."""

from __future__ import annotations

import contextlib
import select
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from swarmyard.errors import StoreBusyError, StoreError

Row = tuple[Any, ...]


class Cursor(Protocol):
    """The DB-API cursor subset both engines share."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Engine(Protocol):
    """A connection source with SQL written in ``?`` placeholders."""

    postgres: bool

    def write(self) -> Any:
        """A context manager yielding a cursor inside one write transaction."""
        ...

    def nowait(self) -> AbstractContextManager[bool]:
        """A context manager yielding whether writes on this thread inside it fail with ``StoreBusyError``
        instead of waiting for the write lock (False: the engine always waits)."""
        ...

    def read(self) -> Any:
        """A context manager yielding a cursor for reads."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...

    def fold(self, statement: Callable[[Any], None]) -> Folded:
        """Run ``statement`` first in this thread's next write transaction (see :class:`Folded`)."""
        ...

    def unfold(self, folded: Folded) -> None:
        """End ``fold``: this thread's writes no longer run its statement."""
        ...

    def folding(self) -> bool:
        """Whether this thread's next write transaction runs a folded statement."""
        ...


class Folded:
    """A statement folded into the first write transaction of this thread that commits after ``fold``.

    Why: a rate bucket's take is one more write per tool call when it is a transaction of its own (on
    PostgreSQL, a commit and a round trip); run as the first statement of the tool's own write, it costs one
    statement. The statement may raise to refuse: that transaction then rolls back and does nothing, and
    ``done`` stays False (as it does when the transaction fails for any other reason, which rolls the statement
    back with it). ``done`` turns True when a transaction that ran it commits; later writes skip it.
    """

    __slots__ = ("done", "previous", "statement")

    def __init__(self, statement: Callable[[Any], None], previous: Folded | None) -> None:
        self.statement = statement
        self.done = False
        self.previous = previous


class _Folding:
    """``fold`` for both engines: one pending statement per thread."""

    _folds: threading.local

    def fold(self, statement: Callable[[Any], None]) -> Folded:
        """Run ``statement`` first in this thread's next write transaction that commits (see :class:`Folded`)."""
        folded = Folded(statement, getattr(self._folds, "folded", None))
        self._folds.folded = folded
        return folded

    def unfold(self, folded: Folded) -> None:
        """End ``fold``: this thread's writes no longer run its statement."""
        if getattr(self._folds, "folded", None) is folded:
            self._folds.folded = folded.previous

    def folding(self) -> bool:
        """Whether this thread's next write transaction runs a folded statement."""
        folded: Folded | None = getattr(self._folds, "folded", None)
        return folded is not None and not folded.done

    def _run_folded(self, cur: Any) -> Folded | None:
        """Inside a write transaction: run the pending folded statement, if any (it may raise to refuse)."""
        folded: Folded | None = getattr(self._folds, "folded", None)
        if folded is None or folded.done:
            return None
        folded.statement(cur)
        return folded


class _WalCheckpointer:
    """Checkpoints the WAL on a thread of its own, so no transaction on a request's path pays for it.

    SQLite's default runs the checkpoint (copying the WAL's pages into the database, then an fsync) inside
    whichever commit pushes the WAL past 1,000 pages: that commit takes milliseconds instead of tens of
    microseconds, and it is a broker admission or a tool call somebody waits for (``swarmyard bench broker``'s
    p99 was mostly this). Here a commit only counts itself; after every ``every_commits`` commits of this
    process (about as often as SQLite's default would, with a few pages per commit) the thread runs a PASSIVE
    checkpoint, which never blocks a writer or a reader. Counting commits rather than waking on a timer keeps
    many store processes (every serving process has one) from checkpointing many times over what one would.
    SQLite's own automatic checkpoint stays on at a much larger size (``SAFETY_PAGES``) as a floor, should
    this thread fall behind.
    """

    SAFETY_PAGES = 16_384  # about 64 MiB of WAL with 4 KiB pages

    def __init__(self, path: Path, every_commits: int) -> None:
        self._path = path
        self._every = every_commits
        self._commits = 0
        self._due = threading.Event()
        self._stop = False
        #: set after every pass; tests wait on it instead of sleeping
        self.passed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swarmyard-wal", daemon=True)
        self._thread.start()

    def wrote(self) -> None:
        # Not under a lock: a lost increment only delays a pass by one commit.
        self._commits += 1
        if self._commits >= self._every:
            self._commits = 0
            self._due.set()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stop:
                    return
                with contextlib.suppress(sqlite3.Error):  # the next pass (or SQLite's own floor) catches up
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.passed.set()
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._due.set()
        self._thread.join()


class SqliteEngine(_Folding):
    """SQLite in WAL mode, one connection per thread; writes take the write lock up front (BEGIN IMMEDIATE).

    A thread inside ``nowait`` uses a second connection of its own that never waits for the lock. Keep one
    kind of work on one connection: a connection's page cache is dropped whenever another one wrote, and a
    broker that admitted on one connection and settled on another measured 160-215 us a reservation, against
    88 us on one.

    Waiting writers use SQLite's own busy handler. A kernel queue (``flock``) in front was measured: better at
    8 processes, much worse at 64 on 2 cores (every unlock wakes all waiters and the holder is often
    descheduled); short retry sleeps were worse at both. Keeping each write transaction short matters most.

    ``checkpoint_every_commits`` moves the WAL checkpoint off the writers' path (``_WalCheckpointer``): for a
    long-lived serving process, whose commits are requests somebody waits for. Left ``None``, SQLite checkpoints
    inside a commit as usual, which measured better for many short-lived writing processes (``swarmyard bench
    store`` at 8 and 64 processes: each would count only its own commits and the WAL would grow long).
    """

    postgres = False

    def __init__(self, path: Path, *, busy_timeout_ms: int = 60_000,
                 checkpoint_every_commits: int | None = None) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._checkpoint_every = checkpoint_every_commits
        self._local = threading.local()
        self._folds = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._checkpointer: _WalCheckpointer | None = None
        path.parent.mkdir(parents=True, exist_ok=True)

    def _conn(self) -> sqlite3.Connection:
        if getattr(self._local, "nowait", False):
            return self._nowait_conn()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect(self._busy_timeout_ms)
        return conn

    def _nowait_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "nowait_conn", None)
        if conn is None:
            conn = self._local.nowait_conn = self._connect(0)
        return conn

    def _connect(self, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout_ms / 1000)
        # In WAL mode only BEGIN IMMEDIATE waits for the write lock (readers never do); it waits in SQLite's
        # own busy handler.
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        if self._checkpoint_every is not None:
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WalCheckpointer.SAFETY_PAGES}")
        with self._lock:
            self._all.append(conn)
            if self._checkpointer is None and self._checkpoint_every is not None:
                self._checkpointer = _WalCheckpointer(self.path, self._checkpoint_every)
        return conn

    def _would_wait(self, exc: sqlite3.OperationalError) -> bool:
        """Whether ``exc`` is the write lock being taken, in a block that asked not to wait for it."""
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY and getattr(self._local, "nowait", False)

    @property
    def checkpointer(self) -> _WalCheckpointer | None:
        """The WAL checkpointing thread (started with the first connection)."""
        return self._checkpointer

    @contextmanager
    def nowait(self) -> Iterator[bool]:
        """Store calls on this thread inside the block do not wait: SQLite's write lock taken (by any thread or
        process), a write fails with ``StoreBusyError`` and nothing is done. For a caller that must not block,
        such as an event loop, with a queue to fall back on."""
        self._local.nowait = True
        try:
            yield True
        finally:
            self._local.nowait = False

    @contextmanager
    def write(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction, holding SQLite's write lock from its first statement (inside ``nowait``, on
        the thread's connection that fails at once when the lock is taken)."""
        conn = self._conn()
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            cur.close()
            if self._would_wait(exc):
                raise StoreBusyError("the store's write lock is taken") from exc
            raise StoreError(f"cannot start a write transaction: {exc}") from exc
        try:
            folded = self._run_folded(cur)
            yield cur
        except sqlite3.OperationalError as exc:
            conn.rollback()
            if self._would_wait(exc):
                raise StoreBusyError("the store was busy inside a write") from exc
            raise
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()
            if folded is not None:
                folded.done = True
            if self._checkpointer is not None:
                self._checkpointer.wrote()
        finally:
            cur.close()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Cursor]:
        """A cursor in autocommit mode; each statement sees a consistent snapshot."""
        cur = self._conn().cursor()
        try:
            yield cur
        except sqlite3.OperationalError as exc:
            if self._would_wait(exc):  # WAL readers wait only in rare moments (another connection's recovery)
                raise StoreBusyError("the store was busy for a read") from exc
            raise
        finally:
            cur.close()

    def close(self) -> None:
        """Close every thread's connection and stop the checkpointing thread."""
        with self._lock:
            checkpointer, self._checkpointer = self._checkpointer, None
            for conn in self._all:
                conn.close()
            self._all.clear()
        if checkpointer is not None:
            checkpointer.close()
        self._local = threading.local()


#: How long a transaction waits for a pooled connection: a restarting server is waited out, not failed on.
CONNECT_WAIT_S = 120.0


class PostgresEngine(_Folding):
    """PostgreSQL through a psycopg connection pool; SQL placeholders are translated from ``?`` to ``%s``."""

    postgres = True

    def __init__(self, url: str, *, max_size: int = 16) -> None:
        from psycopg_pool import ConnectionPool

        self.url = url
        # Every connection is checked as it is handed out: after a server restart the pool still holds
        # connections the server has closed, and the first transaction on each would fail (AdminShutdown).
        self._pool = ConnectionPool(url, min_size=1, max_size=max_size, kwargs={"autocommit": True}, open=True,
                                    check=_still_open, timeout=CONNECT_WAIT_S)
        self._sql: dict[str, str] = {}
        self._folds = threading.local()

    def _tr(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = sql.replace("?", "%s")
        return out

    @contextmanager
    def write(self) -> Iterator[_PgCursor]:
        """One transaction on a pooled connection (a folded statement first, if this thread has one)."""
        with self._pool.connection() as conn:
            with conn.transaction(), conn.cursor() as cur:
                pg_cur = _PgCursor(cur, self._tr)
                folded = self._run_folded(pg_cur)
                yield pg_cur
            if folded is not None:  # the transaction committed
                folded.done = True

    @contextmanager
    def nowait(self) -> Iterator[bool]:
        """Not offered: a PostgreSQL write is a network round trip, never something to run on an event loop."""
        yield False

    @contextmanager
    def read(self) -> Iterator[_PgCursor]:
        """An autocommit cursor on a pooled connection."""
        with self._pool.connection() as conn, conn.cursor() as cur:
            yield _PgCursor(cur, self._tr)

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a store connection ended or lost mid-transaction (a server that stopped, restarted or
    ended the session): the transaction did not run, or committed without saying so; a new connection may work.

    Only PostgreSQL's connections are lost this way; SQLite's are files.
    """
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


def _still_open(conn: Any) -> None:
    """Refuse an idle pooled connection the server has ended, without a round trip (the pool then makes a new one).

    A server that stops or restarts sends each idle session a FATAL notice and closes it, so its socket turns
    readable; an idle session of ours has nothing else to read (no LISTEN). ``ConnectionPool.check_connection``
    would ask the server instead, a round trip on every transaction (a third of the claims per second here).
    """
    import psycopg

    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    poller = select.poll()  # not select(): a busy runner's descriptors go past FD_SETSIZE
    poller.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    if poller.poll(0):
        conn.close()  # closed, the pool drops it and makes another; only raised, it would be handed out again
        raise psycopg.OperationalError("the server ended this idle connection")


class _PgCursor:
    """A psycopg cursor that accepts ``?`` placeholders."""

    def __init__(self, cur: Any, tr: Any) -> None:
        self._cur = cur
        self._tr = tr

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(self._tr(sql), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cur.fetchall())
