"""Where a ``Boxd`` client's machines get their identities: a running ``swarmyard serve``, or a plane of its own.

Either way it is one control plane with its model broker, reached over a Unix socket that every machine has
bound in (its in-sandbox relay forwards 127.0.0.1 to it). The client is its operator: it makes one goal for
the session, and for every machine a task, a worker token and a claim on that task, so the broker serves the
machine's model calls (it serves only a worker holding a live claim) and charges them to that task. A thread
renews the claims while the client is open; a deleted machine's worker is revoked.

With no configuration the plane is embedded: SQLite in a private temp folder, the broker on the default local
model (or the ``[providers]`` table given), served on a socket in that folder, stopped on ``close``. The client's
own calls to an embedded plane (a machine's login and logout, the claims' renewal) are made in this process through
the same handlers the HTTP routes call (the operator API and the worker tools, with their validation, token checks
and rate limits), not over its socket: three HTTP round trips per machine were most of what the client added to a
machine's create, and under load each cost a scheduling wait of the server's threads. Machines reach it over HTTP.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
from starlette.routing import BaseRoute

from swarmyard.config import DEFAULT_MODEL, ProviderConfig, ProviderKind
from swarmyard.errors import ConfigError, SwarmyardError, UserError
from swarmyard.machines.pids import alive, owner_line, read_owner
from swarmyard.plane.client import (
    HEARTBEAT,
    Bearer,
    Fence,
    PlaneAddress,
    ToolCall,
    ToolClient,
    claim_task_call,
    decode,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The objective of the goal a client's machines work under (shown by ``swarmyard goal list``).
OBJECTIVE = "machines made through the Boxd client"
#: The name every embedded plane's folder starts with (in the temp folder).
_PREFIX = "sy-boxd-"
#: Longest Unix socket path the kernel accepts (``sun_path`` is 108 bytes with its terminating NUL).
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True, slots=True)
class Login:
    """One machine's identity at the plane: its worker, its token and the claim that lets it call models."""

    worker_id: str
    token: str
    task_id: str
    fencing_token: int
    group: str


class Plane:
    """A control plane this client acts on as operator (see the module docstring)."""

    def __init__(self, socket_path: Path, operator_token: str, *, model: str, embedded: bool, budget_micro_usd: int,
                 machine_budget_micro_usd: int, lease_s: float, owned: _Embedded | None = None) -> None:
        self.socket = socket_path
        self.model = model
        #: whether this client serves the plane itself (only then can its machines make machines)
        self.embedded = embedded
        self._owned = owned
        #: the embedded plane's handlers, called in this process (``None``: a `swarmyard serve`, over its socket)
        self._here: Any = owned.core if owned is not None else None
        # an embedded plane's own socket, which no machine has: machines that fill theirs leave the client room
        own = owned.client_socket if owned is not None else socket_path
        self._http = PlaneAddress(socket_path=str(own)).client(operator_token, timeout_s=60.0)
        self._machine_budget = machine_budget_micro_usd
        self._logins: dict[str, Login] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lease_s = lease_s
        try:
            goal = self._call("POST", "/v1/operator/goals", {
                "objective": OBJECTIVE, "budget_micro_usd": budget_micro_usd, "call_cap": 1_000_000,
                "max_depth": 2, "policy": "independent"})
        except BaseException:
            self.close()
            raise
        self.goal_id: str = goal["goal"]["id"]
        self._renewer = threading.Thread(target=self._renew_loop, name="boxd-claims", daemon=True)
        self._renewer.start()

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An operator API call."""
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the control plane at {self.socket}: {exc}") from exc
        answer = decode(response)
        if response.status_code >= 400 or not isinstance(answer, dict):
            raise SwarmyardError.from_dict(answer if isinstance(answer, dict) else {}, status=response.status_code)
        return answer

    def _tool(self, token: str, call: ToolCall[T], fence: Fence | None = None) -> T:
        """A worker tool call as ``token``'s worker, over this client's connection to the plane."""
        try:
            return ToolClient(Bearer(self._http, token), fence).run(call)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the control plane at {self.socket}: {exc}") from exc

    def login(self, machine_name: str, group: str) -> Login:
        """A task for the machine, a worker in ``group`` and its claim on that task."""
        if self._here is not None:
            return self._login_here(machine_name, group)
        task = self._call("POST", f"/v1/operator/goals/{self.goal_id}/tasks", {
            "title": f"machine {machine_name}", "prompt": f"the work of machine {machine_name}", "group": group,
            "budget_micro_usd": self._machine_budget})["task"]
        worker_id: str | None = None
        try:
            issued = self._call("POST", f"/v1/operator/goals/{self.goal_id}/workers", {"group": group})
            token, worker_id = issued["token"], issued["worker"]["id"]
            claim = self._tool(token, claim_task_call(task["id"]))
            if claim.fencing_token is None:
                raise UserError(f"the plane gave machine {machine_name} no claim on its own task {task['id']}")
        except BaseException:
            self._end(worker_id, task["id"])
            raise
        return self._keep(Login(issued["worker"]["id"], token, task["id"], claim.fencing_token, group))

    def _login_here(self, machine_name: str, group: str) -> Login:
        """``login`` through the embedded plane's own handlers (the same calls as its three routes)."""
        from swarmyard.plane import models as m
        from swarmyard.plane.operator import Call

        here = self._here
        goal = {"goal_id": self.goal_id}
        task = here.operator.create_task(Call(goal, None, m.CreateTaskRequest(
            title=f"machine {machine_name}", prompt=f"the work of machine {machine_name}", group=group,
            budget_micro_usd=self._machine_budget))).task
        worker_id: str | None = None
        try:
            issued = here.operator.issue_worker(Call(goal, None, m.IssueWorkerRequest(group=group)))
            worker_id = issued.worker.id
            claim = here.tools.call(partial(here.tools.claim_task, issued.token, m.ClaimTaskRequest(task_id=task.id)))
            if claim.fencing_token is None:
                raise UserError(f"the plane gave machine {machine_name} no claim on its own task {task.id}")
        except BaseException:
            self._end(worker_id, task.id)
            raise
        here.changed()
        return self._keep(Login(issued.worker.id, issued.token, task.id, int(claim.fencing_token), group))

    def _keep(self, login: Login) -> Login:
        with self._lock:
            self._logins[login.worker_id] = login
        return login

    def logout(self, login: Login) -> None:
        """Revoke the machine's worker (its token buys nothing more) and end its task, which gives the goal back
        what the machine did not spend: a client makes and deletes as many machines as its budget lasts for."""
        with self._lock:
            self._logins.pop(login.worker_id, None)
        self._end(login.worker_id, login.task_id)

    def _end(self, worker_id: str | None, task_id: str) -> None:
        if self._here is not None:
            self._end_here(worker_id, task_id)
            return
        if worker_id is not None:  # first: a worker revoked reserves nothing more from the task
            with contextlib.suppress(SwarmyardError):
                self._call("POST", f"/v1/operator/workers/{worker_id}/revoke")
        with contextlib.suppress(SwarmyardError):
            self._call("POST", f"/v1/operator/tasks/{task_id}/cancel", {"reason": "its machine was deleted"})

    def _end_here(self, worker_id: str | None, task_id: str) -> None:
        from swarmyard.plane import models as m
        from swarmyard.plane.operator import Call

        operator = self._here.operator
        if worker_id is not None:
            with contextlib.suppress(SwarmyardError):
                operator.revoke_worker(Call({"worker_id": worker_id}, None, None))
        with contextlib.suppress(SwarmyardError):
            operator.cancel_task(Call({"task_id": task_id}, None, m.CancelTaskRequest(reason="its machine was deleted")))
        self._here.changed()

    def _renew_loop(self) -> None:
        # A machine's agent may think for longer than a lease; the claim must outlive it while the client is open.
        while not self._stop.wait(self._lease_s / 3):
            with self._lock:
                logins = list(self._logins.values())
            for login in logins:
                try:
                    self._heartbeat(login)
                except SwarmyardError as exc:
                    log.warning("the claim of worker %s was not renewed: %s", login.worker_id, exc)

    def _heartbeat(self, login: Login) -> None:
        if self._here is None:
            self._tool(login.token, HEARTBEAT, Fence(login.task_id, login.fencing_token))
            return
        from swarmyard.plane import models as m

        tools = self._here.tools
        tools.call(partial(tools.heartbeat, login.token,
                           m.HeartbeatRequest(task_id=login.task_id, fencing_token=login.fencing_token)))

    def close(self) -> None:
        """Stop renewing; revoke what is left; stop the embedded plane if this client started it."""
        self._stop.set()
        with self._lock:
            left = list(self._logins.values())
        for login in left:
            self.logout(login)
        self._http.close()
        if self._owned is not None:
            self._owned.stop()


class _Embedded:
    """A control plane and broker (:mod:`swarmyard.plane.assembly`) served from this process on two sockets in a
    private temp folder: the one bound into machines (``socket``) and the client's own (``client_socket``). Each is
    served as ``swarmyard serve`` serves its listeners (see :mod:`swarmyard.plane.connections`): a deadline for a request's headers and one for
    its body, a cap on the bytes of its headers, and its own cap on open connections, so machines holding
    connections half-sent neither run this process out of file descriptors nor shut the client out."""

    def __init__(self, providers: Mapping[str, ProviderConfig], given: Mapping[str, Any] | None,
                 lease_s: float, extra_routes: Sequence[BaseRoute] = ()) -> None:
        from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
        from swarmyard.broker.providers.configured import CLI_SLOTS
        from swarmyard.plane.assembly import assemble
        from swarmyard.plane.server import BackgroundServer, Listen
        from swarmyard.plane.settings import PlaneSettings
        from swarmyard.store import open_store

        reap_planes()
        # short and private: the socket's path must fit sun_path, and nobody else may reach the store or secret
        self.folder = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.folder / "owner").write_text(owner_line())  # so a later client removes it if this process is killed
        self.socket = self.folder / "plane.sock"
        self.client_socket = self.folder / "client.sock"
        self.store = open_store(f"sqlite:///{self.folder / 'store.db'}")
        self.broker: Any = None
        self._server: BackgroundServer | None = None
        try:
            self.tokens = TokenAuthority(load_or_create_secret(self.folder / "token.secret"), self.store)
            # any agent CLI may run in a machine: slots its prompts fit in
            made = assemble(self.store, self.tokens, PlaneSettings(lease_s=lease_s), providers=providers,
                            given=given, local_slots=CLI_SLOTS, extra_routes=extra_routes)
            self.broker = made.broker
            #: the plane's handlers (operator API, worker tools), which this client calls in-process
            self.core: Any = made.core
            if len(os.fsencode(self.client_socket)) > _MAX_SOCKET_PATH:
                raise ConfigError(f"the temp folder {self.folder} is too deep for a Unix socket", field="TMPDIR")
            listeners = []
            for path in (self.socket, self.client_socket):
                # bound and listening before the server starts: a connection made now waits in the backlog
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listeners.append(listener)
                listener.bind(str(path))
                listener.listen(128)
                os.chmod(path, 0o600)
            self._server = made.background(Listen(self.socket), also=(Listen(self.client_socket),),
                                           bound=tuple(listeners))
            self._server.start()
            self.operator_token = self.tokens.issue_operator(ttl_s=30 * 86400.0)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop serving, let the broker write its last settlements, close the store, remove the folder."""
        try:
            if self.broker is not None:
                self.broker.wait_settled(30)
            if self._server is not None:
                self._server.stop()
        finally:
            self.store.close()
            shutil.rmtree(self.folder, ignore_errors=True)


def reap_planes() -> list[Path]:
    """Remove the folders of embedded planes whose process died without stopping them (a SIGKILL): their
    store, secret and socket. A folder is this user's and names its owner (pid and start time), like a
    machine's folder; one whose owner lives, or with no owner file yet, is left alone. Returns those removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue  # removed meanwhile
        owner = read_owner(folder / "owner")
        if owner is None or alive(*owner):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    if removed:
        log.info("removed %d embedded planes left by processes that are gone", len(removed))
    return removed


def default_providers() -> dict[str, ProviderConfig]:
    """The embedded local model, as ``swarmyard run`` has it with no ``[providers]`` table."""
    return {"local": ProviderConfig(kind=ProviderKind.LOCAL, models=(DEFAULT_MODEL,))}


def open_plane(*, server: str | None, operator_token_file: Path | None, providers: Path | None,
               given: Mapping[str, Any] | None, model: str | None, budget_micro_usd: int,
               machine_budget_micro_usd: int, lease_s: float, extra_routes: Sequence[BaseRoute] = ()) -> Plane:
    """The plane named by ``server`` (a ``swarmyard serve`` socket), else one embedded here."""
    if server is not None:
        if server.startswith(("http://", "https://")):
            raise ConfigError("machines reach the control plane through a Unix socket bound into them: point "
                              "SWARMYARD_SERVER at the socket of `swarmyard serve`, not a URL", field="server")
        token_file = operator_token_file or Path("operator-token")
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UserError(f"cannot read the operator token at {token_file}: {exc.strerror} (set "
                            "SWARMYARD_OPERATOR_TOKEN_FILE to the file `swarmyard serve` wrote)") from exc
        if model is None:
            raise ConfigError("with SWARMYARD_SERVER, name the model its broker serves (Boxd(model=...) or "
                              "SWARMYARD_MODEL)", field="model")
        return Plane(Path(server).resolve(), token, model=model, embedded=False, budget_micro_usd=budget_micro_usd,
                     machine_budget_micro_usd=machine_budget_micro_usd, lease_s=lease_s)
    from swarmyard.config import provider_table

    table = provider_table(providers, []) if providers is not None else default_providers()
    if given:
        for name in given:
            if name not in table:
                raise ConfigError(f"provider object {name!r} has no entry in the providers table", field="providers")
    served = [m for cfg in table.values() for m in cfg.models]
    chosen = model or (DEFAULT_MODEL if DEFAULT_MODEL in served else served[0])
    if chosen not in served:
        raise ConfigError(f"model {chosen!r} is served by no provider of the table ({', '.join(served)})",
                          field="model")
    embedded = _Embedded(table, given, lease_s, extra_routes)
    return Plane(embedded.socket, embedded.operator_token, model=chosen, embedded=True, budget_micro_usd=budget_micro_usd,
                 machine_budget_micro_usd=machine_budget_micro_usd, lease_s=lease_s, owned=embedded)
