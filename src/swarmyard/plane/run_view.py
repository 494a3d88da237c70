"""A finished run's dashboard: the live page at ``/ui``, read-only, over the run's folder.

``swarmyard ui RUN_FOLDER`` (also ``runs show RUN --ui``, and ``swarmyard run --ui`` once its run has ended) serves
the dashboard's routes and nothing else: no worker tool, no operator action, no broker, so nothing on the page
can change the run. What the live page had from the running process comes from the run folder instead:

- slot names: the runner names each agent run's log and trajectory ``agents/<slot>-<worker>.log`` and ``.jsonl``;
- trajectories: those files, and each worker's CPU time and peak memory from the last step that says them;
- the run's end: the time of its ``run.closed`` event (the last leaf of its last signed checkpoint), so that the
  timeline ends with the run rather than at the time it is looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.domain import TaskState
from swarmyard.errors import UserError
from swarmyard.plane.agent_errors import slot_and_worker
from swarmyard.plane.dashboard import Dashboard, RunFacts
from swarmyard.plane.folder_files import read_regular
from swarmyard.plane.trajectory import TrajectoryFiles, read_trajectory
from swarmyard.store.engine import SqliteEngine
from swarmyard.store.protocol import AuditStore, Store
from swarmyard.store.sql import SqlStore

#: How far back from its last checkpoint a run's ``run.closed`` event is looked for.
_CLOSED_WITHIN = 50
#: Bytes of ``run.json`` and of a checkpoint note read (each is far smaller; a file in their place is bounded).
_RUN_JSON_BYTES, _NOTE_BYTES = 1024 * 1024, 64 * 1024


@dataclass
class FinishedRun:
    """A run folder opened for its dashboard: the store, the slot of each worker, and how and when it ended."""

    run_dir: Path
    run_id: str
    goal_id: str
    store: Store
    slots: dict[str, str] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    ended_at: float | None = None
    outcome: str = "stopped"

    @classmethod
    def open(cls, run_dir: Path) -> FinishedRun:
        """Open ``run_dir`` (``UserError`` when it is no run folder or its store is gone)."""
        raw = read_regular(run_dir / "run.json", _RUN_JSON_BYTES)
        try:
            state = json.loads(raw if raw is not None else b"")
        except (ValueError, RecursionError) as exc:
            raise UserError(f"{run_dir} is not a run folder (no readable run.json)") from exc
        if not isinstance(state, dict) or not isinstance(state.get("goal_id"), str):
            raise UserError(f"{run_dir}/run.json is not a run's state")
        url = run_store_url(run_dir, state)
        if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
            raise UserError(f"run {run_dir.name}: its store {url} is gone")
        if url.startswith("sqlite:///"):
            refuse_not_sqlite(run_dir, Path(url.removeprefix("sqlite:///")))
            _refuse_older(run_dir, Path(url.removeprefix("sqlite:///")))
        run_id = str(state.get("run_id") or run_dir.name)
        if len(run_id) > 200 or "\0" in run_id:  # it names the folder of the run's secrets
            raise UserError(f"{run_dir}/run.json: its run id is not one (a name of at most 200 characters)")
        try:
            store = open_run_store(url)
        except sqlite3.DatabaseError as exc:  # past its header: pages a database does not have
            raise UserError(f"run {run_dir.name}: its store cannot be read ({str(exc)[:200]})") from exc
        run = cls(run_dir, run_id, state["goal_id"], store)
        try:
            store.get_goal(run.goal_id)  # NotFoundError when the store holds another run
            run._read(bool(state.get("lead_done")))
        except (KeyError, ValueError, TypeError, sqlite3.DatabaseError) as exc:
            store.close()  # a row this version cannot read: a store made by hand, or by another version
            raise UserError(f"run {run_dir.name}: its store holds a row this version cannot read "
                            f"({type(exc).__name__}: {str(exc)[:200]})") from exc
        except BaseException:
            store.close()
            raise
        return run

    def _read(self, lead_done: bool) -> None:
        agents = self.run_dir / "agents"
        for path in sorted(agents.glob("*.log")) + sorted(agents.glob("*.jsonl")) if agents.is_dir() else []:
            if ".transcript." in path.name:
                continue
            named = slot_and_worker(path.stem)
            if named is not None:
                self.slots.setdefault(named[1], named[0])
        for worker in self.slots:
            for step in reversed(read_trajectory(agents / f"{self.slots[worker]}-{worker}.jsonl")):
                if isinstance(step.get("cpu_ms"), int) and isinstance(step.get("max_rss_kb"), int):
                    self.usage[worker] = {"cpu_ms": step["cpu_ms"], "max_rss_kb": step["max_rss_kb"],
                                          "step": int(step.get("step") or 0)}
                    break
        self.ended_at = self._closed_at()
        lead = [t for t in self.store.list_tasks(self.goal_id) if t.group == "lead"]
        if lead_done:
            self.outcome = "synthesis"
        elif (lead and lead[-1].state is TaskState.FAILED) or self.ended_at is not None:
            self.outcome = "no synthesis"
        # else "stopped": it was interrupted (or runs still, elsewhere) before it closed

    def _closed_at(self) -> float | None:
        return closed_at(self.store, self.run_dir, self.run_id)

    def machines(self) -> list[dict[str, Any]]:
        """Every worker's slot, as the live page's machine rows (every machine is gone: the run has ended)."""
        return [{"worker": worker, "slot": slot, "machine": "-", "state": "ended"}
                for worker, slot in self.slots.items()]

    def facts(self) -> RunFacts:
        """How the run ended, for the page."""
        return RunFacts(finished=True, ended_at=self.ended_at, outcome=self.outcome, run_id=self.run_id)

    def trajectories(self) -> TrajectoryFiles:
        """The run's trajectory files, each worker's under its slot's name."""
        files = TrajectoryFiles(self.run_dir / "agents")
        for worker, slot in self.slots.items():
            files.label(worker, f"{slot}-{worker}")
        return files

    def close(self) -> None:
        """Close the store."""
        self.store.close()


class _ImmutableSqlite(SqliteEngine):
    """A SQLite store read as immutable: no lock taken, no ``-wal`` or ``-shm`` file made, nothing written."""

    def _connect(self, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                               isolation_level=None, check_same_thread=False)
        with self._lock:
            self._all.append(conn)
        return conn


def open_run_store(url: str) -> SqlStore:
    """A run's store, opened to be read. A SQLite store in a folder this process cannot write (a read-only file
    system, another user's runs folder) is read as immutable: SQLite's WAL mode needs its ``-shm`` file, which it
    could not make there ('unable to open database file'), and a run there is no longer written."""
    from swarmyard.store import open_store

    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if path.is_file() and not os.access(path.parent, os.W_OK):
            return SqlStore(url, _ImmutableSqlite(path), blob_dir=path.parent / "blobs")
    return open_store(url)


def run_store_url(run_dir: Path, state: dict[str, Any]) -> str:
    """The store of the run in ``run_dir`` (``state``: its ``run.json``).

    A run whose store is its folder's ``store.db`` names it in ``run.json`` by the absolute path the folder had
    then: a folder moved, copied or unpacked elsewhere keeps its own store beside it, while that path names
    another folder's (or nothing). So a SQLite store named ``store.db`` in a folder of this one's name, or at a
    path that is gone, is this folder's own ``store.db`` when it has one; any other store is the one named."""
    own = run_dir / "store.db"
    named = state.get("store_url")
    if not named:
        return f"sqlite:///{own.resolve()}"
    url = str(named)
    if url.startswith("sqlite:///") and own.is_file():
        path = Path(url.removeprefix("sqlite:///"))
        if path.name == "store.db" and (path.parent.name == run_dir.resolve().name or not path.exists()):
            return f"sqlite:///{own.resolve()}"
    return url


#: The first bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_not_sqlite(run_dir: Path, path: Path) -> None:
    """Refuse a store file that is no SQLite database: opening it as one would end in SQLite's own error, or,
    for an empty file, write a new store's tables into it (SQLite takes an empty file for an empty database)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"run {run_dir.name}: its store {path} cannot be opened ({exc.strerror})") from exc
    try:
        head = os.read(fd, len(SQLITE_HEADER))
    except OSError as exc:
        raise UserError(f"run {run_dir.name}: its store {path} cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    if head != SQLITE_HEADER:
        raise UserError(f"run {run_dir.name}: its store {path} is not a SQLite database"
                        + (" (an empty file)" if not head else ""))


def _refuse_older(run_dir: Path, path: Path) -> None:
    """Refuse a SQLite store older than this swarmyard: opening it would migrate it (a write, and one the
    swarmyard that made the run then refuses), and a run's dashboard changes nothing. Read as immutable: no
    lock, no -wal or -shm file made beside it."""
    from swarmyard.store.schema import MIGRATIONS

    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.Error:
        return  # no meta table, or not a database: opening the store says what it is
    version = int(row[0]) if row is not None and str(row[0]).isdigit() else None
    if version is not None and version < len(MIGRATIONS):
        raise UserError(f"run {run_dir.name}: its store is of schema version {version}, older than this "
                        f"swarmyard's {len(MIGRATIONS)}; opening it would migrate it, and a run's dashboard "
                        "changes nothing: open it with the swarmyard that made the run")


def closed_at(store: AuditStore, run_dir: Path, run_id: str) -> float | None:
    """When run ``run_id``'s ``run.closed`` event was written: the last leaves of its last signed checkpoint
    (None: the run never closed, it was interrupted or runs still)."""
    from swarmyard.audit.log import RUN_CLOSED

    notes = sorted((run_dir / "audit" / "checkpoints").glob("*.note"))
    if not notes:
        return None
    note = read_regular(notes[-1], _NOTE_BYTES)
    if note is None:
        return None
    lines = note.decode("utf-8", "replace").splitlines()
    if len(lines) < 2 or not (lines[1].isascii() and lines[1].isdigit() and len(lines[1]) <= 18):
        return None
    size = int(lines[1])
    mark = f'"run":"{run_id}"'.encode()
    for event in reversed(store.read_events(max(0, size - _CLOSED_WITHIN), size)):
        if event.kind == RUN_CLOSED and mark in event.body:
            return event.created_at
    return None


def finished_app(run: FinishedRun, tokens: TokenAuthority, hosts: tuple[str, ...] = ()) -> Starlette:
    """The dashboard's routes over a finished run, and nothing else (read-only)."""

    async def offload(fn: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(fn)

    dashboard = Dashboard(run.store, tokens, offload, trajectories=run.trajectories(), machines=run.machines,
                          hosts=hosts, usage=lambda: run.usage, facts=run.facts(),
                          agents=run.run_dir / "agents")
    app = Starlette(routes=dashboard.routes())
    app.state.on_stop = [dashboard.close]
    return app


def bind_dashboard(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``: ``port`` if it is free, else any free one (the live run's port is
    taken again when it can be, so a page left open reconnects to the finished run by itself)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError:
        if port == 0:
            raise
        return socket.create_server((host, 0), family=family, backlog=128)


def serve_finished(run: FinishedRun, tokens: TokenAuthority, host: str, tcp: socket.socket,
                   hosts: tuple[str, ...] = (), stopped: threading.Event | None = None) -> None:
    """Serve the finished run's dashboard on ``tcp`` in the foreground until SIGINT (``KeyboardInterrupt``
    after a clean stop) or SIGTERM (returns); ``stopped``: a SIGTERM that came before the server's handlers."""
    from swarmyard.plane.server import Listen, serve

    port = int(tcp.getsockname()[1])
    serve(finished_app(run, tokens, hosts), Listen(None, host, port), sockets=(None, tcp), stopped=stopped)
