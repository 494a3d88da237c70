"""The store's tables against what the log's events say about them.

The log authenticates events, not rows: a finding's text, a task's state, a score or an artifact's blob could
be rewritten in place and every checkpoint would still verify. The events carry what the rows must be (a
finding's ``body_sha256``, a task's state as of its last event, an artifact's SHA-256 and size, every score as
recorded), so ``Ledger`` replays the checked events and ``check_tables`` compares every row of the goals, tasks,
findings, artifacts and scores tables with them (campaigns and a resumed run's holdout read the scores). A row
no event describes (one inserted by hand) fails, as does a row that differs and a row an event describes that is
gone. Other tables (directions, holds, the ledger's spend, board posts) are not checked here.

Failures are ``LogMismatchError`` with ``what`` the table's noun and ``index`` the leaf of the last event that
describes the row (-1 for a row no event describes); the reason names the row's id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarmyard.domain import Artifact, Event, Finding, Goal, PostKind, ScoreRecord, Task, TaskState
from swarmyard.errors import LogMismatchError, NotFoundError

#: The state each task event leaves its task in.
TASK_EVENTS = {
    "task.created": TaskState.PENDING,
    "task.claimed": TaskState.CLAIMED,
    "task.renewed": TaskState.CLAIMED,
    "task.released": TaskState.PENDING,
    "task.completed": TaskState.DONE,
    "task.failed": TaskState.FAILED,
    "task.cancelled": TaskState.CANCELLED,
}


class Tables(Protocol):
    """The read-only queries ``check_tables`` needs (the store has them)."""

    def list_goals(self) -> list[Goal]:
        """Every goal."""
        ...

    def list_tasks(self, goal_id: str, *, state: TaskState | None = None, group: str | None = None) -> list[Task]:
        """A goal's tasks."""
        ...

    def read_findings(self, goal_id: str, *, group: str | None = None, after: str | None = None,
                      limit: int = 100) -> list[Finding]:
        """A goal's findings in submission order."""
        ...

    def list_artifacts(self, goal_id: str) -> list[Artifact]:
        """A goal's artifact rows."""
        ...

    def list_scores(self, goal_id: str, *, split: str | None = "search") -> list[ScoreRecord]:
        """A goal's scores (every split: ``None``), oldest first."""
        ...

    def read_artifact(self, goal_id: str, sha256: str) -> bytes:
        """An artifact's bytes, checked against its hash (``NotFoundError`` when they differ)."""
        ...

    def unsequenced_events(self, limit: int = 100) -> list[Event]:
        """Events with no leaf index yet."""
        ...


@dataclass(slots=True)
class _Seen:
    """What the events said last about one row, and the leaf that said it."""

    leaf: int
    values: dict[str, Any] = field(default_factory=dict)


def _sha256(text: object) -> str | None:
    return None if text is None else hashlib.sha256(str(text).encode()).hexdigest()


@dataclass(slots=True)
class Ledger:
    """Goals, tasks, findings, artifacts and scores as the checked events describe them, built one event at a
    time."""

    goals: dict[str, _Seen] = field(default_factory=dict)
    tasks: dict[str, _Seen] = field(default_factory=dict)
    findings: dict[str, _Seen] = field(default_factory=dict)
    artifacts: dict[tuple[str, str], _Seen] = field(default_factory=dict)
    #: goal -> its scores in the order recorded (a score is never changed, only added)
    scores: dict[str, list[_Seen]] = field(default_factory=dict)

    def add(self, leaf: int, kind: str, body: dict[str, Any]) -> None:
        """Take in the event of ``kind`` at ``leaf`` (its parsed body, held to its kind by ``parse_body``)."""
        if kind == "goal.created":
            self.goals[str(body.get("goal"))] = _Seen(leaf, {"objective": body.get("objective")})
        elif kind in TASK_EVENTS:
            task = str(body.get("task"))
            seen = self.tasks.setdefault(task, _Seen(leaf, {"goal": body.get("goal")}))
            seen.leaf = leaf
            seen.values["state"] = TASK_EVENTS[kind].value
            if kind == "task.created":
                seen.values.update(title=body.get("title"), group=body.get("group"))
            elif kind == "task.completed":
                seen.values["result_sha256"] = body.get("result_sha256")
            elif kind in ("task.failed", "task.cancelled"):
                seen.values["result_sha256"] = _sha256(body.get("reason"))
        elif kind == "finding.submitted":
            self.findings[str(body.get("finding"))] = _Seen(leaf, {
                "goal": body.get("goal"), "task": body.get("task"), "author": body.get("author"),
                "body_sha256": body.get("body_sha256"), "citations": body.get("citations"),
                "status": "submitted", "score": body.get("score")})  # from its cited artifacts' scores
        elif kind == "finding.status":
            found = self.findings.get(str(body.get("finding")))
            if found is not None:
                found.leaf = leaf
                found.values.update(status=body.get("status"), score=body.get("score"))
        elif kind == "finding.scored":
            found = self.findings.get(str(body.get("finding")))
            if found is not None:
                found.leaf = leaf
                found.values["score"] = body.get("score")
        elif kind == "artifact.submitted":
            key = (str(body.get("goal")), str(body.get("sha256")))
            self.artifacts.setdefault(key, _Seen(leaf, {"task": body.get("task"), "size": body.get("size")}))
        elif kind == "score.recorded":
            self.scores.setdefault(str(body.get("goal")), []).append(_Seen(leaf, {
                name: body.get(name) for name in ("task", "worker", "group", "direction", "sha256", "split",
                                                  "score")}))


#: A board post's event body carries the post's kind under ``kind`` (its data overrides the event's): a body
#: whose kind is a post kind and that has a board ``seq`` is a ``board.posted`` event.
_POST_KINDS = frozenset(k.value for k in PostKind)


def _column_kind(body: dict[str, Any]) -> object:
    """The ``kind`` column the event with this body was written with."""
    kind = body.get("kind")
    return "board.posted" if kind in _POST_KINDS and "seq" in body else kind


def parse_body(event: Event, index: int) -> dict[str, Any]:
    """An event's body as a JSON object whose ``kind`` is the row's ``kind`` column (and whose ``at_ms``, when
    it has one, is the ``created_at`` column): those columns lie outside the hash, so they are held to it."""
    try:
        body = json.loads(event.body)
    except (UnicodeDecodeError, ValueError):
        raise LogMismatchError("event", index, "its body is not a JSON object") from None
    if not isinstance(body, dict):
        raise LogMismatchError("event", index, "its body is not a JSON object")
    if _column_kind(body) != event.kind:
        raise LogMismatchError("event", index, f"its kind column {event.kind!r} is not its body's kind "
                                               f"{body.get('kind')!r}")
    at_ms = body.get("at_ms")
    if at_ms is not None and (not isinstance(at_ms, int) or round(event.created_at * 1000) != at_ms):
        raise LogMismatchError("event", index, f"its created_at column {event.created_at!r} is not its body's "
                                               f"time (at_ms {at_ms!r})")
    return body


def _differs(what: str, row_id: str, seen: _Seen | None, values: dict[str, Any]) -> None:
    if seen is None:
        raise LogMismatchError(what, -1, f"{row_id}: no event in the log describes this row")
    for name, value in values.items():
        if name in seen.values and seen.values[name] != value:
            raise LogMismatchError(what, seen.leaf, f"{row_id}: its {name} {value!r} is not what event "
                                                    f"{seen.leaf} recorded ({seen.values[name]!r})")


def _findings(tables: Tables, goal_id: str) -> list[Finding]:
    out: list[Finding] = []
    while True:
        page = tables.read_findings(goal_id, after=out[-1].id if out else None, limit=10_000)
        out.extend(page)
        if len(page) < 10_000:
            return out


def check_tables(tables: Tables, ledger: Ledger) -> None:
    """Every goal, task, finding, artifact and score row against ``ledger``; raise at the first that differs,
    and for any row the events describe that is gone."""
    goals = tables.list_goals()
    for goal in goals:
        _differs("goal", goal.id, ledger.goals.get(goal.id), {"objective": goal.objective})
    for goal in goals:
        for task in tables.list_tasks(goal.id):
            _differs("task", task.id, ledger.tasks.get(task.id), {
                "goal": goal.id, "state": task.state.value, "title": task.title, "group": task.group,
                "result_sha256": _sha256(task.result)})
        for finding in _findings(tables, goal.id):
            citations = [c.to_dict() for c in finding.citations]
            _differs("finding", finding.id, ledger.findings.get(finding.id), {
                "goal": goal.id, "task": finding.task_id, "author": finding.author,
                "body_sha256": _sha256(finding.body), "citations": citations,
                "status": finding.status.value, "score": finding.score})
        for artifact in tables.list_artifacts(goal.id):
            seen = ledger.artifacts.get((goal.id, artifact.sha256))
            _differs("artifact", artifact.sha256, seen, {"task": artifact.task_id, "size": artifact.size})
            assert seen is not None
            try:
                tables.read_artifact(goal.id, artifact.sha256)
            except (NotFoundError, OSError):
                raise LogMismatchError("artifact", seen.leaf, f"{artifact.sha256}: its blob is missing or does "
                                                              f"not hash to its name") from None
        _scores(tables, goal.id, ledger.scores.get(goal.id, []))
    _gone("goal", ledger.goals, {g.id for g in goals})
    _gone("task", ledger.tasks, {t.id for g in goals for t in tables.list_tasks(g.id)})
    _gone("finding", ledger.findings, {f.id for g in goals for f in _findings(tables, g.id)})
    present = {(g.id, a.sha256) for g in goals for a in tables.list_artifacts(g.id)}
    for (goal_id, sha256), seen in ledger.artifacts.items():
        if (goal_id, sha256) not in present:
            raise LogMismatchError("artifact", seen.leaf, f"{sha256}: event {seen.leaf} describes it and the store "
                                                          f"has no such row")


def _scores(tables: Tables, goal_id: str, recorded: list[_Seen]) -> None:
    """The goal's score rows, in order, are exactly the scores its events recorded."""
    rows = tables.list_scores(goal_id, split=None)
    for number, row in enumerate(rows):
        row_id = f"{goal_id} score {number}"
        seen = recorded[number] if number < len(recorded) else None
        _differs("score", row_id, seen, {"task": row.task_id, "worker": row.worker_id, "group": row.group,
                                         "direction": row.direction, "sha256": row.sha256, "split": row.split,
                                         "score": row.score})
    if len(rows) < len(recorded):
        missing = recorded[len(rows)]
        raise LogMismatchError("score", missing.leaf, f"{goal_id} score {len(rows)}: event {missing.leaf} records it "
                                                      "and the store has no such row")


def _gone(what: str, seen: dict[str, _Seen], present: set[str]) -> None:
    for row_id, last in seen.items():
        if row_id not in present:
            raise LogMismatchError(what, last.leaf, f"{row_id}: event {last.leaf} describes it and the store has "
                                                    f"no such row")
