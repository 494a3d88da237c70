"""What each worker tool answers, as the client reads it: frozen dataclasses over the nouns of ``swarmyard.domain``.

The server writes its answers from the pydantic models of :mod:`swarmyard.plane.models`; these mirror them field
for field (held to it by ``tests/contract/test_plane_client.py``) without importing pydantic, which the built-in
agent, started in every machine, does not load. :func:`parse` reads a JSON answer into one of them by the
dataclass's own annotations: a field of the wrong JSON type, or a missing one without a default, is a
``bad_response`` error (a key this side does not know is skipped: a newer plane may add one).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from swarmyard.domain import Artifact, Direction, Finding, Post, Task
from swarmyard.errors import SwarmyardError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The claimed task with its fencing token, or ``task`` ``None`` when nothing is claimable."""

    task: Task | None
    fencing_token: int | None
    lease_expires_at: float | None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """The lease's new expiry."""

    task_id: str
    fencing_token: int
    lease_expires_at: float


@dataclass(frozen=True, slots=True)
class BoardReadResult:
    """Posts in sequence order and the cursor to pass as ``after`` next time."""

    posts: tuple[Post, ...]
    cursor: int


@dataclass(frozen=True, slots=True)
class PostResult:
    """The post as stored."""

    post: Post


@dataclass(frozen=True, slots=True)
class FindingResult:
    """The finding as stored."""

    finding: Finding


@dataclass(frozen=True, slots=True)
class ReadFindingsResult:
    """The group's findings, the consolidations broadcast to all groups, and both cursors."""

    findings: tuple[Finding, ...]
    cursor: str | None
    broadcasts: tuple[Post, ...]
    broadcast_cursor: int


@dataclass(frozen=True, slots=True)
class DirectionMove:
    """Under ``explore``, where a scored attempt leaves its worker (``stay``, ``switch`` or ``adopt``)."""

    direction: str
    previous: str
    reason: str
    best: int | None
    stale: int
    patience: int


@dataclass(frozen=True, slots=True)
class ArtifactResult:
    """The stored artifact and, with an evaluator, its signed score (and, under ``explore``, the move)."""

    artifact: Artifact
    #: the evaluator's signed score as it gave it (its fields are the evaluator's: see :attr:`scored`)
    score: dict[str, Any] | None = None
    direction: DirectionMove | None = None

    @property
    def scored(self) -> int | None:
        """The integer score, as the plane reads it to record the score (``None``: no evaluator, or a score with
        no integer ``score``, which the plane does not record)."""
        value = None if self.score is None else self.score.get("score")
        return value if type(value) is int else None


@dataclass(frozen=True, slots=True)
class DirectionResult:
    """The direction taken (``None`` when every one asked for is held) and the group's directions."""

    direction: Direction | None
    directions: tuple[Direction, ...]


@dataclass(frozen=True, slots=True)
class DirectionsResult:
    """The group's directions with their live holders and best scores."""

    directions: tuple[Direction, ...]


@dataclass(frozen=True, slots=True)
class TaskResult:
    """One task (``delegate``: the sub-task made)."""

    task: Task


#: Each worker tool's name and the type of its answer: every tool the plane mounts under ``/v1/tools/``.
RESULTS: dict[str, type[Any]] = {
    "claim_task": ClaimResult,
    "heartbeat": HeartbeatResult,
    "board_read": BoardReadResult,
    "board_post": PostResult,
    "submit_finding": FindingResult,
    "read_findings": ReadFindingsResult,
    "submit_artifact": ArtifactResult,
    "claim_direction": DirectionResult,
    "read_directions": DirectionsResult,
    "delegate": TaskResult,
}


class _Bad(Exception):
    """A value that is not what its field says; ``where`` is the path to it."""

    def __init__(self, where: str, expected: str) -> None:
        super().__init__(f"{where or 'the answer'}: expected {expected}")


def parse(kind: type[T], data: Any) -> T:
    """``data`` (a JSON value) as ``kind``; a ``bad_response`` :class:`SwarmyardError` when it is not one."""
    try:
        return typing.cast(T, _reader(kind)(data, ""))
    except _Bad as exc:
        raise SwarmyardError.from_dict({"error": {"code": "bad_response", "retryable": False,
                                                  "message": f"the plane answered a malformed {kind.__name__}: "
                                                             f"{exc}"}}, status=502) from None


_Reader = Callable[[Any, str], Any]
_READERS: dict[Any, _Reader] = {}


def _reader(hint: Any) -> _Reader:
    """How to read a JSON value as ``hint`` (a type annotation), made once per annotation."""
    reader = _READERS.get(hint)
    if reader is None:
        reader = _READERS[hint] = _make(hint)
    return reader


def _make(hint: Any) -> _Reader:
    if hint is Any:
        return lambda value, where: value
    if hint is type(None):
        return _exact(type(None), "null")
    if hint is bool:
        return _exact(bool, "a boolean")
    if hint is int:
        return _integer
    if hint is float:
        return _number
    if hint is str:
        return _exact(str, "a string")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return _union([_reader(arg) for arg in args], " or ".join(getattr(a, "__name__", str(a)) for a in args))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _sequence(_reader(args[0]), tuple)
    if origin is list:
        return _sequence(_reader(args[0]), list)
    if origin is dict:
        return _mapping(_reader(args[1]))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _record(hint)
    raise TypeError(f"no reader for {hint!r}")


def _exact(kind: type, expected: str) -> _Reader:
    def read(value: Any, where: str) -> Any:
        if type(value) is not kind:
            raise _Bad(where, expected)
        return value
    return read


def _integer(value: Any, where: str) -> int:
    if type(value) is not int:  # never a boolean or 1.0
        raise _Bad(where, "an integer")
    return value


def _number(value: Any, where: str) -> float:
    if type(value) not in (int, float):
        raise _Bad(where, "a number")
    return float(value)


def _union(readers: list[_Reader], expected: str) -> _Reader:
    def read(value: Any, where: str) -> Any:
        for reader in readers:
            try:
                return reader(value, where)
            except _Bad:
                continue
        raise _Bad(where, expected)
    return read


def _sequence(item: _Reader, make: Callable[[Any], Any]) -> _Reader:
    def read(value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise _Bad(where, "a list")
        return make(item(v, f"{where}[{i}]") for i, v in enumerate(value))
    return read


def _mapping(item: _Reader) -> _Reader:
    def read(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _Bad(where, "an object")
        return {k: item(v, f"{where}.{k}") for k, v in value.items()}
    return read


def _enum(kind: type[Enum]) -> _Reader:
    def read(value: Any, where: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise _Bad(where, f"one of {', '.join(str(m.value) for m in kind)}") from None
    return read


def _record(kind: type) -> _Reader:
    hints = typing.get_type_hints(kind)
    fields = [(f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(kind)]

    def read(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _Bad(where, f"a {kind.__name__} object")
        given: dict[str, Any] = {}
        for name, required in fields:
            if name in value:
                given[name] = _reader(hints[name])(value[name], f"{where}.{name}" if where else name)
            elif required:
                raise _Bad(f"{where}.{name}" if where else name, "a value (it is missing)")
        return kind(**given)
    return read
