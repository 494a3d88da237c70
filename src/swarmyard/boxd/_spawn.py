"""Machines that make machines: the ``/v1/machines`` routes a ``Boxd`` client serves on its embedded plane.

A machine created with ``spawn=True`` is a coordinator: its worker token is also a capability to create, exec in,
fork and delete machines of its own (its siblings, made by the same client, logged in under the same goal, so
their model calls count against the goal's budget and they against the client's machine cap), at most
``spawn_cap`` alive at once. It names them in a namespace of its own (the client calls its ``scout`` machine
``coordinator.scout``), and sees and touches only them: any other is ``not_found``, as a machine that does not
exist is, and a name it picks is free whatever the others are called, so nothing it asks tells it what else the
client runs. They are deleted with it. Snapshots the same way: it starts machines from ``NAME`` only when its
client made the snapshot ``coordinator.NAME``; the client's others, the host operator's and other clients' are
``not_found`` (see :mod:`swarmyard.machines.snapshots`). Every route answers bad input with a 4xx and changes
nothing: numbers are range-checked before use, an exec request is bounded, and what the machine refuses (a file
that is not a regular one it may read, a command it cannot run) is the caller's error. The routes hold at most
``MAX_BODIES_BYTES`` of request bodies at once, over all coordinators: a request past that is refused unread, 503
``machines_busy`` (retryable), so concurrent uploads cannot grow the client's process without bound. Inside it,
``Boxd()`` finds ``SWARMYARD_BOXD_URL`` (the relay) and its token in its environment and needs no configuration.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swarmyard.errors import (
    ForbiddenError,
    InvalidInputError,
    InvalidTokenError,
    MachinesBusyError,
    NotFoundError,
    SwarmyardError,
)
from swarmyard.jsondepth import check_nesting
from swarmyard.plane.limits import read_limited

if TYPE_CHECKING:
    from swarmyard.boxd._client import Boxd

#: The largest body a coordinator may send (an upload): 64 MiB.
MAX_BODY_BYTES = 64 << 20
#: The most request body bytes the machines routes of one client hold at once, over all its coordinators: a body is
#: read whole, parsed and decoded (about three times its size in memory), so this bounds what concurrent uploads
#: cost the client's process whatever their number. Past it a request is refused unread, 503 ``machines_busy``.
MAX_BODIES_BYTES = 2 * MAX_BODY_BYTES


class BodyBudget:
    """The request body bytes held at once, up to ``budget_bytes``: a request takes its declared length (the
    largest body when it is chunked and so declares none) before it is read and gives it back when it is answered."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._held = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, declared: str | None, *, chunked: bool) -> Iterator[None]:
        """Hold room for a body declared ``declared`` bytes long (a request with neither a length nor a chunked
        body has none) while the request is served; refuse it (raise ``MachinesBusyError``) when the others hold
        too much."""
        if declared is not None and declared.isdigit():
            size = min(int(declared), MAX_BODY_BYTES)
        else:
            size = MAX_BODY_BYTES if chunked or declared is not None else 0
        with self._lock:
            if self._held + size > self.budget_bytes:
                raise MachinesBusyError(f"the machines calls hold {self.budget_bytes} bytes of request bodies "
                                        "already: retry when some are answered", budget_bytes=self.budget_bytes)
            self._held += size
        try:
            yield
        finally:
            with self._lock:
                self._held -= size


def _machine_json(record: Any, prefix: str) -> dict[str, Any]:
    """A machine as its coordinator sees it: named in its own namespace (without ``prefix``)."""
    data = asdict(record)
    data["created_at"] = record.created_at.timestamp()
    data["name"] = record.name.removeprefix(prefix)
    if data.get("source") and data["source"]["kind"] in ("fork", "snapshot"):
        data["source"]["name"] = data["source"]["name"].removeprefix(prefix)
    return data


#: A name a coordinator gives (before its namespace's prefix), as the machines API checks whole names.
_LOCAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
#: The longest machine name (see ``swarmyard.machines.api``).
_MAX_NAME = 63


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
        # the names a coordinator's request is making right now, with the thread making each (see check_name)
        self._making: dict[str, int] = {}
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

    def prefix(self, owner: str) -> str:
        """How the names of the machines ``owner`` makes begin at the client: its own name and a dot. Each
        coordinator names its machines in a namespace of its own, so a name it picks is free whatever the client's
        other machines are called, and a create tells it nothing of them."""
        return f"{self._client._local._info(owner).name}."

    def qualified(self, owner: str, name: str | None) -> str:
        """The client's name for the machine ``owner`` calls ``name`` (a fresh one when ``None``)."""
        prefix = self.prefix(owner)
        name = self._client._local.suggest_name() if name is None else name
        if not _LOCAL_NAME.match(name) or len(prefix) + len(name) > _MAX_NAME:
            raise InvalidInputError(f"the name of a machine this one makes is 1-{_MAX_NAME - len(prefix)} letters, "
                                    "digits, '.', '_' or '-', starting with a letter or digit", field="name")
        return prefix + name

    def check_name(self, name: str, *, spawn: bool) -> None:
        """Refuse a name the client gives that lies in a live coordinator's namespace (``lead.scout`` is
        ``lead``'s ``scout``), and a coordinator whose namespace already holds a machine of the client: either way
        a coordinator would find a name of its own taken and so learn of a machine it may not see. The names a
        coordinator's own request makes (in this thread) pass."""
        machines = self._client._local
        with self._lock:
            if self._making.get(name) == threading.get_ident():
                return
            owners = list(self.children)
        for owner in owners:
            try:
                prefix = self.prefix(owner)
            except NotFoundError:
                continue  # being deleted
            if name.startswith(prefix):
                raise InvalidInputError(f"machine names that begin with {prefix!r} are those the coordinator "
                                        f"{prefix[:-1]!r} makes", field="name")
        if spawn:
            taken = [m.name for m in machines.list() if m.name.startswith(f"{name}.")]
            if taken:
                raise InvalidInputError(f"a coordinator named {name!r} names its machines {name}.<name>, and "
                                        f"{taken[0]!r} exists already", field="name")

    @contextlib.contextmanager
    def making(self, name: str) -> Iterator[None]:
        """While a coordinator's request makes the machine the client calls ``name`` (see ``check_name``)."""
        with self._lock:
            self._making[name] = threading.get_ident()
        try:
            yield
        finally:
            with self._lock:
                self._making.pop(name, None)

    def made(self, owner: str) -> list[str]:
        """The ids of the machines ``owner`` made that live."""
        with self._lock:
            return list(self.children.get(owner, []))

    def child(self, owner: str, machine: str) -> str:
        """The id of the machine ``machine`` (id or name) among those ``owner`` made."""
        machines = self._client._local
        with self._lock:
            made = list(self.children.get(owner, []))
        prefix = self.prefix(owner) if made else ""
        for machine_id in made:
            try:
                info = machines._info(machine_id)
            except NotFoundError:
                continue  # gone another way (the client closing): not this machine's business
            if machine == info.id or info.name == prefix + machine:
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


def routes(client: Boxd, spawners: Spawners, body_budget_bytes: int = MAX_BODIES_BYTES) -> list[Route]:
    """The ``/v1/machines`` routes, each run in a worker thread (the calls block), holding at most
    ``body_budget_bytes`` of request bodies at once."""
    budget = BodyBudget(body_budget_bytes)

    def handler(work: Callable[[Request, str, Any], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                owner = spawners.owner(request)
                declared = request.headers.get("content-length")
                chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
                with budget.hold(declared, chunked=chunked):
                    raw = await read_limited(request.stream(), declared, MAX_BODY_BYTES)
                    check_nesting(raw)  # before the parser, which a deep body overflows (a 500)
                    body = json.loads(raw) if raw else {}
                    del raw  # the parsed body is all that is kept while the machine works
                    if not isinstance(body, dict):
                        raise InvalidInputError("the body must be a JSON object", field="body")
                    answer = await asyncio.to_thread(work, request, owner, body)
            except MachinesBusyError as exc:
                await _drain(request)  # so the sender, still sending, reads the answer and not a reset
                return JSONResponse(exc.to_dict(), status_code=exc.status)
            except SwarmyardError as exc:
                return JSONResponse(exc.to_dict(), status_code=exc.status)
            except (ValueError, TypeError) as exc:
                error = InvalidInputError(f"bad request: {exc}")
                return JSONResponse(error.to_dict(), status_code=error.status)
            return JSONResponse(answer)

        return endpoint

    machines = client._local

    def made(owner: str, name: str, make: Callable[[], Any]) -> Any:
        spawners.reserve(owner)
        try:
            with spawners.making(name):
                record = make()
        except BaseException:
            spawners.unreserve(owner)
            raise
        if not spawners.adopt(owner, record.id):
            machines.delete(record.id)
            raise NotFoundError("machine", owner)
        return _machine_json(record, spawners.prefix(owner))

    def create(request: Request, owner: str, body: dict[str, Any]) -> Any:
        name = spawners.qualified(owner, _opt_str(body, "name"))
        ref = _opt_str(body, "from_snapshot")
        # only the client's snapshots in the coordinator's namespace: any other is not_found, as one never made
        snapshot = None if ref is None else client.snapshots.for_coordinator(spawners.prefix(owner), ref)
        networks = _networks(machines.get(owner).addresses, body)
        return made(owner, name, lambda: machines.create(name, from_snapshot=snapshot, networks=networks))

    def listing(request: Request, owner: str, body: dict[str, Any]) -> Any:
        return [_machine_json(machines.get(m), spawners.prefix(owner)) for m in spawners.made(owner)]

    def get(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        return _machine_json(machines.get(machine), spawners.prefix(owner))

    def wait(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        # the number as sent: the client checks its range before anything converts it (see check_timeout)
        record = machines.wait_until_ready(machine, body.get("timeout", 180.0))
        return _machine_json(record, spawners.prefix(owner))

    def execute(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        command = body.get("command")
        if not isinstance(command, str | list):
            raise InvalidInputError("command must be a shell line or a non-empty list of strings", field="command")
        env = body.get("env")
        if env is not None and not isinstance(env, dict):
            raise InvalidInputError("env must be an object", field="env")
        stdin = _opt_b64(body, "stdin_b64")
        result = machines.exec(machine, command, env=env, cwd=_opt_str(body, "cwd"), timeout=body.get("timeout"),
                               stdin=stdin)
        return {"stdout_b64": base64.b64encode(result.stdout_raw).decode(),
                "stderr_b64": base64.b64encode(result.stderr_raw).decode(), "exit_code": result.exit_code,
                "timed_out": result.timed_out, "duration_s": result.duration_s, "truncated": result.truncated}

    def fork(request: Request, owner: str, body: dict[str, Any]) -> Any:
        source = spawners.child(owner, request.path_params["machine"])
        name = spawners.qualified(owner, _opt_str(body, "new_name"))
        return made(owner, name, lambda: machines.fork(source, name))

    def delete(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        machines.delete(machine)  # which disowns it
        return {"deleted": machine}

    def upload(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        data = _opt_b64(body, "data_b64") or b""
        return {"written": machines.files.upload(machine, _path(body), data)}

    def download(request: Request, owner: str, body: dict[str, Any]) -> Any:
        machine = spawners.child(owner, request.path_params["machine"])
        data = machines.files.download(machine, _path(body))
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


async def _drain(request: Request) -> None:
    """Read a refused request's body without keeping it, up to the largest body (past that the connection is
    dropped when the answer is sent, as starlette does with a body left unread)."""
    size = 0
    with contextlib.suppress(ClientDisconnect):
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return


def _networks(own: Mapping[str, str], body: dict[str, Any]) -> list[str] | None:
    """The private networks a coordinator's machine joins: only networks the coordinator is on (it may not put a
    machine where it cannot go itself, nor learn which other networks exist); spawn is refused, not dropped."""
    if body.get("spawn") not in (None, False):
        raise ForbiddenError("a machine that a coordinator makes cannot make machines (spawn)")
    networks = body.get("networks")
    if networks is None:
        return None
    if not isinstance(networks, list) or not all(isinstance(n, str) for n in networks):
        raise InvalidInputError("networks must be a list of names", field="networks")
    foreign = sorted(set(networks) - set(own))
    if foreign:
        raise ForbiddenError(f"this machine is not on network {foreign[0]!r}: the machines it makes join only "
                             "networks it is on")
    return networks


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{key} must be a string", field=key)
    return value


def _path(body: dict[str, Any]) -> str:
    path = _opt_str(body, "path")
    if not path or "\0" in path:
        raise InvalidInputError("path must be a non-empty string", field="path")
    return path


def _opt_b64(body: dict[str, Any], key: str) -> bytes | None:
    value = _opt_str(body, key)
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error
        raise InvalidInputError(f"{key} must be base64", field=key) from None
