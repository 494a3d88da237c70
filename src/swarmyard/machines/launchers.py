"""Parked launchers: the compiled init started ahead of demand, already inside a fresh set of cgroups.

Moving a process into a cgroup (v1 or v2) takes the kernel's ``cgroup_threadgroup_rwsem`` for writing, and that
waits for an RCU grace period (about 12 ms on a HZ=250 kernel) unless another move happened moments before. Paid
in ``create``, that one wait was half of a machine's boot. A parked launcher pays it in the background: it is
started with its own new cgroups (named after no machine yet, holding the default limits), joins them, and blocks
on a socket. Its machine folder is made beside it, and (with overlayfs) it takes a mount namespace of its own,
drops from it what no sandbox binds (/sys, other machines' disks: bwrap parses the whole mount table once per
bind) and mounts an empty disk there. ``create`` takes one, writes the machine's limits into its groups if they
differ from the defaults, and sends it the sandbox command with its descriptors (and the disk to mount instead,
for a baseline or a fork); the launcher execs bwrap at once, inside the limits, with no window.

Nothing of a machine exists before ``create``: no sandbox, no namespace but that mount namespace, no environment.
A launcher is used once; limits, env and baseline are the machine's own. When none is parked (a burst drained
them, or the pool is off) ``create`` starts a launcher itself and pays the wait, as before. A mount the host makes
after a launcher parked (a new tmpfs holding a control socket, say) is not seen from its namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import SandboxError
from swarmyard.ids import new_id
from swarmyard.machines.cgroups import Hierarchy, MachineCgroups, wanted_controllers
from swarmyard.machines.protocol import Limits

_log = logging.getLogger(__name__)
_ENV = {"PATH": "/usr/bin:/bin"}
#: How many launchers wait parked per backend. Refills come in batches (see :class:`LauncherPool`): a batch's
#: first cgroup move waits for the grace period and stalls every fork on the host meanwhile; the rest of the
#: batch follows within that same period nearly free.
DEFAULT_SIZE = 8
Spawn = Callable[[Callable[[], "subprocess.Popen[bytes]"]], "subprocess.Popen[bytes]"]


@dataclass(slots=True)
class ParkedLauncher:
    """One launcher waiting for its order; used once."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    cgroups: MachineCgroups | None
    #: The machine folder made for it ahead of demand (see ``SupervisedBackend.make_folder``), if any.
    folder: Path | None = None
    #: Whether it mounted that folder's disk (with no baseline) in its own mount namespace while parked.
    premounted: bool = False
    #: Its stderr while parked (a memfd): why it exited, should it die before its order.
    errors: int | None = None

    def _close_errors(self) -> str:
        if self.errors is None:
            return ""
        text = os.pread(self.errors, 2000, 0).decode(errors="replace").strip()
        os.close(self.errors)
        self.errors = None
        return text

    def launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        fds: Mapping[int, int],
        rlimit_as: int | None,
        disk: tuple[Path, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Have the launcher exec ``argv``; ``fds`` maps each host descriptor to its number in the child, ``disk``
        is an overlay ``(target, options)`` for it to mount first (over the one it mounted while parked).

        Raises :class:`SandboxError` when the launcher is gone (the caller then starts one itself).
        """
        items = [f"fd={target}" for target in fds.values()]
        if rlimit_as is not None:
            items.append(f"rlimit-as={int(rlimit_as)}")
        if disk is not None:
            items += [f"disk={disk[0]}", f"disk-options={disk[1]}"]
        items += [f"env={k}={v}" for k, v in env.items()]
        items += [f"arg={a}" for a in argv]
        payload = b"".join(os.fsencode(item) + b"\0" for item in items)
        try:
            if self.proc.poll() is not None:
                raise BrokenPipeError(f"exited with status {self.proc.returncode}: {self._close_errors()}")
            socket.send_fds(self.sock, [payload], list(fds))
        except OSError as exc:
            raise SandboxError(f"a parked launcher is gone: {exc}", retryable=True) from exc
        finally:
            self.sock.close()
            self._close_errors()
        return self.proc

    def discard(self) -> None:
        """Stop an unused launcher (closing its socket tells it to exit) and remove its cgroups."""
        self.sock.close()
        self._close_errors()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.cgroups is not None:
            with contextlib.suppress(SandboxError):
                self.cgroups.kill()
            with contextlib.suppress(SandboxError):  # what is left is the next backend's reaper's
                self.cgroups.remove()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


#: The groups a parked launcher joins: those of the default limits. A machine that asks for a controller beyond
#: them (a CPU quota) starts its own launcher; one that asks for fewer sits in groups without a limit.
PARKED_CONTROLLERS = frozenset(wanted_controllers(Limits()))


def start(
    init: Path,
    hierarchy: Hierarchy,
    spawn: Spawn,
    make_folder: Callable[[str], Path] | None = None,
    disk_args: Callable[[Path], list[str]] | None = None,
) -> ParkedLauncher:
    """Start one launcher in new cgroups (the :data:`PARKED_CONTROLLERS` this host has); with ``make_folder``,
    also make the machine folder it will boot in, and with ``disk_args`` (the launcher's ``--private-mounts
    --disk ...`` options for that folder) have it mount the folder's disk in a mount namespace of its own."""
    name = new_id("slot")
    # The folder (with its owner file) first: should this process die next, the folder names the groups below
    # for the next backend on this root to reap.
    folder = make_folder(name) if make_folder is not None else None
    cgroups = None
    if hierarchy.v1 or hierarchy.v2:
        try:
            # With the default limits already written: most machines ask for those and then need no write.
            cgroups = MachineCgroups(hierarchy, name, Limits(), controllers=set(PARKED_CONTROLLERS))
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    errors = os.memfd_create("swarmyard-park-log", os.MFD_CLOEXEC)
    argv = [str(init), "--park", str(theirs.fileno()), "--parent", str(os.getpid())]
    for procs in cgroups.procs_files if cgroups is not None else []:
        argv += ["--join", procs]
    extra = disk_args(folder) if disk_args is not None and folder is not None else []
    argv += extra
    try:
        proc = spawn(
            lambda: subprocess.Popen(
                argv,
                env=_ENV,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                close_fds=True,
            )
        )
    except BaseException:
        ours.close()
        os.close(errors)
        if cgroups is not None:
            with contextlib.suppress(SandboxError):  # the error being raised is the one to tell
                cgroups.remove()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        theirs.close()
    return ParkedLauncher(proc=proc, sock=ours, cgroups=cgroups, folder=folder, premounted="--disk" in extra, errors=errors)


class LauncherPool:
    """Keeps up to ``size`` launchers parked; a background thread refills it in one batch once it runs low.

    Moving a process into a cgroup holds back every fork and exit on the host until the grace period ends
    (the kernel's ``cgroup_threadgroup_rwsem``), so a refill of one launcher per take would stall the very
    next boot each time. Refilling ``size`` at once when at most ``low`` are left pays that stall once per batch.
    """

    def __init__(
        self,
        init: Path,
        hierarchy: Hierarchy,
        spawn: Spawn,
        size: int = DEFAULT_SIZE,
        low: int | None = None,
        make_folder: Callable[[str], Path] | None = None,
        disk_args: Callable[[Path], list[str]] | None = None,
    ) -> None:
        self._make_folder = make_folder
        self._disk_args = disk_args
        self._init = init
        self._hierarchy = hierarchy
        self._spawn = spawn
        self.size = size
        self.low = size // 4 if low is None else low
        self._parked: list[ParkedLauncher] = []
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._filling = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        _track(self)

    def take(self, limits: Limits) -> ParkedLauncher | None:
        """A parked launcher whose groups can hold ``limits``, or ``None`` (none parked yet: the pool refills in
        the background; or ``limits`` needs a controller parked launchers have no group for)."""
        if not wanted_controllers(limits) <= PARKED_CONTROLLERS:
            return None
        with self._lock:
            if self._closed or self.size < 1:
                return None
            launcher = self._parked.pop() if self._parked else None
            if self._thread is None:
                # Started by the first take: a backend that never creates a machine parks nothing.
                self._thread = threading.Thread(target=self._refill, name="machines-launchers", daemon=True)
                self._thread.start()
            if len(self._parked) <= self.low:
                self._wanted.set()
        return launcher

    def fill(self) -> None:
        """Park ``size`` launchers now, in the calling thread (the first take would start that anyway)."""
        self._fill()

    def _refill(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if not self._fill():
                return

    def _fill(self) -> bool:
        """Park launchers up to ``size``; ``False`` once the pool is closed."""
        with self._filling:  # one filler at a time (``fill`` and the refill thread), so ``close`` can wait for it
            return self._fill_locked()

    def _fill_locked(self) -> bool:
        while True:
            with self._lock:
                if self._closed:
                    return False
                if len(self._parked) >= self.size:
                    return True
            try:
                launcher = start(self._init, self._hierarchy, self._spawn, self._make_folder, self._disk_args)
            except (OSError, SandboxError) as exc:
                _log.warning("cannot park a machine launcher (creates start their own): %s", exc)
                return True
            with self._lock:
                if not self._closed:
                    self._parked.append(launcher)
                    continue
            launcher.discard()
            return False

    def close(self) -> None:
        """Stop every parked launcher and remove its cgroups (after any launcher being parked right now)."""
        with self._lock:
            self._closed = True
        self._wanted.set()
        with self._filling, self._lock:
            parked, self._parked = self._parked, []
        for launcher in parked:
            launcher.discard()


_POOLS: weakref.WeakSet[LauncherPool] = weakref.WeakSet()


def _track(pool: LauncherPool) -> None:
    # Parked launchers die with this process (PDEATHSIG), but their cgroup folders would stay behind; the exit
    # hook is installed with the first pool, not at import.
    if not _POOLS:
        atexit.unregister(_close_all)
        atexit.register(_close_all)
    _POOLS.add(pool)


def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()
