"""The Machines API, shaped like the boxd SDK: create, exec, stream_exec, files, fork, delete, list; sync and async.

Backends are named in :data:`BACKENDS` and imported only when chosen. A concurrency cap bounds how many machines
live at once; ``create`` and ``fork`` past the cap wait in a queue (up to ``queue_timeout_s``) for a delete.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from swarmyard.clock import Clock
from swarmyard.errors import InvalidInputError, NotFoundError, SandboxError, UserError
from swarmyard.ids import new_id
from swarmyard.machines import environment
from swarmyard.machines.idle import (
    DEFAULT_HIBERNATE_S,
    DEFAULT_IDLE_SUSPEND_S,
    Suspender,
    check_hibernate_s,
    check_idle_suspend_s,
)
from swarmyard.machines.networks import check_member_name, check_names
from swarmyard.machines.protocol import (
    BOOT_TIMEOUT_S,
    Backend,
    Baseline,
    ExecEvent,
    ExecResult,
    Isolation,
    Limits,
    MachineInfo,
    MachineSpec,
)

if TYPE_CHECKING:
    from swarmyard.machines.supervised import HostView

#: Backend name -> "module:Class"; imported only when asked for.
BACKENDS: dict[str, str] = {
    "local": "swarmyard.machines.local:LocalBackend",
    "process": "swarmyard.machines.process:ProcessBackend",
    "ray": "swarmyard.machines.ray:RayBackend",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
Command = str | Sequence[str]


class _EnvBackend(Backend, Protocol):
    def machine_env(self, machine_id: str) -> dict[str, str]: ...


def load_backend(name: str, root: Path | None = None) -> Backend:
    """Import and build a backend by name."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise UserError(
            f"unknown machines backend {name!r}; choose from {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(f"machines backend {name!r} is not available: {exc}") from exc
    return cast(Backend, getattr(module, class_name)(root))


def _argv(cmd: Command) -> list[str]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidInputError("command is empty", field="cmd")
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv) or any("\0" in a for a in argv):
        raise InvalidInputError("command must be a non-empty list of strings without NUL", field="cmd")
    return argv


#: The longest timeout a wait or an exec takes: 30 days; past about 1e10 s the clock's arithmetic overflows.
MAX_TIMEOUT_S = 30 * 86400.0


def check_timeout(value: object, *, field: str = "timeout") -> float:
    """``value`` as seconds when it is a number in (0, :data:`MAX_TIMEOUT_S`]; else ``InvalidInputError``.

    The range is checked before anything converts it: a 400-digit integer is an ``int`` that ``float()`` and
    ``math.isfinite`` raise ``OverflowError`` on, and a bool is an ``int`` too."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT_S:
        # NaN fails the range too: every comparison with it is false
        raise InvalidInputError(f"{field} must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f}",
                                field=field)
    return float(value)


#: The smallest disk a machine can be given: an ext4 file system needs a few MiB of its own.
MIN_DISK_BYTES = 16 << 20


def _check_limits(limits: Limits) -> Limits:
    for name in ("memory_bytes", "pids", "cpus", "disk_bytes"):
        value = getattr(limits, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            raise InvalidInputError(f"limit {name} must be positive", field=f"limits.{name}")
    disk = limits.disk_bytes
    if disk is not None and (not isinstance(disk, int) or disk < MIN_DISK_BYTES):
        raise InvalidInputError(f"limit disk_bytes must be a whole number of bytes, at least {MIN_DISK_BYTES}",
                                field="limits.disk_bytes")
    return limits


class Files:
    """``machines.files``: move files in and out of a machine (done by the machine itself, under its limits)."""

    def __init__(self, machines: Machines) -> None:
        self._machines = machines

    def upload(self, machine_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative paths are under the machine's home)."""
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError("upload data must be bytes", field="data")
        path = self._machines.path(path)
        with self._machines.idle.active(machine_id):
            self._machines.backend.upload(machine_id, path, bytes(data), mode)

    def upload_many(self, machine_id: str, files: Mapping[str, bytes], *, mode: int = 0o644) -> None:
        """Write several files at once (path -> data, all with ``mode``): on a backend that can, every file is
        sent before any answer is awaited, which costs about one upload's time instead of one per file."""
        if not all(isinstance(data, bytes | bytearray) for data in files.values()):
            raise InvalidInputError("upload data must be bytes", field="data")
        wanted = [(self._machines.path(path), bytes(data), mode) for path, data in files.items()]
        many = getattr(self._machines.backend, "upload_many", None)
        with self._machines.idle.active(machine_id):
            if many is not None:
                many(machine_id, wanted)
                return
            for path, data, file_mode in wanted:
                self._machines.backend.upload(machine_id, path, data, file_mode)

    def download(self, machine_id: str, path: str) -> bytes:
        """Read ``path`` from the machine."""
        path = self._machines.path(path)
        with self._machines.idle.active(machine_id):
            return self._machines.backend.download(machine_id, path)


class Machines:
    """The synchronous Machines API over one backend.

    ``idle_suspend_s``: a machine with no call and no network traffic for that long is frozen, and the next call
    wakes it (see :mod:`swarmyard.machines.idle`; ``None``: never); idle time is read from ``clock``.
    ``hibernate_s``: idle that long, its memory is released too (pushed to the host's swap; where the host has
    none the machine stays frozen and its ``hibernate_reason`` says so).
    """

    def __init__(
        self,
        backend: str | Backend = "local",
        *,
        root: Path | None = None,
        max_concurrent: int = 128,
        queue_timeout_s: float | None = None,
        isolation: Isolation | None = None,
        boot_timeout_s: float = BOOT_TIMEOUT_S,
        idle_suspend_s: float | None = DEFAULT_IDLE_SUSPEND_S,
        clock: Clock | None = None,
        hibernate_s: float | None = DEFAULT_HIBERNATE_S,
    ) -> None:
        if max_concurrent < 1:
            raise InvalidInputError("max_concurrent must be at least 1", field="max_concurrent")
        idle_suspend_s = check_idle_suspend_s(idle_suspend_s)  # before a backend is made for nothing
        check_hibernate_s(hibernate_s, None)
        self.backend: Backend = load_backend(backend, root) if isinstance(backend, str) else backend
        self.files = Files(self)
        #: freezes idle machines and wakes them on the next call
        self.idle = Suspender(self.backend, idle_suspend_s, clock=clock, hibernate_s=hibernate_s)
        self.isolation = isolation or Isolation()
        self.boot_timeout_s = boot_timeout_s
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._queue_timeout_s = queue_timeout_s
        self._names: dict[str, str] = {}
        self._envs: dict[str, Mapping[str, str]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Machines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, path: str) -> str:
        """A path inside a machine: relative ones are under its home folder."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise InvalidInputError("path must be a non-empty string", field="path")
        # Relative paths resolve against the init's working folder, which is the machine's home.
        return path

    def _spec(
        self,
        name: str,
        *,
        baseline: str | None,
        group: str | None,
        env: Mapping[str, str] | None,
        limits: Limits | None,
        isolation: Isolation | None,
        control_socket: Path | None,
        networks: Sequence[str] | None = None,
    ) -> MachineSpec:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInputError(
                "machine name must be 1-63 letters, digits, '.', '_' or '-'", field="name"
            )
        if control_socket is not None and not Path(control_socket).exists():
            raise InvalidInputError(f"control socket {control_socket} does not exist", field="control_socket")
        machine_id = new_id("m")
        backend = cast(_EnvBackend, self.backend)
        full_env = environment.build(backend.machine_env(machine_id), environment.validate(env or {}))
        return MachineSpec(
            id=machine_id,
            name=name,
            env=full_env,
            limits=_check_limits(limits or Limits()),
            isolation=isolation or self.isolation,
            group=group,
            baseline=baseline,
            control_socket=Path(control_socket) if control_socket else None,
            networks=self._networks(name, networks),
        )

    @staticmethod
    def _networks(name: str, networks: Sequence[str] | None) -> tuple[str, ...]:
        names = check_names(networks)
        if names:
            check_member_name(name)
        return names

    def _claim(self, name: str, machine_id: str) -> None:
        with self._lock:
            if name in self._names:
                raise InvalidInputError(f"a machine named {name!r} already exists", field="name")
            self._names[name] = machine_id
            self._envs[machine_id] = {}
        if not self._slots.acquire(timeout=self._queue_timeout_s):
            with self._lock:
                self._names.pop(name, None)
            raise SandboxError(f"no machine slot freed within {self._queue_timeout_s} s", retryable=True)

    def _unclaim(self, name: str, machine_id: str | None = None) -> None:
        """Give the slot of ``name`` back (once: a second call for the same machine finds it gone)."""
        with self._lock:
            held = self._names.get(name)
            if held is None or (machine_id is not None and held != machine_id):
                return
            del self._names[name]
            self._envs.pop(held, None)
        self._slots.release()

    def create(
        self,
        name: str,
        baseline: str | None = None,
        group: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        isolation: Isolation | None = None,
        control_socket: Path | None = None,
        networks: Sequence[str] | None = None,
    ) -> MachineInfo:
        """Create a machine and start it booting; waits in the queue while the concurrency cap is reached.

        ``networks``: private networks it joins once ready (names resolve as ``<name>.yard`` between machines
        that share one); none keeps it isolated: loopback and the control plane only."""
        spec = self._spec(
            name,
            baseline=baseline,
            group=group,
            env=env,
            limits=limits,
            isolation=isolation,
            control_socket=control_socket,
            networks=networks,
        )
        return self._start(name, spec, lambda: self.backend.create(spec))

    def _start(self, name: str, spec: MachineSpec, boot: Callable[[], MachineInfo]) -> MachineInfo:
        """Take a slot under ``name`` (queueing at the cap), then boot; a failed boot gives the slot back."""
        self._claim(name, spec.id)
        self._envs[spec.id] = spec.env
        try:
            info = boot()
        except BaseException:
            self._unclaim(name)
            raise
        self.idle.started(info.id)
        return info

    def fork(
        self,
        source: str,
        name: str,
        *,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        control_socket: Path | None = None,
    ) -> MachineInfo:
        """A new machine whose disk starts as a copy-on-write snapshot of ``source``'s."""
        spec = self._spec(
            name,
            baseline=None,
            group=None,
            env=env,
            limits=limits,
            isolation=None,
            control_socket=control_socket,
        )
        with self.idle.active(source):
            return self._start(name, spec, lambda: self.backend.fork(source, spec))

    def host_view(self, machine_id: str) -> HostView | None:
        """The machine's files and processes as seen from outside it (``None``: this backend cannot see in)."""
        from swarmyard.machines.supervised import HostView

        see = getattr(self.backend, "host_view", None)
        view = None if see is None else see(machine_id)
        return view if isinstance(view, HostView) else None

    def wait_until_ready(self, machine_id: str, timeout_s: float | None = None) -> MachineInfo:
        """Block until the machine can run commands."""
        with self.idle.active(machine_id):
            return self.idle.describe(self.backend.wait_until_ready(machine_id, timeout_s or self.boot_timeout_s))

    def exec(
        self,
        machine_id: str,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string or an argv list); a timeout kills the command's whole process tree."""
        argv, kwargs = self._exec_args(machine_id, cmd, timeout, env, cwd)
        with self.idle.active(machine_id):
            return self.backend.exec(machine_id, argv, stdin=stdin, **kwargs)

    def stream_exec(
        self,
        machine_id: str,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> Iterator[ExecEvent]:
        """Run ``cmd``, yielding ``stdout``/``stderr`` events as they come and one ``exit`` event last."""
        argv, kwargs = self._exec_args(machine_id, cmd, timeout, env, cwd)
        self.idle.wake(machine_id)
        events = self.backend.stream_exec(machine_id, argv, stdin=stdin, **kwargs)
        return _held(events, self.idle.active(machine_id))

    def _exec_kwargs(
        self, machine_id: str, timeout: float | None, env: Mapping[str, str] | None, cwd: str | None
    ) -> dict[str, Any]:
        timeout_s = None if timeout is None else check_timeout(timeout)
        base = self._machine_env(machine_id)
        merged = {**base, **environment.validate(env or {})}
        return {"env": merged, "cwd": None if cwd is None else self.path(cwd), "timeout_s": timeout_s}

    def _exec_args(
        self,
        machine_id: str,
        cmd: Command,
        timeout: float | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> tuple[list[str], dict[str, Any]]:
        argv = _argv(cmd)
        return argv, self._exec_kwargs(machine_id, timeout, env, cwd)

    def _machine_env(self, machine_id: str) -> Mapping[str, str]:
        with self._lock:
            env = self._envs.get(machine_id)
        if env is None:
            raise NotFoundError("machine", machine_id)
        return env

    def delete(self, machine_id: str) -> None:
        """Kill everything in the machine and remove its disk, mounts and cgroups."""
        with self._lock:
            name = next((n for n, held in self._names.items() if held == machine_id), None)
        self.idle.forget(machine_id)
        try:
            self.backend.delete(machine_id)
        finally:
            # a teardown that failed half-way still frees the slot once the backend has let the machine go;
            # kept, it would hold a place of the cap that no later delete could give back
            if name is not None and all(info.id != machine_id for info in self.backend.list()):
                self._unclaim(name, machine_id)

    def list(self) -> list[MachineInfo]:
        """Live machines."""
        return [self.idle.describe(info) for info in self.backend.list()]

    def prepare_baseline(self, name: str, source: Path) -> Baseline:
        """Freeze a folder (a checked-out repo with its dependencies) as a baseline for ``create(baseline=)``."""
        if not _NAME.match(name):
            raise InvalidInputError(
                "baseline name must be 1-63 letters, digits, '.', '_' or '-'", field="name"
            )
        return self.backend.prepare_baseline(name, Path(source))

    def close(self) -> None:
        """Delete every machine."""
        self.idle.close()
        for info in self.list():
            self.delete(info.id)
        self.backend.close()


def _held(events: Iterator[ExecEvent], awake: AbstractContextManager[None]) -> Iterator[ExecEvent]:
    """``events``, read inside ``awake``: entered at the first read (a stream never read holds nothing), left
    once they end or the reader stops reading them."""
    with awake:
        yield from events


class AsyncMachines:
    """The same API for asyncio: every blocking call runs in a worker thread, never on the event loop."""

    def __init__(self, machines: Machines) -> None:
        self.sync = machines

    async def create(
        self, name: str, baseline: str | None = None, group: str | None = None, **kwargs: Any
    ) -> MachineInfo:
        """See :meth:`Machines.create`."""
        return await asyncio.to_thread(self.sync.create, name, baseline, group, **kwargs)

    async def fork(self, source: str, name: str, **kwargs: Any) -> MachineInfo:
        """See :meth:`Machines.fork`."""
        return await asyncio.to_thread(self.sync.fork, source, name, **kwargs)

    async def wait_until_ready(self, machine_id: str, timeout_s: float | None = None) -> MachineInfo:
        """See :meth:`Machines.wait_until_ready`."""
        return await asyncio.to_thread(self.sync.wait_until_ready, machine_id, timeout_s)

    async def exec(self, machine_id: str, cmd: Command, **kwargs: Any) -> ExecResult:
        """See :meth:`Machines.exec`."""
        return await asyncio.to_thread(self.sync.exec, machine_id, cmd, **kwargs)

    async def stream_exec(self, machine_id: str, cmd: Command, **kwargs: Any) -> AsyncIterator[ExecEvent]:
        """See :meth:`Machines.stream_exec`; events are handed over from a worker thread as they come."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[ExecEvent | BaseException | None] = asyncio.Queue()

        def pump() -> None:
            try:
                for event in self.sync.stream_exec(machine_id, cmd, **kwargs):
                    loop.call_soon_threadsafe(events.put_nowait, event)
                loop.call_soon_threadsafe(events.put_nowait, None)
            except BaseException as exc:  # handed to the awaiting task
                loop.call_soon_threadsafe(events.put_nowait, exc)

        worker = asyncio.ensure_future(asyncio.to_thread(pump))
        while (item := await events.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
        await worker

    async def upload(self, machine_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """See :meth:`Files.upload`."""
        await asyncio.to_thread(self.sync.files.upload, machine_id, path, data, mode=mode)

    async def download(self, machine_id: str, path: str) -> bytes:
        """See :meth:`Files.download`."""
        return await asyncio.to_thread(self.sync.files.download, machine_id, path)

    async def delete(self, machine_id: str) -> None:
        """See :meth:`Machines.delete`."""
        await asyncio.to_thread(self.sync.delete, machine_id)

    async def list(self) -> list[MachineInfo]:
        """See :meth:`Machines.list`."""
        return await asyncio.to_thread(self.sync.list)
