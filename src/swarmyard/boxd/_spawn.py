"""Machines that make machines: the ``/v1/machines`` routes a ``Boxd`` client serves on its embedded plane.

A machine created with ``spawn=True`` is a coordinator: its worker token is also a capability to create, exec in,
fork and delete machines of its own (its siblings, made by the same client, logged in under the same goal, so
their model calls count against the goal's budget and they against the client's machine cap), at most
``spawn_cap`` alive at once. It sees and touches only the machines it made (any other is ``not_found``, as a
machine that does not exist is: no oracle of the client's other machines); they are deleted with it. Inside it,
``Boxd()`` finds ``SWARMYARD_BOXD_URL`` (the relay) and its token in its environment and needs no configuration.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swarmyard.errors import (
    ForbiddenError,
    InvalidInputError,
    InvalidTokenError,
    NotFoundError,
    SwarmyardError,
)
from swarmyard.plane.limits import read_limited

if TYPE_CHECKING:
    from swarmyard.boxd._client import Boxd

#: The largest body a coordinator may send (an upload): 64 MiB.
MAX_BODY_BYTES = 64 << 20


def _machine_json(record: Any) -> dict[str, Any]:
    data = asdict(record)
    data["created_at"] = record.created_at.timestamp()
    return data


class Spawners:
    """Which machines are coordinators (by token) and which machines each has made."""

    def __init__(self, client: Boxd, cap: int) -> None:
        self._client = client
        self.cap = cap
        self._tokens: dict[str, str] = {}  # token -> the coordinator's machine id
        self.children: dict[str, list[str]] = {}
        # creates under way, by coordinator: a slot is taken before the machine exists, so concurrent creates
        # cannot all pass the cap
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, machine_id: str, token: str) -> None:
        """Let the machine holding ``token`` spawn."""
        with self._lock:
            self._tokens[token] = machine_id
            self.children[machine_id] = []
            self._pending[machine_id] = 0

    def forget(self, machine_id: str) -> list[str]:
        """Drop a coordinator (a create of its still under way is undone when it ends, see ``adopt``); returns the
        machines it made that still live."""
        with self._lock:
            for token, owner in list(self._tokens.items()):
                if owner == machine_id:
                    del self._tokens[token]
            self._pending.pop(machine_id, None)
            return self.children.pop(machine_id, [])

    def disown(self, machine_id: str) -> None:
        """A machine was deleted: it is no coordinator's child any more."""
        with self._lock:
            for children in self.children.values():
                if machine_id in children:
                    children.remove(machine_id)

    def owner(self, request: Request) -> str:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip()
        for known, machine_id in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return machine_id
        raise InvalidTokenError("this token may not make machines (create the machine with spawn=True)")

    def made(self, owner: str) -> list[str]:
        """The ids of the machines ``owner`` made that live."""
        with self._lock:
            return list(self.children.get(owner, []))

    def child(self, owner: str, machine: str) -> str:
        """The id of the machine ``machine`` (id or name) among those ``owner`` made."""
        machines = self._client._local
        with self._lock:
            made = list(self.children.get(owner, []))
        for machine_id in made:
            try:
                info = machines._info(machine_id)
            except NotFoundError:
                continue  # gone another way (the client closing): not this machine's business
            if machine in (info.id, info.name):
                return info.id
        # the same answer as for a machine that does not exist: a coordinator learns nothing of the others
        raise NotFoundError("machine", machine)

    def reserve(self, owner: str) -> None:
        """Take one of ``owner``'s slots for a machine about to be made (``adopt`` or ``unreserve`` it after)."""
        with self._lock:
            if owner not in self._pending:
                raise NotFoundError("machine", owner)
            if len(self.children[owner]) + self._pending[owner] >= self.cap:
                raise ForbiddenError(f"this machine has {self.cap} machines alive or being made already: its "
                                     "spawn cap")
            self._pending[owner] += 1

    def unreserve(self, owner: str) -> None:
        """A reserved slot's create failed."""
        with self._lock:
            if owner in self._pending:
                self._pending[owner] -= 1

    def adopt(self, owner: str, machine_id: str) -> bool:
        """Count the machine made in a reserved slot as ``owner``'s; ``False`` when ``owner`` was deleted
        meanwhile (the caller deletes the machine: nothing a coordinator made outlives it)."""
        with self._lock:
            if owner not in self._pending:
                return False
            self._pending[owner] -= 1
            self.children[owner].append(machine_id)
            return True


def routes(client: Boxd, spawners: Spawners) -> list[Route]:
    """The ``/v1/machines`` routes, each run in a worker thread (the calls block)."""

    def handler(work: Callable[[Request, str, Any], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                owner = spawners.owner(request)
                raw = await read_limited(request.stream(), request.headers.get("content-length"), MAX_BODY_BYTES)
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise InvalidInputError("the body must be a JSON object", field="body")
                answer = await asyncio.to_thread(work, request, owner, body)
            except SwarmyardError as exc:
                return JSONResponse(exc.to_dict(), status_code=exc.status)
            except (ValueError, TypeError) as exc:
                error = InvalidInputError(f"bad request: {exc}")
                return JSONResponse(error.to_dict(), status_code=error.status)
            return JSONResponse(answer)

        return endpoint

    machines = client._local

    def made(owner: str, make: Callable[[], Any]) -> Any:
        spawners.reserve(owner)
        try:
            record = make()
        except BaseException:
            spawners.unreserve(owner)
            raise
        if not spawners.adopt(owner, record.id):
            machines.delete(record.id)
            raise NotFoundError("machine", owner)
        return _machine_json(record)

    def create(request: Request, owner: str, body: dict[str, Any]) -> Any:
        name, snapshot = _opt_str(body, "name"), _opt_str(body, "from_snapshot")
        return made(owner, lambda: machines.create(name, from_snapshot=snapshot))

    def listing(request: Request, owner: str, body: dict[str, Any]) -> Any:
        return [_machine_json(machines.get(m)) for m in spawners.made(owner)]

    def get(request: Request, owner: str, body: dict[str, Any]) -> Any:
        return _machine_json(machines.get(spawners.child(owner, request.path_params["machine"])))

    def wait(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        return _machine_json(machines.wait_until_ready(machine, float(body.get("timeout", 180.0))))

    def execute(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        command = body.get("command")
        stdin = body.get("stdin_b64")
        env = body.get("env")
        if env is not None and not isinstance(env, dict):
            raise InvalidInputError("env must be an object", field="env")
        timeout = body.get("timeout")
        result = machines.exec(machine, command if isinstance(command, str | list) else "",
                               env=env, cwd=_opt_str(body, "cwd"),
                               timeout=None if timeout is None else float(timeout),
                               stdin=None if stdin is None else base64.b64decode(stdin))
        return {"stdout_b64": base64.b64encode(result.stdout_raw).decode(),
                "stderr_b64": base64.b64encode(result.stderr_raw).decode(), "exit_code": result.exit_code,
                "timed_out": result.timed_out, "duration_s": result.duration_s, "truncated": result.truncated}

    def fork(request: Request, owner: str, body: dict[str, Any]) -> Any:
        source, name = spawners.child(owner, request.path_params["machine"]), _opt_str(body, "new_name")
        return made(owner, lambda: machines.fork(source, name))

    def delete(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        machines.delete(machine)  # which disowns it
        return {"deleted": machine}

    def upload(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        data = base64.b64decode(str(body.get("data_b64", "")))
        return {"written": machines.files.upload(machine, str(body.get("path", "")), data)}

    def download(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        data = machines.files.download(machine, str(body.get("path", "")))
        return {"data_b64": base64.b64encode(data).decode()}

    at = "/v1/machines/{machine}"
    return [
        Route("/v1/machines", handler(create), methods=["POST"]),
        Route("/v1/machines", handler(listing), methods=["GET"]),
        Route(at, handler(get), methods=["GET"]),
        Route(at, handler(delete), methods=["DELETE"]),
        Route(f"{at}/wait", handler(wait), methods=["POST"]),
        Route(f"{at}/exec", handler(execute), methods=["POST"]),
        Route(f"{at}/fork", handler(fork), methods=["POST"]),
        Route(f"{at}/upload", handler(upload), methods=["POST"]),
        Route(f"{at}/download", handler(download), methods=["POST"]),
    ]


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{key} must be a string", field=key)
    return value
