"""The ``local`` backend: each machine is a bubblewrap sandbox with seccomp, Landlock and cgroup limits.

Inside, a machine sees a read-only view of only what an agent needs (/usr, a copy of a few /etc files and a /run
prepared once per backend, see :mod:`~swarmyard.machines.sysroot`; the Python that runs swarmyard), its own disk
at ``/machine`` (an overlay mounted in the machine's own mount namespace, see
:mod:`~swarmyard.machines.launchers`), private /proc, /dev and /tmp, a tmpfs over /sys, and loopback only.
Its uid is 1000 in a new user namespace with no capabilities; its init applies Landlock so writes land only on
its disk and /tmp. The host is probed once; a machine weaker than its :class:`Isolation` asks for is refused.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from pathlib import Path
from typing import Literal

from swarmyard.errors import SandboxUnavailableError
from swarmyard.machines import doctor, launchers, native, sysroot
from swarmyard.machines.cgroups import MachineCgroups, discover, remove_orphan
from swarmyard.machines.disks import Disk
from swarmyard.machines.environment import ENV_BIN
from swarmyard.machines.protocol import MachineSpec
from swarmyard.machines.supervised import (
    _SPAWNER,
    SOURCE_ROOT,
    Launch,
    Machine,
    SupervisedBackend,
    init_argv,
)

HOME = "/machine"
RUN_DIR = "/run/swarmyard"
#: Where the control plane's socket appears inside every machine.
PLANE_SOCKET = f"{RUN_DIR}/plane.sock"
#: The relay's port inside every machine (each machine has its own network namespace).
RELAY_PORT = 8484
#: Where the compiled init appears inside every machine (read-only).
NATIVE_INIT = f"{RUN_DIR}/init"
#: Which init boots each machine: ``native`` (the C one, compiled at first use), ``python``, or ``auto`` (the C one
#: when this host can compile it, else the Python one).
InitKind = Literal["auto", "native", "python"]
def python_paths() -> list[str]:
    """Host folders the in-sandbox Python needs, bound read-only at the same paths (so absolute RUNPATHs work)."""
    wanted = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), SOURCE_ROOT}
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and os.path.isdir(real) and not any(real.startswith(w + "/") or real == w for w in wanted):
            wanted.add(real)
    # Nothing under /usr is needed twice, and a parent folder makes its children redundant.
    chosen = sorted(w for w in wanted if not w.startswith("/usr/"))
    return [w for w in chosen if not any(w.startswith(o + "/") for o in chosen if o != w)]


class LocalBackend(SupervisedBackend):
    """Machines as bubblewrap sandboxes on this host."""

    name = "local"
    disk_tmp = False

    def __init__(
        self,
        root: Path | None = None,
        *,
        report: doctor.HostReport | None = None,
        init: InitKind = "auto",
        parked: int = launchers.DEFAULT_SIZE,
    ) -> None:
        """``parked``: how many launchers wait ahead of demand in fresh cgroups (0: every create joins its own;
        see :mod:`swarmyard.machines.launchers`). Only the compiled init can park."""
        super().__init__(root)
        self.report = report or _cached_probe(self.root)
        if self.report.bwrap is None:
            raise SandboxUnavailableError(f"bubblewrap is not installed: {doctor.BWRAP_HINT}")
        self.overlay = self.report.overlayfs
        self._hierarchy = discover()
        self._python = os.path.realpath(sys.executable)
        self._binds = python_paths()
        self.native_init: Path | None = None
        if init == "native":
            self.native_init = native.build()
        elif init == "auto":
            self.native_init = native.native_init()
        self.launcher = self.native_init
        # The compiled launcher mounts each machine's disk in the machine's own mount namespace.
        self.mounts_in_launcher = self.native_init is not None
        self._pool: launchers.LauncherPool | None = None
        #: How many launchers this backend keeps parked (0 when it keeps none).
        self.parked = parked if self.native_init is not None else 0
        if self.native_init is not None and parked > 0:
            self._pool = launchers.LauncherPool(
                self.native_init,
                self._hierarchy,
                _SPAWNER.spawn,
                parked,
                make_folder=self.make_folder,
                disk_args=self._parked_disk_args if self.overlay else None,
            )
        self.sysroot = sysroot.prepare(self.root, self.native_init)
        self._prefix = self._static_argv()

    def sandbox_prefix(self) -> str:
        """The machine's home folder as its commands see it."""
        return HOME

    def check(self, spec: MachineSpec) -> tuple[str, ...]:
        """What this machine will have; raises when the host cannot give what ``spec.isolation`` requires."""
        iso = spec.isolation
        missing: list[str] = []
        if iso.namespaces and not self.report.user_namespaces:
            missing.append("namespaces (bwrap --unshare-all fails: are user namespaces disabled?)")
        if iso.seccomp and not self.report.seccomp:
            missing.append("seccomp")
        if iso.landlock and self.report.landlock_abi < 1:
            missing.append("landlock")
        limits = {"memory": spec.limits.memory_bytes, "pids": spec.limits.pids, "cpu": spec.limits.cpus}
        wanted = {k for k, v in limits.items() if v is not None}
        lacking = wanted - self._hierarchy.controllers()
        if iso.cgroups and lacking:
            missing.append(f"cgroup controllers {sorted(lacking)}")
        if missing and not iso.allow_weaker:
            raise SandboxUnavailableError(
                "this host cannot give the isolation asked for: "
                + "; ".join(missing)
                + " (pass Isolation(allow_weaker=True) to accept a weaker sandbox; see swarmyard machines doctor)"
            )
        return tuple(missing)

    def _reap_cgroups(self, name: str) -> None:
        remove_orphan(discover(), name)

    def _take_parked(self, spec: MachineSpec) -> launchers.ParkedLauncher | None:
        self.check(spec)
        return self._pool.take(spec.limits) if self._pool is not None else None

    def _make_cgroups(self, machine: Machine) -> MachineCgroups | None:
        spec = machine.spec
        if machine.parked is not None:
            if machine.parked.cgroups is not None:
                machine.parked.cgroups.apply(spec.limits)
            return machine.parked.cgroups
        if not (self._hierarchy.v1 or self._hierarchy.v2):
            return None
        return MachineCgroups(self._hierarchy, spec.id, spec.limits)

    def _parked_disk_args(self, folder: Path) -> list[str]:
        return self.disk_args(Disk(folder, lowers=(), overlay=True, empty=self.root / "empty", made=True))

    def park(self) -> None:
        """Park this backend's launchers now, in the calling thread (else the first create starts it)."""
        if self._pool is not None:
            self._pool.fill()

    def close(self) -> None:
        """Delete every machine and stop the parked launchers."""
        super().close()
        if self._pool is not None:
            self._pool.close()

    def _enforced(self, machine: Machine, landlock_abi: int) -> tuple[str, ...]:
        have = ["namespaces"]
        if self.report.seccomp and machine.spec.isolation.seccomp:
            have.append("seccomp")
        if landlock_abi:
            have.append(f"landlock-abi{landlock_abi}")
        if machine.cgroups is not None:
            have += [f"cgroup-{c}" for c in sorted(machine.cgroups.enforced)]
        if self.overlay:
            have.append("overlayfs")
        return tuple(have)

    def _static_argv(self) -> list[str]:
        """The part of the bwrap command that is the same for every machine of this backend, built once."""
        argv = [
            self.report.bwrap or "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--hostname",
            "machine",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = Path("/") / name
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), f"/{name}"]
            elif path.is_dir():
                argv += ["--ro-bind", str(path), f"/{name}"]
        argv += [
            "--ro-bind",
            str(self.sysroot / "etc"),
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/sys",
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            str(self.sysroot / "run"),
            "/run",
        ]
        # After the tmpfs mounts: a Python or a checkout that lives under /tmp must not be hidden by them.
        for bind in self._binds:
            argv += ["--ro-bind", bind, bind]
        return argv

    def _launch(self, machine: Machine, ready_w: int) -> Launch:
        spec = machine.spec
        argv = [
            *self._prefix,
            "--bind",
            str(machine.root / "ctl"),
            f"{RUN_DIR}/ctl",
            "--bind",
            str(machine.disk.merged),
            HOME,
            "--chdir",
            HOME,
        ]
        landlock = spec.isolation.landlock and self.report.landlock_abi >= 1
        landlock_required = spec.isolation.landlock and not spec.isolation.allow_weaker
        if spec.control_socket is not None:
            argv += ["--ro-bind", str(spec.control_socket), PLANE_SOCKET]
        pass_fds: tuple[int, ...] = ()
        if spec.isolation.seccomp and self.report.seccomp:
            fd = doctor.seccomp_fd()
            argv += ["--seccomp", str(fd)]
            pass_fds = (fd,)
        if self.native_init is not None:
            argv += [NATIVE_INIT, "--ctl", f"{RUN_DIR}/ctl/init.sock", "--ready-fd", str(ready_w), "--cwd", HOME]
            if spec.control_socket is not None:
                argv += ["--relay-target", PLANE_SOCKET, "--relay-port", str(RELAY_PORT)]
            if landlock:
                argv += ["--landlock", "--writable", HOME, "--writable", "/tmp", "--device", "/dev"]
            if landlock_required:
                argv.append("--landlock-required")
        else:
            config: dict[str, object] = {
                "ctl": f"{RUN_DIR}/ctl/init.sock",
                "ready_fd": ready_w,
                "cwd": HOME,
                "landlock_required": landlock_required,
            }
            if spec.control_socket is not None:
                config.update(relay_target=PLANE_SOCKET, relay_port=RELAY_PORT)
            if landlock:
                config["landlock"] = {"writable": [HOME, "/tmp"], "devices": ["/dev"]}
            argv += init_argv(self._python, config)
        rlimits: dict[int, int] = {}
        enforced = machine.cgroups.enforced if machine.cgroups is not None else set()
        if spec.limits.memory_bytes is not None and "memory" not in enforced:
            rlimits[resource.RLIMIT_AS] = spec.limits.memory_bytes
        return Launch(
            argv=argv,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            pass_fds=pass_fds,
            cgroup_procs=machine.cgroups.procs_files if machine.cgroups is not None else [],
            rlimits=rlimits,
            close_after=pass_fds,
        )

    def machine_env(self, machine_id: str) -> dict[str, str]:
        """The variables every machine starts with."""
        path = f"{ENV_BIN}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
        return {
            "PATH": path,
            "HOME": HOME,
            "USER": "agent",
            "LOGNAME": "agent",
            "SHELL": "/bin/sh",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
        }


_PROBES: dict[Path, doctor.HostReport] = {}
_PROBE_LOCK = threading.Lock()


def _cached_probe(root: Path) -> doctor.HostReport:
    # Probing runs a few sandboxes (~0.1 s); once per process is enough.
    with _PROBE_LOCK:
        if not _PROBES:
            _PROBES[root] = doctor.probe(root)
        return next(iter(_PROBES.values()))
