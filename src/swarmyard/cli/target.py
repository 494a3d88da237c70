"""What the read and admin commands act on: the store itself, or a running control plane's operator API.

``--server`` (a Unix socket path or an http(s) URL) plus the operator token file selects the control plane;
otherwise ``--store`` opens the store directly. Both answer the same subset of the Store protocol, so the
command modules do not care which one they were given.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import TypeAdapter

from swarmyard.domain import Goal, GoalSpec, Post, PostKind, Reservation, Task, TaskSpec, TaskState
from swarmyard.errors import SwarmyardError, UserError

T = TypeVar("T")


class Target(Protocol):
    """The part of the Store protocol the CLI uses."""

    def list_goals(self) -> list[Goal]: ...
    def get_goal(self, goal_id: str) -> Goal: ...
    def create_goal(self, spec: GoalSpec) -> Goal: ...
    def list_tasks(self, goal_id: str, *, state: TaskState | None = None,
                   group: str | None = None) -> list[Task]: ...
    def create_task(self, goal_id: str, spec: TaskSpec) -> Task: ...
    def read_board(self, goal_id: str, *, after: int = 0, limit: int = 100,
                   group: str | None = None, kinds: Sequence[PostKind] | None = None,
                   author: str | None = None) -> list[Post]: ...
    def list_reservations(self, goal_id: str) -> list[Reservation]: ...
    def reconcile(self, reservation_id: str, actual: int | None) -> Reservation: ...


def path_id(name: str, value: str) -> str:
    """``value``, checked to be an id before it goes into an operator API path (``InvalidInputError`` else): a
    '/', '?' or '#' in it would aim the request at another endpoint, so that ``swarmyard task complete
    'ID/cancel?'`` cancelled the task."""
    from swarmyard.plane.operator import check_path_id

    return check_path_id(name, value)


def operator_request(server: str, token_file: Path, method: str, path: str, *,
                     params: dict[str, Any] | None = None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One operator API call; a refusal comes back as the swarmyard error the server named."""
    from swarmyard.plane.client import PlaneAddress, decode

    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise UserError(f"cannot read the operator token at {token_file}: {exc.strerror}") from exc
    with PlaneAddress.parse(server).client(token) as http:
        try:
            response = http.request(method, path, params=params, json=body)
        except Exception as exc:  # an unreachable server is a usage problem, not a crash
            raise UserError(f"cannot reach the control plane at {server}: {exc}") from exc
    answer = decode(response)
    if response.status_code >= 400:
        # the server's own typed error, rebuilt by its code (a stale token stays a StaleFencingTokenError)
        raise SwarmyardError.from_dict(answer if isinstance(answer, dict) else {}, status=response.status_code)
    if not isinstance(answer, dict):
        raise SwarmyardError.from_dict({}, status=response.status_code)
    return answer


def _as(kind: type[T], value: Any) -> T:
    return TypeAdapter(kind).validate_python(value)


class RemoteTarget:
    """The operator API of a running control plane."""

    def __init__(self, server: str, token_file: Path) -> None:
        self.server = server
        self.token_file = token_file

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return operator_request(self.server, self.token_file, method, path, **kw)

    def list_goals(self) -> list[Goal]:
        """Every goal."""
        return _as(list[Goal], self._call("GET", "/v1/operator/goals")["goals"])

    def get_goal(self, goal_id: str) -> Goal:
        """One goal."""
        return _as(Goal, self._call("GET", f"/v1/operator/goals/{path_id('goal_id', goal_id)}")["goal"])

    def create_goal(self, spec: GoalSpec) -> Goal:
        """Create a goal."""
        body = {"objective": spec.objective, "budget_micro_usd": spec.budget_micro_usd, "call_cap": spec.call_cap,
                "deadline": spec.deadline, "max_depth": spec.max_depth, "policy": spec.policy}
        return _as(Goal, self._call("POST", "/v1/operator/goals", body=body)["goal"])

    def list_tasks(self, goal_id: str, *, state: TaskState | None = None, group: str | None = None) -> list[Task]:
        """A goal's tasks."""
        params = {k: v for k, v in (("state", state.value if state else None), ("group", group)) if v is not None}
        return _as(list[Task], self._call("GET", f"/v1/operator/goals/{path_id('goal_id', goal_id)}/tasks",
                                           params=params)["tasks"])

    def create_task(self, goal_id: str, spec: TaskSpec) -> Task:
        """Create a top-level task."""
        body = {"title": spec.title, "prompt": spec.prompt, "group": spec.group,
                "budget_micro_usd": spec.budget_micro_usd, "call_cap": spec.call_cap, "priority": spec.priority}
        return _as(Task, self._call("POST", f"/v1/operator/goals/{path_id('goal_id', goal_id)}/tasks",
                                      body=body)["task"])

    def read_board(self, goal_id: str, *, after: int = 0, limit: int = 100, group: str | None = None,
                   kinds: Sequence[PostKind] | None = None, author: str | None = None) -> list[Post]:
        """Posts after a cursor; kind and author filters apply to what the server returns."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if group is not None:
            params["group"] = group
        posts = _as(list[Post], self._call("GET", f"/v1/operator/goals/{path_id('goal_id', goal_id)}/board",
                                              params=params)["posts"])
        return [p for p in posts if (not kinds or p.kind in kinds) and (author is None or p.author == author)]

    def list_reservations(self, goal_id: str) -> list[Reservation]:
        """A goal's reservations."""
        path = f"/v1/operator/goals/{path_id('goal_id', goal_id)}/reservations"
        return _as(list[Reservation], self._call("GET", path)["reservations"])

    def reconcile(self, reservation_id: str, actual: int | None) -> Reservation:
        """Settle or release an unknown reservation."""
        path = f"/v1/operator/reservations/{path_id('reservation_id', reservation_id)}/reconcile"
        return _as(Reservation, self._call("POST", path, body={"actual_micro_usd": actual})["reservation"])


def target_at(store: str, server: str | None, token_file: Path) -> Target:
    """The control plane when ``--server`` was given, else the store."""
    if server:
        return RemoteTarget(server, token_file)
    from swarmyard.store import open_store

    return open_store(store)
