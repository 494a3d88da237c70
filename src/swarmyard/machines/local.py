"""The ``local`` backend: each machine is a bubblewrap sandbox with seccomp, Landlock and cgroup limits.

Inside, a machine sees a read-only view of only what an agent needs (/usr, a copy of a few /etc files and a /run
prepared once per backend, see :mod:`~swarmyard.machines.sysroot`; the interpreter's own install folders
and the swarmyard package folder, see :func:`python_paths`), its own disk at ``/machine`` (an overlay mounted in
the machine's own mount namespace, see :mod:`~swarmyard.machines.launchers`, whose writes land in an ext4 image
the size of its quota, see :mod:`~swarmyard.machines.disks`), private /proc, /dev and /tmp, a tmpfs over /sys,
and loopback only. Without root, a disk with a quota is a tmpfs of that size which bwrap mounts at ``/machine``
in the machine's own namespaces (see ``DiskKind``). Its uid is 1000 with no capabilities, which on the host is
an id no account has when swarmyard runs as root (see :mod:`~swarmyard.machines.identity`); its init applies
Landlock so writes land only on its disk and /tmp. A governed machine's (``Isolation.exec_only``) also marks every
writable mount noexec and loads the seccomp filter itself, after that (see ``NOEXEC``). The host is probed once; a machine weaker than its
:class:`Isolation` asks for is refused.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import resource
import site
import sys
import sysconfig
import threading
from dataclasses import replace
from pathlib import Path
from typing import Literal, assert_never

from swarmyard.errors import SandboxError, SandboxUnavailableError
from swarmyard.machines import disks, doctor, execs, identity, launchers, native, networks, sysroot
from swarmyard.machines.cgroups import MachineCgroups, discover, remove_orphan
from swarmyard.machines.disks import Disk
from swarmyard.machines.environment import ENV_BIN
from swarmyard.machines.identity import HOST_UID, SANDBOX_UID
from swarmyard.machines.pids import inside
from swarmyard.machines.protocol import MachineInfo, MachineSpec, OutputCap
from swarmyard.machines.supervised import (
    _SPAWNER,
    DEFAULT_DISK_BYTES,
    SOURCE_ROOT,
    Launch,
    Machine,
    SupervisedBackend,
    init_argv,
)

HOME = "/machine"
#: The same disk under the path a boxd machine's user has as its home (a symlink to ``HOME``).
BOXD_HOME = "/home/boxd"
RUN_DIR = "/run/swarmyard"
#: Where the control plane's socket appears inside every machine.
PLANE_SOCKET = f"{RUN_DIR}/plane.sock"
#: The relay's port inside every machine (each machine has its own network namespace).
RELAY_PORT = 8484
#: Where the compiled init appears inside every machine (read-only).
NATIVE_INIT = f"{RUN_DIR}/init"
#: The mounts a governed machine's init marks noexec, each with the mounts beneath it (``/`` alone: the sandbox's
#: root tmpfs, not the read-only binds on it): every mount in the machine that is not read-only. No file there can
#: be executed, nor mapped executable by ld.so (which the allowlist must hold, and which maps what it is given).
NOEXEC = ("/", HOME, "/tmp", "/dev", "/sys", f"{RUN_DIR}/ctl")
#: Which init boots each machine: ``native`` (the C one, compiled at first use), ``python``, or ``auto`` (the C one
#: when this host can compile it, else the Python one).
InitKind = Literal["auto", "native", "python"]
#: Where a disk's quota comes from: ``image`` (an ext4 image on a loop device: root), ``tmpfs`` (a tmpfs of the
#: quota's size mounted by bwrap inside the machine: no root, but its contents are RAM, charged to the machine's
#: memory cgroup where it has one), or ``auto`` (the image where this process can make one, else the tmpfs).
DiskKind = Literal["auto", "image", "tmpfs"]
#: Where a tmpfs disk's seed (its baseline, or a fork's snapshot) is seen inside the machine, read-only.
SEED = "/.seed"
#: The swarmyard package folder (``src/swarmyard`` in an editable install), the only part of a checkout bound.
PACKAGE_DIR = str(Path(SOURCE_ROOT) / "swarmyard")


def python_paths() -> list[str]:
    """Host folders the in-sandbox Python needs, bound read-only at the same paths (so absolute RUNPATHs work).

    Only the interpreter's own install: for ``sys.prefix`` and ``sys.base_prefix``, sysconfig's stdlib, platstdlib,
    purelib and platlib, the interpreter's bin folders, its shared libpython and a virtualenv's ``pyvenv.cfg``;
    and the swarmyard package folder itself (an editable install puts its source root on ``sys.path``: only the
    package is bound, not the checkout around it). Never another ``sys.path`` entry: not the working folder
    (``sys.path[0]`` under ``python -m``), not ``$PYTHONPATH`` entries, not the user site under ``$HOME``, whatever
    their names end in. A dependency of swarmyard found only in the user site is refused (see
    :func:`_refuse_user_site_dependencies`) rather than bound with the rest of that folder.
    """
    wanted = {PACKAGE_DIR, os.path.dirname(os.path.realpath(sys.executable)), ENV_BIN}
    for prefix in {sys.prefix, sys.base_prefix}:
        base = {"base": prefix, "platbase": prefix, "installed_base": prefix, "installed_platbase": prefix}
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            wanted.add(os.path.realpath(sysconfig.get_path(key, vars=base)))
        cfg = os.path.join(prefix, "pyvenv.cfg")  # how a virtualenv's interpreter finds its own site-packages
        if os.path.isfile(cfg):
            wanted.add(os.path.realpath(cfg))
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname:
        wanted.add(os.path.realpath(os.path.join(libdir, soname)))  # the file itself, not the folder it is in
    _refuse_user_site_dependencies()
    # Nothing under /usr is needed twice, and a parent folder makes its children redundant.
    chosen = sorted(w for w in wanted if os.path.exists(w) and not w.startswith("/usr/"))
    return [w for w in chosen if not any(w.startswith(o + "/") for o in chosen if o != w)]


def _refuse_user_site_dependencies() -> None:
    """Raise when a package swarmyard needs in a machine is installed only in the user site, which no machine sees.

    The user site is ``$HOME``'s (``~/.local/lib/pythonX.Y/site-packages``): binding it would hand a worker
    everything else installed there. swarmyard's own package folder may live there (it is bound by itself)."""
    user_site = os.path.realpath(site.getusersitepackages())
    todo, seen = ["swarmyard"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        where = os.path.realpath(str(dist.locate_file("")))
        if name != "swarmyard" and (where == user_site or where.startswith(user_site + "/")):
            raise SandboxUnavailableError(
                f"{name}, which swarmyard needs inside every machine, is installed only in the user site {where}, "
                "which machines never see (it holds whatever else was installed there): install it into "
                f"the interpreter's own site-packages ({sysconfig.get_path('purelib')}) or a virtualenv"
            )
        for requirement in dist.requires or ():
            named = _REQUIREMENT_NAME.match(requirement)
            if named is not None and "extra ==" not in requirement:
                todo.append(named.group(0))


#: The distribution name at the start of a requirement string (``psycopg[binary]>=3.2`` -> ``psycopg``).
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
        output_cap: OutputCap | None = None,
        disk: DiskKind = "auto",
    ) -> None:
        """``parked``: how many launchers wait ahead of demand in fresh cgroups (0: every create joins its own;
        see :mod:`swarmyard.machines.launchers`). Only the compiled init can park. ``output_cap``: how much of
        each exec's output the host keeps. ``disk``: how disk quotas are enforced (see ``DiskKind``)."""
        super().__init__(root, output_cap=output_cap)
        self.report = report or _cached_probe(self.root)
        if self.report.bwrap is None:
            raise SandboxUnavailableError(f"bubblewrap is not installed: {doctor.BWRAP_HINT}")
        self.overlay = self.report.overlayfs
        self._hierarchy = discover()
        self._python = os.path.realpath(sys.executable)
        self._binds = python_paths()
        self._userns = identity.private_userns()
        #: How this backend's disks get their quota (``None``: they cannot, see ``check``).
        self.disk_kind = _disk_kind(disk, self.overlay and disks.quota_supported(), self.report.tmpfs_size)
        self._quota = self.disk_kind == "image"
        if self.disk_kind == "tmpfs":
            # A tmpfs disk is the machine's whole disk: a baseline is copied onto it, not laid under it.
            self.overlay = False
        self.native_init: Path | None = None
        if init == "native":
            self.native_init = native.build()
        elif init == "auto":
            self.native_init = native.native_init()
        self.launcher = self.native_init
        # The compiled launcher mounts each machine's disk in the machine's own mount namespace.
        self.mounts_in_launcher = self.native_init is not None
        self._pool: launchers.LauncherPool | None = None
        #: the private networks this backend's machines join
        self.networks = networks.Networks()
        if networks.available() is None:
            # what a killed backend left (its hub namespace and bridges) goes now, as its machine folders and
            # cgroups do (reap_orphans), even when this one never makes a network
            networks.reap_hubs()
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
        if iso.exec_only and self.report.landlock_abi < 1:
            # a governed machine without its exec allowlist would have a shell: never accepted as weaker
            raise SandboxUnavailableError("this host has no Landlock, which a machine's exec allowlist (exec_only: a "
                                          "governed worker's) needs; see swarmyard machines doctor")
        limits = {"memory": spec.limits.memory_bytes, "pids": spec.limits.pids, "cpu": spec.limits.cpus}
        wanted = {k for k, v in limits.items() if v is not None}
        lacking = wanted - self._hierarchy.controllers()
        if iso.cgroups and lacking:
            missing.append(f"cgroup controllers {sorted(lacking)}")
        if iso.cgroups and spec.limits.disk_bytes is not None and self.disk_kind is None:
            missing.append(f"a disk quota ({doctor.NO_QUOTA_HINT})")
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
        if self.space_bytes(spec.limits.disk_bytes) != self.space_bytes(DEFAULT_DISK_BYTES):
            return None  # parked launchers mounted a disk of the default size
        return self._pool.take(spec.limits) if self._pool is not None else None

    def space_bytes(self, disk_bytes: int | None) -> int | None:
        """The quota of a disk asking for ``disk_bytes``: enforced when this host can (see ``check``)."""
        return disk_bytes if self._quota else None

    def tmpfs_bytes(self, disk_bytes: int | None) -> int | None:
        """The size of the tmpfs a machine asking for ``disk_bytes`` mounts as its disk (``None``: none)."""
        return disk_bytes if self.disk_kind == "tmpfs" else None

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
        return self.disk_args(Disk(folder, lowers=(), overlay=True, empty=self.root / "empty", made=True,
                                   space_bytes=self.space_bytes(DEFAULT_DISK_BYTES)))

    def park(self) -> None:
        """Park this backend's launchers now, in the calling thread (else the first create starts it)."""
        if self._pool is not None:
            self._pool.fill()

    def close(self) -> None:
        """Delete every machine and stop the parked launchers."""
        super().close()
        if self._pool is not None:
            self._pool.close()
        self.networks.close()

    # -- private networks (see swarmyard.machines.networks) ------------------------------------------------------

    def networks_refusal(self) -> str | None:
        """Private networks need root here (see :mod:`swarmyard.machines.networks`)."""
        return networks.available()

    def wait_until_ready(self, machine_id: str, timeout_s: float) -> MachineInfo:
        """Block until the machine can run commands; a machine with networks is on them by then."""
        info = super().wait_until_ready(machine_id, timeout_s)
        machine = self._get(machine_id)
        if not machine.spec.networks:
            return info
        with machine.lock:
            if machine.info.addresses:
                return machine.info
            inner = None if machine.proc is None else inside(machine.proc.pid, "net")
            if inner is None:
                raise SandboxError(f"machine {machine_id} is not running", machine_id=machine_id)
            joined = self.networks.attach(machine_id, machine.spec.name, inner, machine.spec.networks,
                                          machine.root / "hosts")
            machine.info = replace(machine.info, addresses=tuple(joined.items()))
            return machine.info

    def delete(self, machine_id: str) -> None:
        """Kill everything the machine runs, remove it, and take it off its networks."""
        try:
            super().delete(machine_id)
        finally:
            self.networks.detach(machine_id)

    def _enforced(self, machine: Machine, landlock_abi: int) -> tuple[str, ...]:
        have = ["namespaces"]
        if self.report.seccomp and machine.spec.isolation.seccomp:
            have.append("seccomp")
        if landlock_abi:
            have.append(f"landlock-abi{landlock_abi}")
        if landlock_abi and machine.spec.isolation.exec_only:
            have.append("exec-only")
        if machine.cgroups is not None:
            have += [f"cgroup-{c}" for c in sorted(machine.cgroups.enforced)]
        if self.overlay:
            have.append("overlayfs")
        if self._userns is not None:
            have.append("unmapped-uid")
        if machine.disk.space_bytes is not None:
            have.append("disk-quota")
        if machine.disk.tmpfs_bytes is not None:
            have += ["disk-quota", "disk-in-memory"]
        return tuple(have)

    def _static_argv(self) -> list[str]:
        """The part of the bwrap command that is the same for every machine of this backend, built once."""
        argv = [
            self.report.bwrap or "bwrap",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            *self._identity_args(),
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
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            str(self.sysroot / "run"),
            "/run",
            # boxd's machines keep their user's files in /home/boxd: here that is the machine's own disk
            "--perms",
            "0755",
            "--dir",
            "/home",
            "--symlink",
            HOME,
            BOXD_HOME,
        ]
        # After the tmpfs mounts: a Python or a checkout that lives under /tmp must not be hidden by them. The
        # folders above each bind are made first, searchable: bwrap as the namespace's root would make them 0700.
        made = {"/", "/tmp", "/usr"}
        for bind in self._binds:
            for parent in reversed(Path(bind).parents):
                if str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", bind, bind]
        return argv

    def _identity_args(self) -> list[str]:
        if self._userns is None:
            # bwrap's own user namespace: the sandbox's 1000 is the invoking uid on the host.
            return ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        # The shared namespace of :mod:`~swarmyard.machines.identity`: bwrap sets up as its root, and the init
        # drops to 1000 (the host's unmapped HOST_UID) before anything else; bwrap itself can only switch the uid
        # before the gid, which fails once the uid is no longer root.
        # Every namespace but the user one is new, as with --unshare-all (which would make a user namespace too).
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--userns", str(self._userns), "--uid", "0", "--gid", "0",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]

    def sandbox_owner(self) -> tuple[int, int] | None:
        """The host uid and gid a machine's own folders (its disk, its control folder) must belong to."""
        return None if self._userns is None else (HOST_UID, HOST_UID)

    def _disk_args(self, disk: Disk) -> list[str]:
        """bwrap's options for the machine's disk at ``HOME``: the host's folder, or a tmpfs of the quota's size
        (with its seed bound read-only, copied in by :meth:`_disk_setup`)."""
        if disk.tmpfs_bytes is None:
            return ["--bind", str(disk.merged), HOME]
        args = [] if disk.seed is None else ["--ro-bind", str(disk.seed), SEED]
        if self._userns is not None:
            # bwrap mounts it as the namespace's root: handing it to the machine's uid takes CAP_CHOWN, which
            # the init drops with every other capability when it leaves root.
            args += ["--cap-add", "CAP_CHOWN"]
        return [*args, "--size", str(disk.tmpfs_bytes), "--perms", "0755", "--tmpfs", HOME]

    def _disk_setup(self, disk: Disk) -> list[str]:
        """A shell that readies a tmpfs disk inside the machine, then execs the init (none when nothing to do).

        The copy of the seed runs inside the machine, as the machine's uid: its pages are charged to the machine,
        and a seed larger than the quota fails the boot with ENOSPC.
        """
        steps: list[str] = []
        as_machine = ""
        if disk.tmpfs_bytes is not None and self._userns is not None:
            steps.append(f"chown {SANDBOX_UID}:{SANDBOX_UID} {HOME}")
            as_machine = f"setpriv --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups "
        if disk.tmpfs_bytes is not None and disk.seed is not None:
            steps.append(f"{as_machine}cp -a {SEED}/. {HOME}/")
        if not steps:
            return []
        failed = (f"echo 'cannot put the machine files on its {disk.tmpfs_bytes}-byte disk (a tmpfs): "
                  "does its baseline fit in its quota?' >&2; exit 1")
        return ["/bin/sh", "-c", f"{{ {' && '.join(steps)}; }} || {{ {failed}; }}; exec \"$@\"", "sh"]

    def _launch(self, machine: Machine, ready_w: int) -> Launch:
        spec = machine.spec
        argv = [*self._prefix, "--bind", str(machine.root / "ctl"), f"{RUN_DIR}/ctl",
                *self._disk_args(machine.disk), "--chdir", HOME]
        exec_only = execs.exec_allowlist(spec.isolation.exec_only) if spec.isolation.exec_only else ()
        landlock = (spec.isolation.landlock or bool(exec_only)) and self.report.landlock_abi >= 1
        landlock_required = (spec.isolation.landlock and not spec.isolation.allow_weaker) or bool(exec_only)
        if spec.control_socket is not None:
            identity.admit(spec.control_socket)
            argv += ["--ro-bind", str(spec.control_socket), PLANE_SOCKET]
        if spec.networks:
            hosts = machine.root / "hosts"  # its peers' names, rewritten as they come and go
            networks.write_hosts(hosts, networks.LOCALHOST)
            argv += ["--ro-bind", str(hosts), "/etc/hosts"]
        pass_fds: tuple[int, ...] = ()
        close_after: tuple[int, ...] = ()
        seccomp_fd: int | None = None
        if spec.isolation.seccomp and self.report.seccomp:
            seccomp_fd = doctor.seccomp_fd(governed=bool(exec_only))
            pass_fds = close_after = (seccomp_fd,)
            if not exec_only:
                argv += ["--seccomp", str(seccomp_fd)]
        # bwrap's own user namespace (not root) would run the sandbox's uid in a nested namespace that does not
        # own the machine's mounts: a governed machine's sandbox starts as its uid 0, and its init nests the uid
        nest = bool(exec_only) and self._userns is None
        if exec_only:
            # the init marks the writable mounts noexec (which takes CAP_SYS_ADMIN, and mount_setattr, which the
            # filter denies), drops every capability, and only then loads the filter itself: see noexec
            # (nesting: mapping the namespace's uid 0 into a child takes CAP_SETFCAP where it is done)
            argv += ["--cap-add", "CAP_SYS_ADMIN",
                     *(("--cap-add", "CAP_SETFCAP", "--uid", "0", "--gid", "0") if nest else ())]
        if self._userns is not None:
            pass_fds += (self._userns,)  # shared by every machine: kept open
        drop = [] if self._userns is None else ["--user", str(SANDBOX_UID)]
        argv += self._disk_setup(machine.disk)
        if self.native_init is not None:
            # --host-only: the control socket serves the host, never a process of the machine (see the init)
            argv += [NATIVE_INIT, *drop, "--ctl", f"{RUN_DIR}/ctl/init.sock", "--ready-fd", str(ready_w),
                     "--cwd", HOME, "--host-only"]
            if spec.control_socket is not None:
                argv += ["--relay-target", PLANE_SOCKET, "--relay-port", str(RELAY_PORT)]
            if landlock:
                argv += ["--landlock", "--writable", HOME, "--writable", "/tmp", "--device", "/dev"]
                for path in exec_only:
                    argv += ["--exec-only", path]
            if landlock_required:
                argv.append("--landlock-required")
            if exec_only:
                for path in NOEXEC:
                    argv += ["--noexec", path]
                if seccomp_fd is not None:
                    argv += ["--seccomp-fd", str(seccomp_fd)]
            if nest:
                argv += ["--nest-user", str(SANDBOX_UID)]
        else:
            config: dict[str, object] = {
                "ctl": f"{RUN_DIR}/ctl/init.sock",
                "ready_fd": ready_w,
                "cwd": HOME,
                "landlock_required": landlock_required,
                "host_only": True,
            }
            if self._userns is not None:
                config["user"] = SANDBOX_UID
            if spec.control_socket is not None:
                config.update(relay_target=PLANE_SOCKET, relay_port=RELAY_PORT)
            if landlock:
                config["landlock"] = {"writable": [HOME, "/tmp"], "devices": ["/dev"], "exec_only": list(exec_only)}
            if exec_only:
                config["noexec"] = list(NOEXEC)
                if seccomp_fd is not None:
                    config["seccomp_fd"] = seccomp_fd
            if nest:
                config["nest_user"] = SANDBOX_UID
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
            close_after=close_after,
        )

    def machine_env(self, machine_id: str) -> dict[str, str]:
        """The variables every machine starts with."""
        path = f"{ENV_BIN}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
        env = {
            "PATH": path,
            "HOME": HOME,
            "USER": "agent",
            "LOGNAME": "agent",
            "SHELL": "/bin/sh",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
        }
        if not any(PACKAGE_DIR.startswith(b + "/") for b in self._binds):
            # swarmyard came from a source folder (PYTHONPATH, or the folder ``python -m`` started in), not from
            # the interpreter's site-packages: that folder holds only the package inside, so it goes on the path.
            env["PYTHONPATH"] = SOURCE_ROOT
        return env


_PROBES: dict[Path, doctor.HostReport] = {}
_PROBE_LOCK = threading.Lock()


def _cached_probe(root: Path) -> doctor.HostReport:
    # Probing runs a few sandboxes (~0.1 s); once per process is enough.
    with _PROBE_LOCK:
        if not _PROBES:
            _PROBES[root] = doctor.probe(root)
        return next(iter(_PROBES.values()))


def _disk_kind(asked: DiskKind, image: bool, tmpfs: bool) -> Literal["image", "tmpfs"] | None:
    """The disk a backend asking for ``asked`` gets, on a host that can give ``image`` disks and ``tmpfs`` ones."""
    match asked:
        case "image" if not image:
            raise SandboxUnavailableError("an ext4 image disk needs root, overlayfs, loop devices and mke2fs "
                                          "(see swarmyard machines doctor)")
        case "tmpfs" if not tmpfs:
            raise SandboxUnavailableError("a tmpfs disk needs bubblewrap 0.7 or later (its --size option)")
        case "image" | "tmpfs":
            return asked
        case "auto":
            return "image" if image else "tmpfs" if tmpfs else None
        case _:
            assert_never(asked)
