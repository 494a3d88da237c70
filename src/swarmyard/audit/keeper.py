"""The audit log of a store that ``swarmyard serve`` serves: ``serve --audit-dir DIR``.

A run keeps its own log (``swarmyard run``); a served store has none unless one serving process keeps it. The
keeper sequences the store's events into the log's leaves every ``SYNC_S`` seconds, signs a checkpoint every
``every_n`` events, and a last one when the server stops, so ``swarmyard audit verify DIR --store URL`` checks
the store against signed checkpoints. Several replicas write the same store's events (sequencing is the store's
and safe from any of them), but one log is one tree in one folder: one replica keeps it, and the folder's
``.lock`` (``flock``) refuses a second keeper on the same host. Stop that replica last, so its last checkpoint
covers what the others wrote. Given a witness (``serve --witness``), every checkpoint is cosigned by it, and
``audit verify DIR --store URL`` reads that witness's home as it does a run's.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
from pathlib import Path

from swarmyard.audit.log import LOG_VKEY, AuditLog, serve_origin
from swarmyard.audit.note import Verifier
from swarmyard.audit.witness import WitnessClient
from swarmyard.errors import UserError
from swarmyard.store.protocol import AuditStore

log = logging.getLogger(__name__)

#: Seconds between syncs of the store's new events into the log
SYNC_S = 2.0


def _origin(audit_dir: Path) -> str:
    """The log's origin: the one its folder already has (a log begun before origins were named after their
    folder keeps its own: ``audit verify --origin`` names it), else the folder's (``serve_origin``)."""
    try:
        return Verifier.parse((audit_dir / LOG_VKEY).read_text().strip()).name
    except FileNotFoundError:
        return serve_origin(audit_dir)


class AuditKeeper:
    """Keeps ``store``'s audit log in ``audit_dir`` on a thread while a server runs."""

    def __init__(self, store: AuditStore, audit_dir: Path, *, every_n: int = 1000, sync_s: float = SYNC_S,
                 witness: WitnessClient | None = None) -> None:
        audit_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd = os.open(audit_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise UserError(f"{audit_dir} is kept by another swarmyard serve: give --audit-dir to one replica "
                            "only") from None
        try:
            self.log = AuditLog(store, audit_dir, _origin(audit_dir), every_n=every_n, witness=witness)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._sync_s = sync_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-keeper", daemon=True)

    def start(self) -> None:
        """Start syncing."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._sync_s):
            try:
                self.log.maybe_checkpoint()
            except Exception:  # a store outage: the next sync tries again
                log.exception("syncing the audit log failed")

    async def aclose(self) -> None:
        """Stop syncing, sign a last checkpoint and release the folder (run once no request is in flight)."""
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 60.0)
        try:
            await asyncio.to_thread(self.log.checkpoint)
        finally:
            self.log.close()
            os.close(self._lock_fd)
