"""Machinery shared by backends whose machines run the swarmyard init: spawning, readiness, disks, teardown.

A subclass says how to wrap the init (bubblewrap for ``local``, nothing for ``process``); everything a machine
does after boot goes through :class:`~swarmyard.machines.client.InitClient`, so both backends behave alike.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from stat import S_ISDIR, S_ISLNK
from typing import Any

import swarmyard
from swarmyard.errors import (
    InsecureRootError,
    MachineNotRespondingError,
    MachineNotRunningError,
    MachineRefusedError,
    NotFoundError,
    SandboxError,
    SandboxUnavailableError,
    UserError,
)
from swarmyard.ids import new_id
from swarmyard.machines import checkpoint, live
from swarmyard.machines.cgroups import MachineCgroups
from swarmyard.machines.client import InitClient
from swarmyard.machines.disks import Disk, clone_tree, space_template, unmount
from swarmyard.machines.launchers import ParkedLauncher
from swarmyard.machines.pids import alive, inside, owner_line, read_owner, start_time
from swarmyard.machines.protocol import (
    BOOT_TIMEOUT_S,
    TRANSITIONS,
    Baseline,
    ExecEvent,
    ExecResult,
    Limits,
    MachineInfo,
    MachineSpec,
    MachineState,
    OutputCap,
)

_log = logging.getLogger(__name__)
#: The disk quota a machine gets unless its limits say otherwise.
DEFAULT_DISK_BYTES = Limits().disk_bytes
#: The package's import root, put on the init's ``sys.path`` (it runs with ``-I -S`` to start fast).
SOURCE_ROOT = str(Path(swarmyard.__file__).resolve().parent.parent)
# The init needs only stdlib modules of this package: bare package objects skip the package __init__s (and the
# typing-heavy error tree they import), which halves the init's start-up time.
_BOOT = (
    "import sys,types\n"
    "for n in ('swarmyard','swarmyard.guest'):\n"
    " m=types.ModuleType(n);m.__path__=[{root!r}+'/'+n.replace('.','/')];sys.modules[n]=m\n"
    "from swarmyard.guest.init import main;main()"
)

log = logging.getLogger(__name__)


def default_root() -> Path:
    """Where machines live unless told otherwise: a private folder under the temp dir."""
    return Path(tempfile.gettempdir()) / f"swarmyard-machines-{os.getuid()}"


def open_root(root: Path | None = None) -> Path:
    """The machines root (``root``, or :func:`default_root`) made ready: created mode 0700 if missing, refused with
    :class:`InsecureRootError` when another user owns it or others may write it, and left mode 0700. The default
    lies in the shared temp dir, where anyone may make a folder of that name first; whoever could write the root
    would plant snapshots, baselines and machine records in it.

    As OpenSSH's StrictModes, the way to it is checked too, before anything is made: every folder above it (of
    the path as resolved) and every symbolic link on the way must be root's or this user's, and no folder above it
    writable by others unless sticky (``/tmp``: others may not rename what is ours in it). Else whoever may
    rename an entry on the way swaps the root for one of their own while the client runs."""
    path = Path(root) if root is not None else default_root()
    fix = "remove it, or give --root / Boxd(root=...) a folder of your own"
    for _ in range(3):  # a missing folder another client of the root made at the same time: walk again
        resolved, missing = _walk_root(path, fix)
        try:
            for part in missing:
                resolved = resolved / part
                resolved.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise InsecureRootError(str(path), f"cannot be made ({exc.strerror})", fix) from exc
        break
    else:
        raise InsecureRootError(str(path), "changed while it was being made", fix)
    uid = os.geteuid()
    try:
        info = resolved.lstat()
    except OSError as exc:
        raise InsecureRootError(str(path), f"cannot be read ({exc.strerror})", fix) from exc
    if not S_ISDIR(info.st_mode):
        raise InsecureRootError(str(resolved), "is not a folder", fix)
    if info.st_uid != uid:
        raise InsecureRootError(str(resolved), f"belongs to uid {info.st_uid}, not to this user (uid {uid})", fix)
    if info.st_mode & 0o022:
        raise InsecureRootError(str(resolved), f"others may write it (mode {info.st_mode & 0o7777:o})", fix)
    if info.st_mode & 0o7777 != 0o700:
        os.chmod(resolved, 0o700)  # this user's: what lives in it is no one else's to read
    return resolved


#: Symbolic links followed on the way to a root before it is refused (the kernel's own limit).
_MAX_LINKS = 40


def _walk_root(path: Path, fix: str) -> tuple[Path, list[str]]:
    """Resolve ``path`` as the kernel would, checking every folder on the way and every symbolic link followed
    (see :func:`open_root`); returns the deepest folder that exists and the names left to make under it."""
    uid = os.geteuid()
    todo = list(path.absolute().parts[1:])
    here = Path("/")
    links = 0
    while True:
        try:
            info = here.lstat()
        except OSError as exc:
            raise InsecureRootError(str(path), f"cannot be read ({exc.strerror} at {here})", fix) from exc
        if not todo:
            return here, []
        if not S_ISDIR(info.st_mode):
            raise InsecureRootError(str(path), f"lies under {here}, which is not a folder", fix)
        if info.st_uid not in (0, uid):
            raise InsecureRootError(str(path), f"lies in {here}, which uid {info.st_uid} owns", fix)
        if info.st_mode & 0o022 and not info.st_mode & 0o1000:
            raise InsecureRootError(str(path), f"lies in {here}, which others may write and is not sticky "
                                               f"(mode {info.st_mode & 0o7777:o})", fix)
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            here = here.parent
            continue
        step = here / part
        try:
            link = step.lstat()
        except FileNotFoundError:
            if any(p in ("", ".", "..") for p in todo):
                raise InsecureRootError(str(path), f"names {step}, which does not exist, then '..'", fix) from None
            return here, [part, *todo]
        except OSError as exc:
            raise InsecureRootError(str(path), f"cannot be read ({exc.strerror} at {step})", fix) from exc
        if not S_ISLNK(link.st_mode):
            here = step
            continue
        if link.st_uid not in (0, uid):
            raise InsecureRootError(str(path), f"goes through {step}, a symbolic link that uid {link.st_uid} made",
                                    fix)
        links += 1
        if links > _MAX_LINKS:
            raise InsecureRootError(str(path), f"goes through more than {_MAX_LINKS} symbolic links", fix)
        target = Path(os.readlink(step))
        if target.is_absolute():
            here = Path("/")
            todo = [*target.parts[1:], *todo]
        else:
            todo = [*target.parts, *todo]


def _not_running(machine_id: str) -> MachineNotRunningError:
    return MachineNotRunningError(f"machine {machine_id} is not running: its init has ended (a process in it may "
                                  "kill it); only a delete is left to do", machine_id=machine_id)


def init_argv(python: str, config: Mapping[str, Any]) -> list[str]:
    """The command that starts the init with its JSON config."""
    return [python, "-I", "-S", "-c", _BOOT.format(root=SOURCE_ROOT), json.dumps(config)]


@dataclass(slots=True)
class Launch:
    """How a subclass starts one machine's init."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    cgroup_procs: list[str] = field(default_factory=list)
    rlimits: dict[int, int] = field(default_factory=dict)
    close_after: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HostView:
    """A machine seen from outside it, where nothing its processes do can change what is read: its files
    through the root of a process in its mount namespace, and the host pids of its processes."""

    root: Path
    pids: tuple[int, ...]
    #: the machine's mount namespace (``/proc/PID/ns/mnt``): a pid read later is checked to be still the machine's
    namespace: str
    #: the machine's own disk, as the machine names it
    home: str


@dataclass(slots=True)
class Machine:
    """A backend's record of one machine."""

    info: MachineInfo
    spec: MachineSpec
    root: Path
    disk: Disk
    layers: tuple[str, ...]
    client: InitClient
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    cgroups: MachineCgroups | None = None
    #: A launcher started ahead of demand, already in ``cgroups``, until it is sent the sandbox command.
    parked: ParkedLauncher | None = None
    #: The sandbox's stderr (a memfd: no file to create per machine); read when a boot fails.
    log_fd: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The sandbox's pid 1 and its init (pid 2) as host ``(pid, start time)`` pairs, found once under the sandbox
    #: process of this pid (see ``SupervisedBackend._check_answering``).
    stop_watch: tuple[int, tuple[tuple[int, str], ...]] | None = None

    def move(self, state: MachineState, **changes: Any) -> None:
        """Change state along the transition table."""
        if state is not self.info.state and state not in TRANSITIONS[self.info.state]:
            raise SandboxError(f"machine {self.info.id}: cannot go from {self.info.state} to {state}")
        self.info = replace(self.info, state=state, **changes)


class _Spawner:
    """Starts every child from one long-lived thread.

    bwrap's ``--die-with-parent`` (PR_SET_PDEATHSIG) fires when the *thread* that forked it exits, so a machine
    created from a short-lived worker thread would die with that thread.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="machines-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((start, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            start, done = self._jobs.get()
            try:
                done.set_result(start())
            except BaseException as exc:  # handed back to the caller's thread
                done.set_exception(exc)


_SPAWNER = _Spawner()


def _join_cgroups_and_limits(procs: list[str], rlimits: dict[int, int]) -> Callable[[], None]:
    def before_exec() -> None:
        import resource

        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0" is the writing process itself
            finally:
                os.close(fd)
        for kind, value in rlimits.items():
            resource.setrlimit(kind, (value, value))

    return before_exec


class SupervisedBackend:
    """Base for backends that boot the swarmyard init in each machine; see :mod:`swarmyard.machines.protocol`."""

    name = "supervised"
    #: The init's control socket as the init sees it; subclasses bind a host folder there.
    overlay = False

    #: A host-side launcher that joins the machine's cgroups and sets its rlimits before it execs the sandbox
    #: (the compiled init's ``--launch`` mode); without one a ``preexec_fn`` does it, at the price of a full fork.
    launcher: Path | None = None
    #: Whether each disk gets a ``.tmp`` folder (the ``process`` backend's TMPDIR; ``local`` has a tmpfs /tmp).
    disk_tmp = True
    #: Whether the launcher mounts each overlay disk in a mount namespace of the machine's own (else this
    #: process mounts it in its own namespace).
    mounts_in_launcher = False

    def __init__(self, root: Path | None = None, *, output_cap: OutputCap | None = None) -> None:
        """``output_cap``: how much of each exec's stdout and stderr the host keeps (a head and a tail)."""
        self.root = open_root(root)
        self.output_cap = output_cap or OutputCap()
        for part in ("m", "layers", "baselines", "empty"):
            (self.root / part).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._machines: dict[str, Machine] = {}
        self._lock = threading.Lock()
        self.reap_orphans()

    def reap_orphans(self) -> list[str]:
        """Tear down machines whose owning process died without deleting them (SIGKILL, a power cut).

        Their sandboxes died with their owner (``--die-with-parent``); what can outlive it is the disk's
        mount and folder. A machine folder names its owner (pid and start time); one whose owner is gone is
        unmounted and removed. Returns the machine ids reaped.
        """
        reaped: list[str] = []
        for folder in sorted((self.root / "m").iterdir()):
            if folder.name.startswith("."):  # a folder being made (see make_folder): its name says whose
                parts = folder.name.split(".")
                if len(parts) == 4 and parts[2].isdigit() and not alive(int(parts[2]), parts[3]):
                    shutil.rmtree(folder, ignore_errors=True)
                continue
            owner = read_owner(folder / "owner")
            if owner is not None and alive(*owner):
                continue
            try:
                if owner is None and time.time() - folder.stat().st_mtime < 600:
                    continue  # being made right now by another process (the owner file comes first but be safe)
            except FileNotFoundError:
                continue  # its live owner deleted it while we looked (another backend on this root)
            for mounted in (folder / "disk", folder / "space"):
                with contextlib.suppress(OSError, SandboxError):
                    if mounted.is_mount():
                        unmount(mounted)
            subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], env={"PATH": "/usr/bin:/bin"},
                           check=False, capture_output=True)
            # The folder's name is its cgroups' name too (a machine id, or a parked launcher's slot).
            self._reap_cgroups(folder.name)
            if not folder.exists():
                reaped.append(folder.name)
        if reaped:
            log.info("reaped %d machines whose owner had died", len(reaped))
        return reaped

    # -- what a subclass provides -------------------------------------------------------------------------------

    def networks_refusal(self) -> str | None:
        """Why machines of this backend cannot join private networks (``MachineSpec.networks``), if they cannot."""
        return f"the {self.name} backend has no private networks: its machines share the host's network"

    def _launch(self, machine: Machine, ready_w: int) -> Launch:
        raise NotImplementedError

    def _make_cgroups(self, machine: Machine) -> MachineCgroups | None:
        return None

    def _reap_cgroups(self, name: str) -> None:
        """Remove the cgroups a machine folder's dead owner left behind (backends with cgroups)."""

    def _take_parked(self, spec: MachineSpec) -> ParkedLauncher | None:
        """A launcher (with its folder) made ahead of demand for this machine, if the backend keeps any."""
        return None

    def make_folder(self, name: str, disk_bytes: int | None = DEFAULT_DISK_BYTES) -> Path:
        """Make a machine's folder under ``m/``: its owner file, its control folder and its disk's folders.

        A machine's folder is named after the machine, or after the parked launcher it was made for ahead of
        demand (``slot_...``); either way its owner file lets :meth:`reap_orphans` find it. ``disk_bytes``: the
        disk's quota (a backend that cannot enforce one makes a plain disk).
        """
        root = self.root / "m" / name
        # Made under a name that says whose it is, its owner file written, then renamed: a process killed between
        # the mkdir and the owner file leaves a folder the reaper can still tell is dead.
        making = root.with_name(f".{name}.{os.getpid()}.{start_time(os.getpid())}")
        making.mkdir(mode=0o700)
        (making / "owner").write_text(owner_line())
        making.rename(root)
        (root / "ctl").mkdir()
        owner = self.sandbox_owner()
        space = self.space_bytes(disk_bytes)
        template = None if space is None else space_template(self.root / "images", space, owner)
        Disk(root, lowers=(), overlay=self.overlay, space_bytes=space).make_folders(owner, template)
        if owner is not None:
            os.chown(root / "ctl", *owner)  # the init binds its control socket there
        return root

    def sandbox_owner(self) -> tuple[int, int] | None:
        """The host uid and gid a machine's own folders must belong to (``None``: this process's own)."""
        return None

    def space_bytes(self, disk_bytes: int | None) -> int | None:
        """The quota a disk asking for ``disk_bytes`` gets here (``None``: this backend enforces none)."""
        return None

    def tmpfs_bytes(self, disk_bytes: int | None) -> int | None:
        """The size of the tmpfs the sandbox mounts as a disk asking for ``disk_bytes`` (``None``: none)."""
        return None

    def _enforced(self, machine: Machine, landlock_abi: int) -> tuple[str, ...]:
        return ()

    def sandbox_prefix(self) -> str:
        """The machine's home folder as its commands see it."""
        raise NotImplementedError

    def machine_env(self, machine_id: str) -> dict[str, str]:
        """The variables every machine starts with, before the caller's."""
        raise NotImplementedError

    def disk_args(self, disk: Disk) -> list[str]:
        """The launcher's options that mount ``disk`` in a mount namespace of its own."""
        return ["--private-mounts", *disk.space_args(), "--disk", str(disk.merged), disk.overlay_options()]

    def _launcher_argv(self, launch: Launch, disk: Disk | None = None) -> list[str]:
        argv = [str(self.launcher), "--launch"]
        for procs in launch.cgroup_procs:
            argv += ["--join", procs]
        for kind, value in launch.rlimits.items():
            if kind != resource.RLIMIT_AS:
                raise SandboxError(f"the launcher sets only RLIMIT_AS, not rlimit {kind}")
            argv += ["--rlimit-as", str(value)]
        if disk is not None:
            argv += self.disk_args(disk)  # after the joins: those open files under /sys
        return [*argv, "--", *launch.argv]

    def _socket_path(self, root: Path) -> Path:
        return root / "ctl" / "init.sock"

    # -- the Backend protocol -----------------------------------------------------------------------------------

    def create(self, spec: MachineSpec) -> MachineInfo:
        """Start booting a machine on a fresh disk, or on a baseline's."""
        lowers: tuple[Path, ...] = ()
        if spec.baseline is not None:
            path = self._baseline_path(spec.baseline)
            if path.is_symlink():
                # a snapshot's name (``workers.baseline = "NAME"``): the machine runs on the version it points at
                # now, and is recorded so, or that version could be deleted under it (see Snapshots.delete)
                version = os.readlink(path)
                spec = replace(spec, baseline=version)
                path = self._baseline_path(version)
            lowers = (path,)
        return self._boot(spec, lowers=lowers, layers=(), forked_from=None)

    def fork(self, source_id: str, spec: MachineSpec) -> MachineInfo:
        """Start a machine on a copy-on-write snapshot of ``source_id``'s disk."""
        source = self._get(source_id)
        if self._gone(source):
            raise _not_running(source_id)
        with self._on_init(source):
            return self._fork(source, spec)

    def _fork(self, source: Machine, spec: MachineSpec) -> MachineInfo:
        source_id = source.info.id
        layer_id = new_id("layer")
        layer = self.root / "layers" / layer_id
        through = Path("/")
        if self.overlay and self.mounts_in_launcher and source.proc is not None:
            # Mounted in the source's own mount namespace: seen from here through its sandbox process's root.
            through = Path(f"/proc/{source.proc.pid}/root")
        if source.disk.tmpfs_bytes is not None:
            clone_tree(self._tmpfs_disk(source), layer)  # a snapshot of the whole disk, made from the host
            return self._boot(spec, lowers=(), layers=(), forked_from=source_id, seed=layer)
        lowers = source.disk.snapshot(layer, through)
        if not self.overlay:
            # Without overlayfs the snapshot is the whole disk; it becomes the fork's disk directly.
            return self._boot(spec, lowers=(), layers=(), forked_from=source_id, seed=layer)
        return self._boot(
            replace(spec, baseline=source.spec.baseline),
            lowers=lowers,
            layers=(layer_id, *source.layers),
            forked_from=source_id,
        )

    def _baseline_path(self, name: str) -> Path:
        path = self.root / "baselines" / name
        # a folder of the baselines, never a path out of them ("..", "a/../../x") nor one being made (".x")
        if "/" in name or "\0" in name or name.startswith(".") or not path.is_dir():
            raise NotFoundError("baseline", name)
        return path

    def _boot(
        self,
        spec: MachineSpec,
        *,
        lowers: tuple[Path, ...],
        layers: tuple[str, ...],
        forked_from: str | None,
        seed: Path | None = None,
    ) -> MachineInfo:
        if spec.networks and (reason := self.networks_refusal()) is not None:
            raise SandboxUnavailableError(reason, machine_id=spec.id)  # before anything is made
        parked = self._take_parked(spec)
        if parked is not None and parked.folder is not None:
            root = parked.folder
        else:
            root = self.make_folder(spec.id, spec.limits.disk_bytes)
        disk = Disk(
            root, lowers=lowers if self.overlay else (), overlay=self.overlay, empty=self.root / "empty", made=True,
            space_bytes=self.space_bytes(spec.limits.disk_bytes),
            tmpfs_bytes=self.tmpfs_bytes(spec.limits.disk_bytes),
        )
        if disk.tmpfs_bytes is not None and (lowers or seed is not None):
            # The sandbox copies its seed onto its tmpfs itself: a baseline is bound as it is, a snapshot from here.
            if seed is not None:
                seed.rename(disk.merged)
            disk.seed = lowers[0] if lowers else disk.merged
        elif not self.overlay and lowers:
            clone_tree(lowers[0], disk.merged)
        elif seed is not None:
            seed.rename(disk.merged)
        info = MachineInfo(
            id=spec.id,
            name=spec.name,
            backend=self.name,
            state=MachineState.BOOTING,
            created_at=time.time(),
            group=spec.group,
            baseline=spec.baseline,
            forked_from=forked_from,
            disk=str(disk.merged),
        )
        if forked_from is not None:
            memory = checkpoint.fork_memory(self.name)  # never silent: a fork of the disk only says why
            info = replace(info, fork_memory=memory.kept, fork_memory_reason=memory.reason)
        machine = Machine(
            info=info,
            spec=spec,
            root=root,
            disk=disk,
            layers=layers,
            client=InitClient(spec.id, self._socket_path(root), self.output_cap),
            parked=parked,
        )
        with self._lock:
            self._machines[spec.id] = machine
        try:
            if not (self.overlay and self.mounts_in_launcher):
                disk.mount()
            if self.disk_tmp:
                (disk.merged / ".tmp").mkdir(exist_ok=True)
            machine.cgroups = self._make_cgroups(machine)
            ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
            machine.ready_fd = ready_r
            launch: Launch | None = None
            try:
                launch = self._launch(machine, ready_w)
                machine.log_fd = os.memfd_create("swarmyard-init-log", os.MFD_CLOEXEC)
                machine.proc = self._spawn(machine, launch, ready_w, machine.log_fd)
            finally:
                os.close(ready_w)
                for fd in launch.close_after if launch is not None else ():
                    os.close(fd)
        except BaseException:
            self._teardown(machine)
            raise
        return machine.info

    def _spawn(self, machine: Machine, launch: Launch, ready_w: int, log_fd: int) -> subprocess.Popen[bytes]:
        """Start the sandbox: through the machine's parked launcher when it has one, else a new process."""
        if machine.parked is not None:
            parked, machine.parked = machine.parked, None
            fds = {log_fd: 2, ready_w: ready_w, **{fd: fd for fd in launch.pass_fds}}
            rlimit_as = launch.rlimits.get(resource.RLIMIT_AS)
            if set(launch.rlimits) - {resource.RLIMIT_AS}:
                raise SandboxError(f"the launcher sets only RLIMIT_AS, not {sorted(launch.rlimits)}")
            disk = None
            if self.overlay and self.mounts_in_launcher and (machine.disk.lowers or not parked.premounted):
                disk = (machine.disk.merged, machine.disk.overlay_options())
            try:
                return parked.launch(launch.argv, launch.env, fds, rlimit_as, disk)
            except SandboxError as exc:
                # It died while parked (killed from outside): its groups stay the machine's; start a new one.
                parked.proc.wait()
                log.warning("machine %s: %s; starting a launcher", machine.info.id, exc)
        preexec = None
        private_disk = self.overlay and self.mounts_in_launcher
        if launch.cgroup_procs or launch.rlimits or private_disk:
            if self.launcher is not None:
                launch.argv = self._launcher_argv(launch, machine.disk if private_disk else None)
            else:
                preexec = _join_cgroups_and_limits(launch.cgroup_procs, launch.rlimits)
        return _SPAWNER.spawn(
            lambda: subprocess.Popen(
                launch.argv,
                env=launch.env,
                pass_fds=(ready_w, *launch.pass_fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_fd,
                preexec_fn=preexec,
                close_fds=True,
            )
        )

    def wait_until_ready(self, machine_id: str, timeout_s: float) -> MachineInfo:
        """Block until the init has reported ready (or failed)."""
        machine = self._get(machine_id)
        with machine.lock:
            if machine.info.state is MachineState.READY and not self._gone(machine):
                return machine.info
            if machine.info.state is MachineState.FAILED:
                raise _not_running(machine_id)
            if machine.info.state is not MachineState.BOOTING or machine.ready_fd is None:
                raise SandboxError(f"machine {machine_id} is {machine.info.state}", machine_id=machine_id)
            # poll, not select: a host process with hundreds of machines holds descriptors past select's 1024
            poller = select.poll()
            poller.register(machine.ready_fd, select.POLLIN)
            if not poller.poll(timeout_s * 1000):
                raise SandboxError(
                    f"machine {machine_id} did not become ready in {timeout_s} s",
                    machine_id=machine_id,
                    retryable=True,
                )
            line = _read_line(machine.ready_fd)
            os.close(machine.ready_fd)
            machine.ready_fd = None
            status = json.loads(line) if line else {"error": self._boot_log(machine)}
            if "error" in status:
                machine.move(MachineState.FAILED)
                raise SandboxError(
                    f"machine {machine_id} failed to boot: {status['error']}", machine_id=machine_id
                )
            machine.move(
                MachineState.READY,
                relay_port=status.get("relay_port"),
                enforced=self._enforced(machine, int(status.get("landlock_abi", 0))),
            )
            if machine.disk.tmpfs_bytes is not None and machine.disk.seed == machine.disk.merged:
                # The machine copied its fork's snapshot onto its tmpfs: the host's disk need not keep it.
                for entry in machine.disk.merged.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            if machine.proc is not None:
                started = start_time(machine.proc.pid)
                through, disk = self._disk_seen(machine)
                if started is not None:  # else it died just now: no live machine to record
                    live.write_record(machine.root, live.LiveMachine(
                        machine.info.id, machine.info.name, os.getuid(), machine.proc.pid, started, through,
                        str(disk), machine.info.baseline))
            return machine.info

    def _disk_seen(self, machine: Machine) -> tuple[str, Path]:
        """How the machine's disk is seen from outside it (see :class:`~swarmyard.machines.live.LiveMachine`)."""
        if machine.disk.tmpfs_bytes is not None:
            return "inside", Path(self.sandbox_prefix())
        if self.overlay and self.mounts_in_launcher:
            return "sandbox", machine.disk.merged
        return "host", machine.disk.merged

    def _boot_log(self, machine: Machine) -> str:
        if machine.log_fd is None:
            return "init exited"
        size = os.fstat(machine.log_fd).st_size
        tail = os.pread(machine.log_fd, 2000, max(size - 2000, 0))
        status = machine.proc.poll() if machine.proc is not None else None
        return tail.decode(errors="replace").strip() or f"init exited (status {status})"

    def _ready(self, machine_id: str) -> Machine:
        self.wait_until_ready(machine_id, BOOT_TIMEOUT_S)
        return self._get(machine_id)

    def _gone(self, machine: Machine, wait_s: float = 0.0) -> bool:
        """Whether a machine that was ready has lost its init (a process inside may kill it: it runs as the same
        user as the commands): its sandbox process has exited, or does within ``wait_s``. It is then ``failed``."""
        if machine.info.state is MachineState.FAILED:
            return True
        if machine.info.state is not MachineState.READY or machine.proc is None:
            return False
        try:
            machine.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        machine.move(MachineState.FAILED)
        log.warning("machine %s: its init is gone (exit status %s)", machine.info.id, machine.proc.returncode)
        return True

    def _check_answering(self, machine: Machine) -> None:
        """Refuse at once a call to a machine whose init a process inside has stopped (``kill -STOP``): the init
        would take the request and never answer it (an exec with no timeout would wait for ever)."""
        # Asked before every call and twice a second by every waiting exec (hundreds at once in a swarm): the two
        # processes are found once by a walk of /proc, then only their stat lines are read.
        if machine.proc is None:
            return
        watch = machine.stop_watch
        if watch is None or watch[0] != machine.proc.pid:
            found = _sandbox_init_pids(machine.proc.pid)
            watch = (machine.proc.pid, found)
            if len(found) == 2:
                machine.stop_watch = watch
        if _stopped(watch[1]):
            raise MachineNotRespondingError(f"machine {machine.info.id} is not responding: its init is stopped (a "
                                            "process in it may stop it); a delete still works",
                                            machine_id=machine.info.id)

    @contextlib.contextmanager
    def _on_init(self, machine: Machine) -> Iterator[None]:
        """Around a call that reaches the machine's init: a failure that its init's end explains is said as such
        (a 409 with no host path or pid in it), not as a broken connection or a copy that found nothing."""
        self._check_answering(machine)
        try:
            yield
        except (MachineRefusedError, MachineNotRespondingError):
            raise
        except SandboxError as exc:
            # the init's socket refuses before the sandbox process has exited: give it a moment to
            if self._gone(machine, wait_s=5.0):
                raise _not_running(machine.info.id) from exc
            raise

    def exec(
        self,
        machine_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
    ) -> ExecResult:
        """Run a command in the machine."""
        machine = self._ready(machine_id)
        with self._on_init(machine):
            return machine.client.exec(argv, env=env, cwd=cwd, timeout_s=timeout_s, stdin=stdin,
                                       answering=functools.partial(self._check_answering, machine))

    def stream_exec(
        self,
        machine_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
    ) -> Iterator[ExecEvent]:
        """Run a command, yielding its output as it comes."""
        machine = self._ready(machine_id)
        self._check_answering(machine)
        return machine.client.stream_exec(
            argv, env=env, cwd=cwd, timeout_s=timeout_s, stdin=stdin,
            answering=functools.partial(self._check_answering, machine)
        )

    def upload(self, machine_id: str, path: str, data: bytes, mode: int) -> None:
        """Write a file inside the machine, as the machine."""
        machine = self._ready(machine_id)
        with self._on_init(machine):
            machine.client.upload(path, data, mode)

    def upload_many(self, machine_id: str, files: Sequence[tuple[str, bytes, int]]) -> None:
        """Write several files (path, data, mode) inside the machine at once, as the machine."""
        machine = self._ready(machine_id)
        with self._on_init(machine):
            machine.client.upload_many(files)

    def download(self, machine_id: str, path: str) -> bytes:
        """Read a file from inside the machine, as the machine."""
        machine = self._ready(machine_id)
        with self._on_init(machine):
            return machine.client.download(path)

    def delete(self, machine_id: str) -> None:
        """Kill everything the machine runs, then remove its cgroups, mounts and disk."""
        machine = self._get(machine_id)
        with self._lock:
            self._machines.pop(machine_id, None)
        self._teardown(machine)

    def list(self) -> list[MachineInfo]:
        """Every live machine of this backend (one whose init is gone as ``failed``)."""
        with self._lock:
            machines = list(self._machines.values())
        for machine in machines:
            self._gone(machine)
        return [m.info for m in machines]

    def prepare_baseline(self, name: str, source: Path) -> Baseline:
        """Copy ``source`` once (reflinks where possible) into a read-only baseline named ``name``."""
        target = self.root / "baselines" / name
        if target.exists():
            raise UserError(f"baseline {name!r} already exists")
        if not source.is_dir():
            raise UserError(f"baseline source {source} is not a folder")
        staging = self.root / "baselines" / f".{name}.{new_id('tmp')}"
        clone_tree(source, staging)
        owner = self.sandbox_owner()
        if owner is not None:
            # The machines' own files, as a machine's disk is: a machine may change what its baseline holds
            # (in its own upper layer), which overlayfs checks against the owner of the file below.
            done = subprocess.run(["chown", "-R", "--no-dereference", f"{owner[0]}:{owner[1]}", str(staging)],
                                  env={"PATH": "/usr/bin:/bin"}, capture_output=True, check=False)
            if done.returncode != 0:
                raise SandboxError(f"cannot hand baseline {name!r} to the machines: "
                                   f"{done.stderr.decode(errors='replace').strip()}")
        staging.rename(target)
        return Baseline(name=name, path=target)

    def baseline_from_machine(self, machine_id: str, name: str) -> Baseline:
        """Freeze a machine's current disk as a baseline (after it checked out a repo, installed deps...).

        ``machine_id`` is one of this backend's machines, or the id or name of a live machine another process of
        this user made under the same root (see :mod:`swarmyard.machines.live`): frozen while its disk is copied.
        """
        with self._lock:
            own = machine_id in self._machines
        if not own:
            folder, other = live.find(self.root, machine_id)
            with live.frozen(folder, other):
                return self.prepare_baseline(name, live.disk_path(other, self.sandbox_prefix()))
        machine = self._get(machine_id)
        disk = machine.disk.merged
        if machine.disk.tmpfs_bytes is not None:
            return self.prepare_baseline(name, self._tmpfs_disk(machine))
        if self.overlay and self.mounts_in_launcher:
            if machine.proc is None:
                raise SandboxError(f"machine {machine_id} has no disk mounted", machine_id=machine_id)
            # Mounted in the machine's own mount namespace: seen from here through its sandbox process's root.
            disk = Path(f"/proc/{machine.proc.pid}/root") / disk.relative_to("/")
        return self.prepare_baseline(name, disk)

    def close(self) -> None:
        """Delete every machine."""
        for info in self.list():
            with contextlib.suppress(NotFoundError):
                self.delete(info.id)

    # -- internals ----------------------------------------------------------------------------------------------

    def _tmpfs_disk(self, machine: Machine) -> Path:
        """A machine's tmpfs disk as this process sees it: through the root of a process in its mount namespace."""
        if machine.proc is None:
            raise SandboxError(f"machine {machine.info.id} has no disk mounted", machine_id=machine.info.id)
        inner = inside(machine.proc.pid)
        if inner is None:
            raise SandboxError(f"machine {machine.info.id} is not running", machine_id=machine.info.id)
        return Path(f"/proc/{inner}/root") / self.sandbox_prefix().lstrip("/")

    def host_view(self, machine_id: str) -> HostView | None:
        """The machine as this process sees it from outside (``None``: it has no pid namespace of its own, or
        none of its processes is left)."""
        machine = self._get(machine_id)
        # the first process in the machine's own pid namespace: the launcher above it has a mount namespace of
        # its own too (where it mounts the disk), but not the machine's (its /tmp is this host's)
        inner = None if machine.proc is None else inside(machine.proc.pid, "pid")
        if inner is None:
            return None
        try:
            namespace = os.readlink(f"/proc/{inner}/ns/mnt")
        except OSError:
            return None
        return HostView(Path(f"/proc/{inner}/root"), tuple(_tree(inner)), namespace, self.sandbox_prefix())

    def _get(self, machine_id: str) -> Machine:
        with self._lock:
            machine = self._machines.get(machine_id)
        if machine is None:
            raise NotFoundError("machine", machine_id)
        return machine

    def _teardown(self, machine: Machine) -> None:
        if machine.parked is not None:
            # Boot failed before the launcher was used: it still waits in the machine's groups.
            machine.parked.sock.close()
            with contextlib.suppress(ProcessLookupError):
                machine.parked.proc.kill()
            machine.parked.proc.wait()
            machine.parked = None
        failed: SandboxError | None = None
        # the first process of the machine's pid namespace, named by its pid and start time (see _reaped)
        inner = None if machine.proc is None else inside(machine.proc.pid, "pid")
        first = None if inner is None else (inner, start_time(inner))
        spared = False
        if machine.cgroups is not None:
            # bwrap, spared the group's kill, reaps the namespace's first process, then exits by itself
            spared = machine.proc is not None and machine.cgroups.spare(machine.proc.pid)
            try:
                machine.cgroups.kill()
            except SandboxError as exc:
                failed = exc  # said once the rest is torn down
        if machine.proc is not None and spared:
            with contextlib.suppress(subprocess.TimeoutExpired):
                machine.proc.wait(10.0)  # a signal now could end bwrap before it reaped
        if machine.proc is not None:
            # SIGTERM lets an init without a sandbox around it kill its commands' trees first.
            with contextlib.suppress(ProcessLookupError):
                machine.proc.send_signal(signal.SIGTERM)
            try:
                machine.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                machine.proc.kill()
                machine.proc.wait()
        if machine.cgroups is not None:
            try:
                machine.cgroups.kill()
                machine.cgroups.remove()
            except SandboxError as exc:
                failed = failed or exc
        if first is not None:
            _reaped(*first)
        if machine.ready_fd is not None:
            os.close(machine.ready_fd)
            machine.ready_fd = None
        if machine.log_fd is not None:
            os.close(machine.log_fd)
            machine.log_fd = None
        machine.disk.unmount()
        with contextlib.suppress(SandboxError):
            machine.move(MachineState.DELETED)
        self._release_layers(machine.layers)
        if failed is not None:
            raise SandboxError(f"machine {machine.info.id}: {failed.message}", machine_id=machine.info.id)

    def _release_layers(self, layers: tuple[str, ...]) -> None:
        with self._lock:
            in_use = {layer for m in self._machines.values() for layer in m.layers}
        for layer in set(layers) - in_use:
            path = self.root / "layers" / layer
            with contextlib.suppress(FileNotFoundError):
                subprocess.run(
                    ["rm", "-rf", "--one-file-system", str(path)],
                    env={"PATH": "/usr/bin:/bin"},
                    check=False,
                    capture_output=True,
                )


def _reaped(pid: int, started: str | None, timeout_s: float = 10.0) -> None:
    """Wait until the process ``pid`` (started at ``started``) is reaped, not only dead.

    The machine's pid namespace's first process is bwrap's child; should bwrap die first (where it could not be
    spared the group's kill: see ``MachineCgroups.spare``), it is the host init's to reap, and until then a
    zombie in the machine's cgroups: a process of the machine still on the host. No event says when another
    process reaps it: looked at, bounded."""
    end = time.monotonic() + timeout_s
    while started is not None and start_time(pid) == started and time.monotonic() < end:
        time.sleep(0.002)


def _sandbox_init_pids(sandbox: int) -> tuple[tuple[int, str], ...]:
    """The sandbox's pid 1 (the first process below ``sandbox``, bwrap, in another pid namespace) and the init
    (its child that is pid 2 in the machine's namespace), as host ``(pid, start time)`` pairs; fewer while they
    are not there. Other children of pid 1 are orphans it reaped: theirs is not the init's state."""
    inner = inside(sandbox, "pid")
    if inner is None:
        return ()
    try:
        children = Path(f"/proc/{inner}/task/{inner}/children").read_text().split()
    except OSError:
        return ()  # ended while we looked: the exit is seen elsewhere
    found = []
    for pid in (inner, *map(int, children)):
        try:
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":\t" in line)
        except OSError:
            continue
        started = start_time(pid)
        if status.get("NSpid", "").split()[-1:] in (["1"], ["2"]) and started is not None:
            found.append((pid, started))
    return tuple(found)


def _stopped(processes: tuple[tuple[int, str], ...]) -> bool:
    """Whether one of these ``(pid, start time)`` processes is stopped (state ``T`` or ``t``); one that has ended
    (or whose pid another process has since) is not."""
    for pid, started in processes:
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            fields = os.read(fd, 4096).rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(fields) > 19 and fields[19].decode() == started and fields[0] in (b"T", b"t"):
            return True
    return False


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            todo += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except OSError:
            continue  # ended while we looked
    return out


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.strip()


__all__ = ["Launch", "Machine", "SupervisedBackend", "default_root", "init_argv", "open_root"]
