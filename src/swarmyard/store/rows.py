"""Column lists and row-to-domain conversions shared by both engines."""

from __future__ import annotations

import json
from typing import Any

from swarmyard.domain import (
    Artifact,
    Citation,
    CitationKind,
    Envelope,
    Event,
    Finding,
    FindingStatus,
    Goal,
    Post,
    PostKind,
    Reservation,
    ReservationState,
    Task,
    TaskState,
    Worker,
)
from swarmyard.errors import LogMismatchError

Row = tuple[Any, ...]

GOAL_COLS = ("id, objective, budget, call_cap, deadline, max_depth, policy, evaluator, created_at, "
             "reserved, settled, calls")
TASK_COLS = ("id, goal_id, parent_id, depth, group_name, title, prompt, state, revision, fencing_token, "
             "worker_id, lease_expires_at, attempts, result, created_at, budget, reserved, settled, call_cap, calls")
POST_COLS = "goal_id, seq, kind, group_name, author, task_id, fencing_token, body, created_at"
ARTIFACT_COLS = "sha256, goal_id, task_id, size, media_type, author, created_at"
FINDING_COLS = "id, goal_id, task_id, group_name, author, title, body, citations, status, score, created_at"
RESERVATION_COLS = ("id, goal_id, task_id, model, amount, actual, state, method, created_at, updated_at, overage, "
                    "input_tokens, output_tokens, worker_id")
WORKER_COLS = "id, goal_id, group_name, token_hash, expires_at, revoked, created_at"
EVENT_COLS = "id, leaf_index, kind, body, created_at"


# Value -> member by dict: ``PostKind(value)`` goes through EnumType.__call__, which was a third of the CPU of
# turning a page of board posts into Posts (``swarmyard bench plane`` reads pages of 20 on every other call).
_POST_KINDS = {k.value: k for k in PostKind}
_TASK_STATES = {s.value: s for s in TaskState}


def goal(r: Row) -> Goal:
    """A ``goals`` row as a Goal."""
    return Goal(id=r[0], objective=r[1], budget_micro_usd=r[2], call_cap=r[3], deadline=r[4], max_depth=r[5],
                policy=r[6], evaluator=r[7], created_at=r[8],
                envelope=Envelope(limit=r[2], reserved=r[9], settled=r[10], call_cap=r[3], calls=r[11]))


def task(r: Row) -> Task:
    """A ``tasks`` row as a Task."""
    return Task(id=r[0], goal_id=r[1], parent_id=r[2], depth=r[3], group=r[4], title=r[5], prompt=r[6],
                state=_TASK_STATES[r[7]], revision=r[8], fencing_token=r[9], worker_id=r[10], lease_expires_at=r[11],
                attempts=r[12], result=r[13], created_at=r[14],
                envelope=Envelope(limit=r[15], reserved=r[16], settled=r[17], call_cap=r[18], calls=r[19]))


def post(r: Row) -> Post:
    """A ``posts`` row as a Post."""
    return Post(goal_id=r[0], seq=r[1], kind=_POST_KINDS[r[2]], group=r[3], author=r[4], task_id=r[5],
                fencing_token=r[6], body=r[7], created_at=r[8])


def artifact(r: Row) -> Artifact:
    """An ``artifacts`` row as an Artifact."""
    return Artifact(sha256=r[0], goal_id=r[1], task_id=r[2], size=r[3], media_type=r[4], author=r[5],
                    created_at=r[6])


def citations_json(citations: tuple[Citation, ...] | list[Citation]) -> str:
    """Citations as stored: a JSON list of ``{"kind", "ref"}`` (and ``"quote"`` for a source line)."""
    return json.dumps([c.to_dict() for c in citations], separators=(",", ":"))


def finding(r: Row) -> Finding:
    """A ``findings`` row as a Finding."""
    cites = tuple(Citation(CitationKind(c["kind"]), c["ref"], c.get("quote", "")) for c in json.loads(r[7]))
    return Finding(id=r[0], goal_id=r[1], task_id=r[2], group=r[3], author=r[4], title=r[5], body=r[6],
                   citations=cites, status=FindingStatus(r[8]), score=r[9], created_at=r[10])


def reservation(r: Row) -> Reservation:
    """A ``reservations`` row as a Reservation."""
    return Reservation(id=r[0], goal_id=r[1], task_id=r[2], model=r[3], amount=r[4], actual=r[5],
                       state=ReservationState(r[6]), method=r[7], created_at=r[8], updated_at=r[9], overage=r[10],
                       input_tokens=r[11], output_tokens=r[12], worker_id=r[13])


def worker(r: Row) -> Worker:
    """A ``workers`` row as a Worker."""
    return Worker(id=r[0], goal_id=r[1], group=r[2], token_hash=r[3], expires_at=r[4], revoked=bool(r[5]),
                  created_at=r[6])


def event(r: Row) -> Event:
    """An ``events`` row as an Event; a body the store did not write as bytes is a ``LogMismatchError``.

    The store writes every body as bytes (BLOB, bytea). SQLite keeps whatever type an UPDATE gives it, so a
    body rewritten as text reads back as ``str``: that row is not what the log hashed, and is named as such
    rather than decoded into something that might hash the same.
    """
    body = r[3]
    if not isinstance(body, bytes | bytearray | memoryview):
        where = -1 if r[1] is None else int(r[1])
        stored = "text" if isinstance(body, str) else type(body).__name__
        raise LogMismatchError("event", where, f"its body is stored as {stored}, not bytes")
    return Event(id=r[0], leaf_index=r[1], kind=r[2], body=bytes(body), created_at=r[4])
