"""``Boxd`` and ``AsyncBoxd``: boxd's client surface over swarmyard's machines and control plane.

``boxd.machines.<verb>(id_or_name, ...)`` as in boxd's SDK: create, get, list, wait_until_ready, exec, fork,
delete, and ``boxd.machines.files.upload/download``. Every machine is logged in at the control plane (see
:mod:`swarmyard.boxd._plane`): its agent CLIs reach the broker with its own token and no key.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import errno
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from swarmyard.boxd import _logins
from swarmyard.boxd._models import ExecResult, Machine, MachineSource, PauseResult, ResumeResult
from swarmyard.boxd._plane import Login, Plane, open_plane
from swarmyard.boxd._remote import RemoteMachines
from swarmyard.boxd._spawn import Spawners, routes
from swarmyard.errors import (
    ConflictError,
    InvalidInputError,
    MachineNotRunningError,
    NotFoundError,
    OutOfResourcesError,
    SwarmyardError,
    UserError,
)
from swarmyard.ids import new_id
from swarmyard.machines import pausing
from swarmyard.machines.api import MAX_TIMEOUT_S, Machines, check_timeout
from swarmyard.machines.idle import DEFAULT_HIBERNATE_S, DEFAULT_IDLE_SUSPEND_S, check_idle_suspend_s
from swarmyard.machines.protocol import Limits, MachineInfo, MachineState
from swarmyard.machines.snapshots import IDENTITY_FILES, Snapshot, Snapshots, parse_ref
from swarmyard.money import usd_to_micro

#: The group a machine's worker is in unless ``create(group=...)`` names one.
DEFAULT_GROUP = "boxd"
#: Present only inside a machine of the ``local`` backend: its init's control socket (under
#: ``swarmyard.machines.local.RUN_DIR``, not imported here: a coordinator machine's Boxd() loads no backend).
_MACHINE_MARK = "/run/swarmyard/ctl/init.sock"


_P = ParamSpec("_P")
_R = TypeVar("_R")
#: What a call that failed for lack of this process's resources (not of anything asked) sees from the kernel.
_EXHAUSTED = {errno.EMFILE: "open files", errno.ENFILE: "open files (the host's)", errno.ENOMEM: "memory",
              errno.EAGAIN: "processes or threads"}


def _typed_exhaustion(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """``call``, with the kernel's refusals for lack of resources (out of file descriptors, say, because machines
    hold connections to the plane) raised as a retryable :class:`OutOfResourcesError`, not a bare ``OSError``."""

    @functools.wraps(call)
    def typed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return call(*args, **kwargs)
        except OSError as exc:
            what = _EXHAUSTED.get(exc.errno or 0)
            if what is None:
                raise
            raise OutOfResourcesError(f"this process ran out of {what} ({exc.strerror}): retry once some are freed",
                                      errno=exc.errno or 0) from exc

    return typed


@dataclass(slots=True)
class _Kept:
    """What the client keeps of one of its machines."""

    login: Login
    source: MachineSource | None = None
    spawn: bool = False
    env: dict[str, str] = field(default_factory=dict)
    provisioned: bool = False
    #: its login files and variables made while it boots, for the relay the previous machine's init named
    prepared: _logins.Logins | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class Files:
    """``boxd.machines.files``: files in and out of a machine; relative paths are under ``/home/boxd``."""

    def __init__(self, machines: MachinesResource) -> None:
        self._machines = machines

    @_typed_exhaustion
    def upload(self, machine: str, path: str, data: str | bytes, *, mode: int = 0o644) -> int:
        """Write ``data`` (``str`` is written as UTF-8) to ``path``; returns the number of bytes written."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError("upload data must be str or bytes", field="data")
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise InvalidInputError("mode must be a permission number such as 0o644", field="mode")
        machine_id = self._machines._ready(machine)
        self._machines._sync.files.upload(machine_id, path, bytes(data), mode=mode)
        return len(data)

    @_typed_exhaustion
    def download(self, machine: str, path: str) -> bytes:
        """The whole file at ``path``: a regular file, at most 64 MiB (``PayloadTooLargeError`` past that)."""
        return self._machines._sync.files.download(self._machines._ready(machine), path)


class MachinesResource:
    """``boxd.machines``."""

    def __init__(self, client: Boxd) -> None:
        self._client = client
        self._sync = client._sync
        self._kept: dict[str, _Kept] = {}
        self._paused: set[str] = set()
        self.files = Files(self)
        #: the relay the last machine's init named: a backend's machines have the same one (a fixed port in each
        #: machine's own network), so the next machine's logins are made for it while that machine boots
        self._relay: str | None = None

    # -- lookups ---------------------------------------------------------------------------------------------

    def _info(self, machine: str) -> MachineInfo:
        if not isinstance(machine, str) or not machine:
            raise InvalidInputError("a machine is named by its id or its name", field="id")
        infos = [i for i in self._sync.list() if i.id in self._kept]
        for info in infos:
            if info.id == machine:
                return info
        for info in infos:
            if info.name == machine:
                return info
        raise NotFoundError("machine", machine)

    def get(self, machine: str) -> Machine:
        """A machine by id or name."""
        return self._record(self._info(machine))

    def _record(self, info: MachineInfo) -> Machine:
        return Machine.of(info, paused=info.id in self._paused, source=self._kept[info.id].source)

    def list(self) -> list[Machine]:
        """This client's machines."""
        return [self._record(i) for i in self._sync.list() if i.id in self._kept]

    def suggest_name(self) -> str:
        """A name no machine of this client has."""
        return f"machine-{new_id('m')[-8:].lower()}"

    # -- life ------------------------------------------------------------------------------------------------

    @_typed_exhaustion
    def create(
        self,
        name: str | None = None,
        *,
        networks: Sequence[str] | None = None,
        isolated: bool = True,
        from_snapshot: str | Snapshot | None = None,
        env: Mapping[str, str] | None = None,
        group: str | None = None,
        baseline: str | None = None,
        limits: Limits | None = None,
        spawn: bool = False,
    ) -> Machine:
        """Start a machine and return at once (call ``wait_until_ready`` before using it).

        ``spawn=True``: a coordinator, whose own ``Boxd()`` makes machines through this client (see
        :mod:`swarmyard.boxd._spawn`); only on a plane this client serves itself.

        ``isolated=True`` (the only kind this build has): no route out, only loopback, the control plane and
        the private ``networks`` named (joined once ready; ``<name>.yard`` resolves between machines that
        share one; they need root on the host, see :mod:`swarmyard.machines.networks`).
        """
        if isolated is not True:
            raise UserError("every machine is isolated (loopback and the control plane only): isolated=True")
        source = None
        if from_snapshot is not None:
            if baseline is not None:
                raise InvalidInputError("a machine starts from a snapshot or a baseline, not both", field="baseline")
            snapshot = (from_snapshot if isinstance(from_snapshot, Snapshot)
                        else self._client.snapshots.get(from_snapshot))
            baseline, source = snapshot.baseline, MachineSource("snapshot", snapshot.name, snapshot.version)
        elif baseline is not None:
            self._client.snapshots._own.check_baseline(baseline)  # another client's snapshot is not_found
        plane = self._client._plane_now()
        if spawn and not plane.embedded:
            raise UserError("a machine that makes machines needs this client's own plane: not with SWARMYARD_SERVER")
        name = name if name is not None else self.suggest_name()
        self._client._spawners.check_name(name, spawn=spawn)
        info = self._sync.create(name, baseline, group or DEFAULT_GROUP, env=env, limits=limits,
                                 control_socket=plane.socket, networks=networks)
        login = self._log_in(plane, info, group or DEFAULT_GROUP)
        self._kept[info.id] = _Kept(login, source, spawn=spawn, prepared=self._prepare(login, plane.model))
        if spawn:
            self._client._spawners.allow(info.id, login.token)
        return self._record(info)

    @_typed_exhaustion
    def wait_until_ready(self, machine: str, timeout: float = 180.0, poll_interval: float = 1.0) -> Machine:
        """Block until the machine runs commands (``poll_interval`` is accepted for boxd's signature: readiness
        here is a message from the machine's init, not a poll)."""
        del poll_interval
        _check_timeout(timeout)
        machine_id = self._ready(machine, timeout)
        return self._record(self._info(machine_id))

    def _ready(self, machine: str, timeout_s: float = 180.0) -> str:
        """The machine's id once it is ready and logged in (its agents' files written)."""
        info = self._info(machine)
        if info.id in self._paused:
            raise ConflictError(f"machine {info.name} is paused: resume it first")
        if info.state is MachineState.FAILED:  # its init ended: nothing runs in it any more
            raise MachineNotRunningError(f"machine {info.name} is not running: its init has ended (a process in it "
                                         "may kill it); only a delete is left to do", machine_id=info.id)
        kept = self._kept[info.id]
        with kept.lock:
            if not kept.provisioned:
                ready = self._sync.wait_until_ready(info.id, timeout_s)
                relay = self._relay = f"http://127.0.0.1:{ready.relay_port}"
                made = kept.prepared
                if made is None or made.relay_url != relay:
                    made = _logins.logins(relay, kept.login, self._client._plane_now().model)
                self._write_logins(info.id, made.files)
                kept.env = dict(made.env)
                if kept.spawn:
                    kept.env["SWARMYARD_BOXD_URL"] = relay  # its Boxd() makes machines through this client
                kept.provisioned = True
        return info.id

    def _prepare(self, login: Login, model: str) -> _logins.Logins | None:
        """The machine's login files and variables, made while it boots (off the path from its ready to its first
        exec) for the relay the previous machine had; ``None`` before any machine was ready."""
        return None if self._relay is None else _logins.logins(self._relay, login, model)

    def _write_logins(self, machine_id: str, files: Mapping[str, str]) -> None:
        """Write the agents' login files into the machine all at once: each is a connection to its init, which
        serves each on a thread of its own, and every one is sent before any answer is awaited, so the six take
        about one's time instead of six in a row, with no thread of this process woken per file."""
        self._sync.files.upload_many(machine_id, {path: text.encode() for path, text in files.items()}, mode=0o600)

    @_typed_exhaustion
    def exec(
        self,
        machine: str,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` (a shell line, or an argv list) to its end; ``timeout`` kills its whole process tree."""
        _check_command(command)
        if timeout is not None:
            _check_timeout(timeout)
        if stdin is not None and not isinstance(stdin, str | bytes | bytearray):
            raise InvalidInputError("stdin must be str or bytes", field="stdin")
        machine_id = self._ready(machine)
        data = stdin.encode("utf-8") if isinstance(stdin, str) else None if stdin is None else bytes(stdin)
        merged = {**self._kept[machine_id].env, **(env or {})}
        raw = self._sync.exec(machine_id, command, timeout=timeout, env=merged, cwd=cwd, stdin=data)
        return ExecResult.of(raw)

    @_typed_exhaustion
    def fork(self, machine: str, new_name: str | None = None) -> Machine:
        """A new machine whose disk starts as a copy of ``machine``'s (its own identity, not the source's)."""
        source = self._info(self._ready(machine))
        plane = self._client._plane_now()
        name = new_name if new_name is not None else self.suggest_name()
        self._client._spawners.check_name(name, spawn=False)
        info = self._sync.fork(source.id, name, control_socket=plane.socket)
        login = self._log_in(plane, info, source.group or DEFAULT_GROUP)
        self._kept[info.id] = _Kept(login, MachineSource("fork", source.name, id=source.id),
                                    prepared=self._prepare(login, plane.model))
        return self._record(info)

    def _log_in(self, plane: Plane, info: MachineInfo, group: str) -> Login:
        """The machine's identity at the plane, asked for while the machine boots (the plane's calls and the
        sandbox's start overlap; its agents' files are written once it is ready); a refusal (the goal's budget
        spent) deletes the machine and is raised."""
        try:
            return plane.login(info.name, group)
        except BaseException:
            with contextlib.suppress(SwarmyardError):
                self._sync.delete(info.id)
            raise

    def disk_digest(self, machine: str) -> str:
        """The digest of the machine's disk as :func:`swarmyard.machines.snapshots.tree_digest` makes it, read
        inside the machine, leaving out the files that log its agents in (its own token): machines from one
        snapshot version start with that version's digest."""
        program = ("import sys; from pathlib import Path; from swarmyard.machines.snapshots import tree_digest; "
                   f"print(tree_digest(Path(sys.argv[1]), {IDENTITY_FILES!r})[0])")
        # -P, -s and cwd "/": the home is the machine's own to write, and a swarmyard/ or .pth planted there
        # would otherwise be imported in place of ours and forge the digest
        done = self.exec(machine, ["python3", "-P", "-s", "-c", program, _logins.HOME], cwd="/")
        if not done.success:
            raise UserError(f"machine {machine}: its disk could not be read: {done.stderr.strip()[-300:]}")
        return done.stdout.strip()

    def pause(self, machine: str) -> PauseResult:
        """Freeze the machine (cgroup freezer): its processes keep their memory and use no CPU until ``resume``."""
        machine_id = self._ready(machine)
        self._sync.idle.wake(machine_id)  # from now on its owner's pause, which only resume ends, not a call
        result = PauseResult(pausing.pause(self._sync.backend, machine_id))
        self._paused.add(machine_id)
        return result

    def resume(self, machine: str) -> ResumeResult:
        """Thaw a paused machine: its processes go on from where they stopped."""
        info = self._info(machine)
        if info.id not in self._paused:
            raise ConflictError(f"machine {info.name} is not paused")
        result = ResumeResult(pausing.resume(self._sync.backend, info.id))
        self._paused.discard(info.id)
        return result

    def cpu_time_us(self, machine: str) -> int:
        """The CPU time the machine's processes have used so far, in microseconds (its cgroup's ``cpu.stat``)."""
        return pausing.cpu_usage_us(self._sync.backend, self._info(machine).id)

    @_typed_exhaustion
    def delete(self, machine: str) -> None:
        """Kill everything in the machine, remove its disk and revoke its worker."""
        info = self._info(machine)
        if info.id in self._paused:
            self.resume(info.id)  # a frozen sandbox would not hear the stop it is sent first
        for child in self._client._spawners.forget(info.id):  # what a coordinator made goes with it
            if child in self._kept:
                self.delete(child)
        self._client._spawners.disown(info.id)  # its coordinator no longer lists it
        kept = self._kept.pop(info.id)
        plane = self._client._plane
        # its worker is revoked while its sandbox is torn down: the plane's calls overlap the kernel's waits
        revoking = None if plane is None else _Background(functools.partial(plane.logout, kept.login))
        try:
            if info.state is not MachineState.DELETED:
                self._sync.delete(info.id)
        finally:
            if revoking is not None:
                revoking.result()

    def _close(self) -> None:
        for machine_id in list(self._kept):
            try:
                self.delete(machine_id)
            except NotFoundError:
                self._kept.pop(machine_id, None)


class _Background:
    """A call run on a thread of its own; ``result`` waits for it and raises what it raised."""

    def __init__(self, call: Callable[[], None]) -> None:
        self._call = call
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="boxd-background",
                                                                 daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # no new thread at interpreter shutdown (an exit hook's close): run it here
            self._thread = None
            self._run()

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as exc:  # handed to the caller's thread by result()
            self._failed = exc

    def result(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._failed is not None:
            raise self._failed


def _terminated(signum: int, frame: object) -> None:
    # A second SIGTERM must not cut the cleanup the first one started: ignored from now on.
    signal.signal(signum, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _stop_on_sigterm() -> None:
    """Make SIGTERM an exit of the script (status 143, as a shell reports a process ended by it) rather than a
    death on the spot, so ``with`` blocks and the exit hook delete its machines and stop its plane.

    Only from the main thread (where Python runs signal handlers) and only while SIGTERM has its default action:
    a program that handles SIGTERM itself keeps its own handler. SIGINT needs nothing: its KeyboardInterrupt
    already unwinds to the exit hook. What a SIGKILL leaves is reaped by the next client on this host (machine
    folders and cgroups by the backend, see ``SupervisedBackend.reap_orphans``, planes by ``_plane``).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


@contextlib.contextmanager
def _sigterm_waits() -> Iterator[None]:
    """A SIGTERM that comes while a client cleans up (at exit, or on an earlier signal) waits until it is done,
    then ends the script as it would have: it does not cut the cleanup short."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not _terminated:
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _terminated)
        if came:
            _terminated(came[0], None)


#: The longest timeout a wait or an exec takes: 30 days (the client's operator token lasts that long).
_MAX_TIMEOUT_S = MAX_TIMEOUT_S


def _check_timeout(timeout: object) -> None:
    check_timeout(timeout)


def _check_command(command: object) -> None:
    parts = [command] if isinstance(command, str) else command
    if (not isinstance(parts, list | tuple) or not parts or not all(isinstance(p, str) for p in parts)
            or not parts[0]):
        raise InvalidInputError("command must be a shell line or a non-empty list of strings", field="command")
    if any("\0" in p for p in parts):
        raise InvalidInputError("command may not contain a NUL character", field="command")


class SnapshotsResource:
    """``boxd.snapshots``: versioned disks to create machines from (``create(..., from_snapshot=NAME[:VERSION])``).

    The snapshots this client makes are its own (see :mod:`swarmyard.machines.snapshots`): kept under its id
    (``client``), ``not_found`` to every other client and to its coordinators, but for those it names
    ``COORDINATOR.NAME``: the coordinator ``COORDINATOR`` starts machines from them as ``NAME``. The host operator's
    snapshots (``swarmyard machines snapshot create``) are read too, after the client's own, never by a coordinator.
    """

    def __init__(self, client: Boxd, client_id: str) -> None:
        self._client = client
        self._own = Snapshots(client._sync.backend, client_id)
        self._operator = Snapshots(client._sync.backend)

    @property
    def client(self) -> str:
        """The id this client's snapshots are kept under (``Boxd(client=...)``)."""
        assert self._own.client is not None
        return self._own.client

    @_typed_exhaustion
    def create(self, machine: str, name: str) -> Snapshot:
        """A new version of snapshot ``name`` from the machine's disk (re-saving bumps the version)."""
        machine_id = self._client._local._ready(machine)
        return self._own.create(name, machine_id=machine_id)

    def create_from_folder(self, folder: str | Path, name: str) -> Snapshot:
        """A new version of snapshot ``name`` from a folder on this host."""
        return self._own.create(name, folder=Path(folder))

    def _either(self, name: str) -> Snapshots:
        """The namespace that holds ``name``: this client's, else the operator's (``not_found`` when neither)."""
        try:
            self._own.versions(name)
            return self._own
        except NotFoundError:
            pass
        try:
            self._operator.versions(name)
        except (NotFoundError, InvalidInputError):
            raise NotFoundError("snapshot", name) from None  # a name only a client may give (a dot) is absent
        return self._operator

    def get(self, name: str) -> Snapshot:
        """``NAME`` (its newest version) or ``NAME:VERSION``: this client's, else the host operator's."""
        return self._either(name).get(name)

    def for_coordinator(self, prefix: str, ref: object) -> Snapshot:
        """The snapshot a coordinator whose machines are named ``prefix + NAME`` asks for as ``ref``: this client's
        ``prefix + ref``; anything else, whether it exists or not, is ``not_found`` under the name it gave.

        A coordinator's ``NAME`` has no dot, so a client's ``a.b.NAME`` is coordinator ``a.b``'s alone: were
        ``b.NAME`` allowed, coordinator ``a`` would also read it (as it would ``a.b``'s ``NAME``)."""
        try:
            name, version = parse_ref(cast(str, ref), dotted=True)
        except InvalidInputError as exc:
            raise InvalidInputError(exc.message, field="from_snapshot") from None
        if "." in name:  # a name in another coordinator's namespace: answered as one never made
            raise NotFoundError("snapshot", cast(str, ref))
        qualified = prefix + name + ("" if version is None else f":{version}")
        try:
            return self._own.get(qualified)
        except (NotFoundError, InvalidInputError):  # too long with the prefix: no such snapshot either
            raise NotFoundError("snapshot", cast(str, ref)) from None

    def list(self) -> list[Snapshot]:
        """The newest version of every snapshot: this client's, then the host operator's not named as one of them."""
        own = self._own.list()
        names = {s.name for s in own}
        return own + [s for s in self._operator.list() if s.name not in names]

    def versions(self, name: str) -> builtins.list[Snapshot]:
        """Every version of ``name``, oldest first."""
        return self._either(name).versions(name)

    def delete(self, name: str) -> None:
        """Delete ``NAME`` (every version) or ``NAME:VERSION``; refused while a live machine runs on one."""
        self._either(name).delete(name)


class Boxd:
    """A client for machines, shaped like boxd's ``Boxd``; every argument is keyword-only.

    ``server`` (or ``SWARMYARD_SERVER``): the socket of a running ``swarmyard serve`` to log machines in at,
    with its operator token (``operator_token_file`` or ``SWARMYARD_OPERATOR_TOKEN_FILE``) and the ``model``
    its broker serves. Otherwise the client starts a control plane and broker of its own on the first
    ``create``: the default local model, or the ``[providers]`` table of the ``providers`` file (with
    ``provider_objects`` replacing entries of the same name), and stops it on ``close``.

    ``client``: the id the snapshots this client makes are kept under on the machines root (``root``, mode 0700,
    this user's). Another client's id finds them ``not_found``; none gives a new id, so they are this client's
    alone (and the host operator's: ``swarmyard machines snapshot ... --client ID``). A later script that starts
    machines from them gives the same id (``boxd.snapshots.client``).

    ``idle_suspend_s``: a machine with no call and no network traffic for that long is frozen (its ``suspension``
    says ``frozen``), and the next exec, file call or fork of it wakes it where it stopped (``None``: never; see
    :mod:`swarmyard.machines.idle`). ``hibernate_s`` (default 600): idle that long, a frozen machine's memory is
    released (pushed to the host's swap, its processes kept); the next call wakes it as from frozen and its pages
    come back as they are touched. A host with no swap cannot: the machine stays frozen and its
    ``hibernate_reason`` says why.

    ``max_machines`` caps the machines alive at once (a coordinator's count against it too); a ``create`` past it
    waits up to ``machine_wait_s`` seconds for one to be deleted, then raises a retryable ``SandboxError``
    (``None``: it waits as long as it takes).
    """

    def __init__(
        self,
        *,
        backend: str = "local",
        server: str | None = None,
        operator_token_file: str | Path | None = None,
        providers: str | Path | None = None,
        provider_objects: Mapping[str, Any] | None = None,
        model: str | None = None,
        budget_usd: str = "10",
        machine_budget_usd: str = "1",
        max_machines: int = 128,
        root: str | Path | None = None,
        lease_s: float = 300.0,
        spawn_cap: int = 8,
        machine_wait_s: float | None = 120.0,
        client: str | None = None,
        idle_suspend_s: float | None = DEFAULT_IDLE_SUSPEND_S,
        hibernate_s: float | None = DEFAULT_HIBERNATE_S,
    ) -> None:
        configured = any(v is not None for v in (server, providers, provider_objects, model))
        inside = os.environ.get("SWARMYARD_BOXD_URL")
        in_machine = os.path.exists(_MACHINE_MARK)
        if in_machine or inside:
            # Inside a machine (a run's worker, or one a Boxd client made): machines are made only through the
            # spawn capability of the client that made it, never by a plane and sandboxes started in here.
            if not inside or not os.environ.get("SWARMYARD_TOKEN"):
                raise UserError("this machine has no spawn capability, so it cannot make machines: only a machine "
                                "that a Boxd client created with spawn=True can (a run's workers never can), and "
                                "no control plane starts inside a machine")
            if configured:
                raise UserError("inside a machine with the spawn capability Boxd() takes no server, providers or "
                                "model: its machines are made by the client that made this one, on its plane")
        #: inside a coordinator machine: machines are made by the client that made it
        self._remote = RemoteMachines(inside, os.environ["SWARMYARD_TOKEN"]) if inside else None
        if not configured and not inside and os.environ.get("SWARMYARD_TOKEN"):
            # a worker's token (a process of a machine of the backend without a sandbox): no plane starts here
            raise UserError("this machine has no spawn capability, so it cannot make machines: the client that "
                            "made it must create it with spawn=True")
        self._server = server if server is not None else os.environ.get("SWARMYARD_SERVER") or None
        token_file = operator_token_file or os.environ.get("SWARMYARD_OPERATOR_TOKEN_FILE")
        self._token_file = Path(token_file) if token_file else None
        self._providers = Path(providers) if providers is not None else None
        self._given = dict(provider_objects) if provider_objects else None
        self._model = model if model is not None else os.environ.get("SWARMYARD_MODEL") or None
        self._budget = usd_to_micro(budget_usd, field="budget_usd")
        self._machine_budget = usd_to_micro(machine_budget_usd, field="machine_budget_usd")
        if self._machine_budget > self._budget:
            raise InvalidInputError("machine_budget_usd is more than budget_usd", field="machine_budget_usd")
        if not isinstance(lease_s, int | float) or lease_s <= 0:
            raise InvalidInputError("lease_s must be a positive number of seconds", field="lease_s")
        self._lease_s = float(lease_s)
        if not isinstance(spawn_cap, int) or spawn_cap < 0:
            raise InvalidInputError("spawn_cap must be a whole number, 0 or more", field="spawn_cap")
        if machine_wait_s is not None and (isinstance(machine_wait_s, bool) or not isinstance(
                machine_wait_s, int | float) or not 0 < machine_wait_s <= _MAX_TIMEOUT_S):
            raise InvalidInputError(f"machine_wait_s must be a number of seconds in (0, {_MAX_TIMEOUT_S:.0f}] or None",
                                    field="machine_wait_s")
        self._plane: Plane | None = None
        self._closed = False
        self._plane_lock = threading.Lock()
        self.machines: MachinesResource | RemoteMachines
        if self._remote is not None:
            self.machines = self._remote
            return
        self._sync = Machines(backend, root=Path(root) if root is not None else None, max_concurrent=max_machines,
                              queue_timeout_s=None if machine_wait_s is None else float(machine_wait_s),
                              idle_suspend_s=check_idle_suspend_s(idle_suspend_s), hibernate_s=hibernate_s)
        self._spawners = Spawners(self, spawn_cap)
        self.snapshots = SnapshotsResource(self, client if client is not None else new_id("c").lower())
        self._local = MachinesResource(self)
        self.machines = self._local
        # a script that never calls close() still leaves no machine and no plane behind when it exits, and
        # SIGTERM ends it as an exit does (see _stop_on_sigterm)
        atexit.register(self.close)
        _stop_on_sigterm()

    def _plane_now(self) -> Plane:
        with self._plane_lock:
            if self._closed:
                raise UserError("this Boxd client is closed")
            if self._plane is None:
                self._plane = open_plane(server=self._server, operator_token_file=self._token_file,
                                         providers=self._providers, given=self._given, model=self._model,
                                         budget_micro_usd=self._budget,
                                         machine_budget_micro_usd=self._machine_budget, lease_s=self._lease_s,
                                         extra_routes=routes(self, self._spawners))
            return self._plane

    @property
    def goal_id(self) -> str:
        """The goal this client's machines work under (their spend and calls are its)."""
        return self._plane_now().goal_id

    def close(self) -> None:
        """Delete this client's machines and stop the plane it started (also done when the process exits)."""
        atexit.unregister(self.close)
        if self._closed:
            return
        self._closed = True
        if self._remote is not None:
            self._remote.close()
            return
        with _sigterm_waits():
            try:
                self._local._close()
                self._sync.close()
            finally:
                with self._plane_lock:
                    plane, self._plane = self._plane, None
                if plane is not None:
                    plane.close()

    def __enter__(self) -> Boxd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncFiles:
    def __init__(self, files: Files) -> None:
        self._files = files

    async def upload(self, machine: str, path: str, data: str | bytes, *, mode: int = 0o644) -> int:
        """See :meth:`Files.upload`."""
        return await asyncio.to_thread(self._files.upload, machine, path, data, mode=mode)

    async def download(self, machine: str, path: str) -> bytes:
        """See :meth:`Files.download`."""
        return await asyncio.to_thread(self._files.download, machine, path)


class _AsyncMachines:
    """``AsyncBoxd.machines``: the same verbs, awaited; each runs in a worker thread, never on the loop."""

    def __init__(self, machines: MachinesResource) -> None:
        self._m = machines
        self.files = _AsyncFiles(machines.files)

    async def create(self, name: str | None = None, **kwargs: Any) -> Machine:
        """See :meth:`MachinesResource.create`."""
        return await asyncio.to_thread(self._m.create, name, **kwargs)

    async def get(self, machine: str) -> Machine:
        """See :meth:`MachinesResource.get`."""
        return await asyncio.to_thread(self._m.get, machine)

    async def list(self) -> list[Machine]:
        """See :meth:`MachinesResource.list`."""
        return await asyncio.to_thread(self._m.list)

    async def wait_until_ready(self, machine: str, timeout: float = 180.0, poll_interval: float = 1.0) -> Machine:
        """See :meth:`MachinesResource.wait_until_ready`."""
        return await asyncio.to_thread(self._m.wait_until_ready, machine, timeout, poll_interval)

    async def exec(self, machine: str, command: str | Sequence[str], **kwargs: Any) -> ExecResult:
        """See :meth:`MachinesResource.exec`."""
        return await asyncio.to_thread(self._m.exec, machine, command, **kwargs)

    async def fork(self, machine: str, new_name: str | None = None) -> Machine:
        """See :meth:`MachinesResource.fork`."""
        return await asyncio.to_thread(self._m.fork, machine, new_name)

    async def delete(self, machine: str) -> None:
        """See :meth:`MachinesResource.delete`."""
        await asyncio.to_thread(self._m.delete, machine)

    async def pause(self, machine: str) -> PauseResult:
        """See :meth:`MachinesResource.pause`."""
        return await asyncio.to_thread(self._m.pause, machine)

    async def resume(self, machine: str) -> ResumeResult:
        """See :meth:`MachinesResource.resume`."""
        return await asyncio.to_thread(self._m.resume, machine)

    def suggest_name(self) -> str:
        """See :meth:`MachinesResource.suggest_name`."""
        return self._m.suggest_name()


class AsyncBoxd:
    """``Boxd`` for asyncio: the same arguments, namespaces and verbs, awaited."""

    def __init__(self, **kwargs: Any) -> None:
        self._sync = Boxd(**kwargs)
        if self._sync._remote is not None:
            raise UserError("inside a machine that makes machines, use Boxd (AsyncBoxd runs machines itself)")
        self.machines = _AsyncMachines(self._sync._local)

    async def close(self) -> None:
        """See :meth:`Boxd.close`."""
        await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> AsyncBoxd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
