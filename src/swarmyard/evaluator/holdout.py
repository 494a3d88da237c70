"""The one-shot holdout ledger: the goals that used their final holdout, in the evaluator's own SQLite file.

A goal is claimed (one ``INSERT`` on a primary key, committed and synced) *before* its artifact is scored, so
two concurrent calls cannot both win, and a crash or a failing scoring run still counts as the goal's one
shot: the holdout never answers twice, whatever happens between the claim and the reply.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from swarmyard.errors import HoldoutUsedError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS holdout_used (
    goal TEXT PRIMARY KEY,
    artifact_sha256 TEXT NOT NULL,
    claimed_at INTEGER NOT NULL,
    score INTEGER,
    outcome TEXT NOT NULL DEFAULT 'running'
)
"""


class HoldoutLedger:
    """Records each goal's single use of the holdout split."""

    def __init__(self, path: Path) -> None:
        # one connection guarded by a lock: the server calls in from worker threads
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")  # the claim must survive a power cut
            self._conn.execute(_SCHEMA)

    def claim(self, goal: str, artifact_sha256: str, now_ms: int) -> None:
        """Mark ``goal`` as used; raise ``HoldoutUsedError`` if it already was."""
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO holdout_used (goal, artifact_sha256, claimed_at) VALUES (?, ?, ?)",
                    (goal, artifact_sha256, now_ms))
            except sqlite3.IntegrityError as exc:
                raise HoldoutUsedError(goal) from exc

    def record(self, goal: str, outcome: str, score: int | None) -> None:
        """Store how the claimed run ended (``scored`` or an error code), for operators."""
        with self._lock:
            self._conn.execute("UPDATE holdout_used SET outcome = ?, score = ? WHERE goal = ?",
                               (outcome, score, goal))

    def is_used(self, goal: str) -> bool:
        """Whether ``goal`` has used its holdout."""
        with self._lock:
            row = self._conn.execute("SELECT 1 FROM holdout_used WHERE goal = ?", (goal,)).fetchone()
        return row is not None

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()
