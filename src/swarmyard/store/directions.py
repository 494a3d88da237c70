"""The store's part of the ``explore`` policy: directions held like tasks, and the evaluator's scores.

A direction is a row per (goal, group, name). Taking one is one conditional statement
(``UPDATE ... WHERE name = (the first free one asked for) AND nobody holds it ... RETURNING``), inside the
transaction that checks the caller's fencing token: never a read then a write, so two workers racing for one
direction get one row back between them on both engines (PostgreSQL picks with ``FOR UPDATE SKIP LOCKED`` and
re-checks the condition on the row version it locks). A hold
carries the expiry of the task's lease it was taken under: the store's ``renew`` extends it and ``release``,
``complete`` and ``fail`` drop it in their own transactions, so "held" means "held by a live claim".

Scores are recorded once per evaluated artifact, attributed to the artifact's task, worker, group and the
direction that task held when it was scored, so policies rank by ``best_scores(goal, by=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from swarmyard.domain import Direction, ExploreSettings, ScoreRecord, Task
from swarmyard.errors import InvalidInputError, NotFoundError
from swarmyard.store.engine import Cursor, Engine

#: What ``best_scores`` groups by, and the column it reads.
ScoreKey = Literal["worker", "direction", "group", "task"]
_KEY_COLUMNS: dict[str, str] = {"worker": "worker_id", "direction": "direction", "group": "group_name",
                                "task": "task_id"}
_NAME_LIMIT = 200
_SPLIT = "search"

_ON_DIRECTION = ("FROM scores s WHERE s.goal_id = d.goal_id AND s.group_name = d.group_name AND s.direction = d.name "
                 f"AND s.split = '{_SPLIT}'")
_DIRECTION_COLS = ("d.goal_id, d.group_name, d.name, d.offered, d.holder, d.task_id, d.taken_at, d.held_until, "
                   f"(SELECT MAX(s.score) {_ON_DIRECTION}), (SELECT COUNT(*) {_ON_DIRECTION})")
_SCORE_COLS = "goal_id, task_id, worker_id, group_name, direction, sha256, split, score, created_at"


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{field} must be a non-empty string", field=field)
    if len(value.encode()) > _NAME_LIMIT or "\x00" in value:
        raise InvalidInputError(f"{field} must be at most {_NAME_LIMIT} bytes, without NUL", field=field)
    return value.strip()


def _score(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**62) <= value <= 2**62:
        # the value is not echoed: a score comes from scoring code a worker may steer, and errors reach workers
        raise InvalidInputError("score must be an integer within +-2**62", field="score")
    return value


def _direction(row: Sequence[Any], now: float) -> Direction:
    goal_id, group, name, offered, holder, task_id, taken_at, held_until, best, attempts = row
    live = held_until is not None and held_until > now
    # taken_at outlives the hold (a release drops only held_until): set once any claim has taken the direction
    return Direction(str(goal_id), str(group), str(name), bool(offered), str(holder) if live else None,
                     str(task_id) if live else None, float(taken_at) if live else None,
                     None if best is None else int(best), taken=taken_at is not None, attempts=int(attempts))


def _score_row(row: Sequence[Any]) -> ScoreRecord:
    goal_id, task_id, worker_id, group, direction, sha, split, score, at = row
    return ScoreRecord(str(goal_id), str(task_id), str(worker_id), str(group),
                       None if direction is None else str(direction), str(sha), str(split), int(score), float(at))


class DirectionStore:
    """Directions and scores; mixed into ``SqlStore``, whose plumbing (engine, clock, fence, events) it uses."""

    _e: Engine

    def _now(self) -> float:
        raise NotImplementedError

    def _fence(self, cur: Cursor, task_id: str, token: object, now: float) -> Task:
        raise NotImplementedError

    def _task_row(self, cur: Cursor, task_id: str, *, lock: bool = False) -> Task:
        raise NotImplementedError

    @staticmethod
    def _event(cur: Cursor, kind: str, now: float, data: dict[str, Any]) -> None:
        raise NotImplementedError

    @staticmethod
    def _one(cur: Cursor, sql: str, params: Sequence[Any]) -> Any:
        raise NotImplementedError

    # -- settings and offers --------------------------------------------------------------------------------
    def offer_directions(self, goal_id: str, group: str, names: Sequence[str], *, patience: int,
                         adopt_margin: int) -> ExploreSettings:
        """Set the group's ``explore`` settings and list its offered directions (both idempotent)."""
        group = _name(group, "group")
        offered = list(dict.fromkeys(_name(n, "directions") for n in names))
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise InvalidInputError("patience must be a whole number of attempts, 1 or more", field="patience")
        if isinstance(adopt_margin, bool) or not isinstance(adopt_margin, int) or adopt_margin < 0:
            raise InvalidInputError("adopt_margin must be a whole number, 0 or more", field="adopt_margin")
        now = self._now()
        with self._e.write() as cur:
            if self._one(cur, "SELECT 1 FROM goals WHERE id = ?", (goal_id,)) is None:
                raise NotFoundError("goal", goal_id)
            cur.execute("INSERT INTO explore_settings (goal_id, group_name, patience, adopt_margin) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (goal_id, group_name) DO UPDATE SET patience = excluded.patience, "
                        "adopt_margin = excluded.adopt_margin", (goal_id, group, patience, adopt_margin))
            for ordinal, name in enumerate(offered):
                cur.execute("INSERT INTO directions (goal_id, group_name, name, offered, ordinal, created_at) "
                            "VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT (goal_id, group_name, name) DO UPDATE SET "
                            "offered = 1, ordinal = excluded.ordinal", (goal_id, group, name, ordinal, now))
            self._event(cur, "directions.offered", now, {"goal": goal_id, "group": group, "directions": offered,
                                                          "patience": patience, "adopt_margin": adopt_margin})
        return ExploreSettings(goal_id, group, patience, adopt_margin)

    def explore_settings(self, goal_id: str, group: str) -> ExploreSettings | None:
        """The group's ``explore`` settings, or ``None`` when the group does not explore."""
        with self._e.read() as cur:
            row = self._one(cur, "SELECT patience, adopt_margin FROM explore_settings WHERE goal_id = ? AND "
                                 "group_name = ?", (goal_id, group))
        return None if row is None else ExploreSettings(goal_id, group, int(row[0]), int(row[1]))

    def list_directions(self, goal_id: str, group: str | None = None) -> list[Direction]:
        """The goal's directions (of ``group``), offered ones first in the order given, then by name."""
        sql, params = f"SELECT {_DIRECTION_COLS} FROM directions d WHERE d.goal_id = ?", [goal_id]
        if group is not None:
            sql += " AND d.group_name = ?"
            params.append(group)
        now = self._now()
        with self._e.read() as cur:
            cur.execute(sql + " ORDER BY d.group_name, d.offered DESC, d.ordinal, d.created_at, d.name", params)
            return [_direction(r, now) for r in cur.fetchall()]

    # -- holds ----------------------------------------------------------------------------------------------
    def claim_direction(self, task_id: str, token: int, names: Sequence[str], *, author: str) -> Direction | None:
        """Take the first of ``names`` that no live claim holds, under the caller's claim; ``None`` when every
        one is held. Taking one drops the caller's other hold; a name the caller holds already is kept.

        Where the group has offered directions, only those may be taken (``InvalidInputError`` otherwise).
        """
        wanted = list(dict.fromkeys(_name(n, "direction") for n in names))
        if not wanted:
            raise InvalidInputError("name at least one direction to take", field="direction")
        author = _name(author, "author")
        now = self._now()
        with self._e.write() as cur:
            task = self._fence(cur, task_id, token, now)
            cur.execute("SELECT name FROM directions WHERE goal_id = ? AND group_name = ? AND offered = 1",
                        (task.goal_id, task.group))
            offered = {str(r[0]) for r in cur.fetchall()}
            unknown = [n for n in wanted if offered and n not in offered]
            if unknown:
                raise InvalidInputError(f"{unknown[0]!r} is not a direction of this goal; offered: "
                                        f"{', '.join(sorted(offered))}", field="direction")
            if not offered:
                # names a worker gives are rows like offered ones; in one order, so two inserts never deadlock
                for name in sorted(wanted):
                    cur.execute("INSERT INTO directions (goal_id, group_name, name, offered, created_at) "
                                "VALUES (?, ?, ?, 0, ?) ON CONFLICT (goal_id, group_name, name) DO NOTHING",
                                (task.goal_id, task.group, name, now))
            free = ("(held_until IS NULL OR held_until <= ? OR (task_id = ? AND fencing_token = ?))")
            rank = "CASE name " + " ".join(f"WHEN ? THEN {i}" for i in range(len(wanted))) + " END"
            marks = ", ".join("?" for _ in wanted)
            # The first free name in the caller's order, picked and taken in one statement. PostgreSQL skips a row
            # another claim has locked (it is being taken, or is held) instead of waiting on it: waiting there is
            # how two claims that want the same names in different orders deadlock.
            skip = " FOR UPDATE SKIP LOCKED" if self._e.postgres else ""
            pick = (f"SELECT name FROM directions WHERE goal_id = ? AND group_name = ? AND name IN ({marks}) AND "
                    f"{free} ORDER BY {rank} LIMIT 1{skip}")
            row = self._one(
                cur,
                f"UPDATE directions SET holder = ?, task_id = ?, fencing_token = ?, held_until = ?, "
                f"taken_at = CASE WHEN task_id = ? AND fencing_token = ? AND held_until > ? THEN taken_at ELSE ? END "
                f"WHERE goal_id = ? AND group_name = ? AND name = ({pick}) AND {free} RETURNING name",
                (author, task_id, token, task.lease_expires_at, task_id, token, now, now,
                 task.goal_id, task.group, task.goal_id, task.group, *wanted, now, task_id, token, *wanted,
                 now, task_id, token))
            if row is None:
                return None
            name = str(row[0])
            cur.execute("UPDATE directions SET held_until = NULL WHERE task_id = ? AND fencing_token = ? "
                        "AND name <> ? AND held_until IS NOT NULL", (task_id, token, name))
            self._event(cur, "direction.claimed", now, {"goal": task.goal_id, "group": task.group,
                                                         "direction": name, "task": task_id, "token": token,
                                                         "worker": author})
            found = self._one(cur, f"SELECT {_DIRECTION_COLS} FROM directions d WHERE d.goal_id = ? AND "
                                   "d.group_name = ? AND d.name = ?", (task.goal_id, task.group, name))
            return _direction(found, now)

    def follow_claim(self, cur: Cursor, task_id: str, token: int, held_until: float | None) -> None:
        """Carry a claim's change to the directions it holds: a renewal's new expiry, or ``None`` (released,
        completed, failed): called inside the store's own claim update."""
        cur.execute("UPDATE directions SET held_until = ? WHERE task_id = ? AND fencing_token = ? AND held_until "
                    "IS NOT NULL", (held_until, task_id, token))

    # -- scores ---------------------------------------------------------------------------------------------
    def record_score(self, goal_id: str, sha256: str, score: int, *, split: str = _SPLIT,
                     task_id: str | None = None, worker_id: str | None = None) -> ScoreRecord:
        """Record the evaluator's score of an artifact of the goal, attributed to the task and worker that
        submitted it (``task_id``, ``worker_id``: a content-addressed artifact may have been stored first by
        another; by default the artifact's own), their group and the direction that task holds now (if any)."""
        score = _score(score)
        split = _name(split, "split")
        if (task_id is None) != (worker_id is None):
            raise InvalidInputError("name both the task and the worker an attempt is scored for, or neither",
                                    field="task_id")
        now = self._now()
        with self._e.write() as cur:
            row = self._one(cur, "SELECT task_id, author FROM artifacts WHERE goal_id = ? AND sha256 = ?",
                            (goal_id, sha256))
            if row is None:
                raise NotFoundError("artifact", str(sha256))
            task = self._task_row(cur, task_id or str(row[0]))
            if task.goal_id != goal_id:
                raise InvalidInputError(f"task {task.id} is not of goal {goal_id}", field="task_id")
            held = self._one(cur, "SELECT name FROM directions WHERE goal_id = ? AND group_name = ? AND task_id = ? "
                                  "AND held_until > ? ORDER BY taken_at DESC LIMIT 1",
                             (goal_id, task.group, task.id, now))
            record = ScoreRecord(goal_id, task.id, worker_id or str(row[1]), task.group,
                                 None if held is None else str(held[0]),
                                 sha256, split, score, now)
            cur.execute(f"INSERT INTO scores ({_SCORE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (record.goal_id, record.task_id, record.worker_id, record.group, record.direction,
                         record.sha256, record.split, record.score, now))
            self._event(cur, "score.recorded", now, {"goal": goal_id, "task": task.id, "worker": record.worker_id,
                                                      "group": task.group, "direction": record.direction,
                                                      "sha256": sha256, "split": split, "score": score})
            if split == _SPLIT:
                # a finding that cited the artifact before it was scored takes the score too (its best)
                cur.execute("UPDATE findings SET score = ? WHERE goal_id = ? AND citations LIKE ? AND "
                            "(score IS NULL OR score < ?) RETURNING id",
                            (score, goal_id, f'%"kind":"artifact","ref":"{sha256}"%', score))
                for (finding_id,) in cur.fetchall():
                    self._event(cur, "finding.scored", now, {"goal": goal_id, "finding": str(finding_id),
                                                              "sha256": sha256, "score": score})
            return record

    def list_scores(self, goal_id: str, *, worker_id: str | None = None, task_id: str | None = None,
                    split: str | None = _SPLIT) -> list[ScoreRecord]:
        """The goal's scores on ``split`` (every split: ``None``), oldest first (of one worker, or one task)."""
        sql, params = f"SELECT {_SCORE_COLS} FROM scores WHERE goal_id = ?", [goal_id]
        if split is not None:
            sql += " AND split = ?"
            params.append(split)
        if worker_id is not None:
            sql += " AND worker_id = ?"
            params.append(worker_id)
        if task_id is not None:
            sql += " AND task_id = ?"
            params.append(task_id)
        with self._e.read() as cur:
            cur.execute(sql + " ORDER BY n", params)
            return [_score_row(r) for r in cur.fetchall()]

    def best_scores(self, goal_id: str, *, by: ScoreKey, group: str | None = None,
                    split: str = _SPLIT) -> dict[str, int]:
        """The best score on ``split`` per worker, direction, group or task of the goal (of ``group``)."""
        column = _KEY_COLUMNS.get(by)
        if column is None:
            raise InvalidInputError(f"by must be one of {', '.join(_KEY_COLUMNS)}, got {by!r}", field="by")
        sql = f"SELECT {column}, MAX(score) FROM scores WHERE goal_id = ? AND split = ? AND {column} IS NOT NULL"
        params: list[Any] = [goal_id, split]
        if group is not None:
            sql += " AND group_name = ?"
            params.append(group)
        with self._e.read() as cur:
            cur.execute(sql + f" GROUP BY {column}", params)
            return {str(key): int(best) for key, best in cur.fetchall()}
