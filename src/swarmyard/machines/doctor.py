"""What this host allows a sandbox to have, found by trying each thing for real (``swarmyard machines doctor``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from swarmyard.guest import landlock, seccomp
from swarmyard.machines import cgroups, checkpoint, disks, native

_CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
BWRAP_HINT = (
    "install bubblewrap: apt-get install -y bubblewrap (or run with --sandbox process for development)"
)


@dataclass(frozen=True, slots=True)
class Check:
    """One probed capability: whether it works and what it means."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class HostReport:
    """Everything the ``local`` backend needs to know about the host."""

    bwrap: str | None
    bwrap_version: str | None
    user_namespaces: bool
    seccomp: bool
    landlock_abi: int
    overlayfs: bool
    overlayfs_in_userns: bool
    cgroup_v1: tuple[str, ...]
    cgroup_v2: tuple[str, ...]
    cgroup_kill: bool
    checks: tuple[Check, ...] = field(default_factory=tuple)
    #: Whether bwrap can mount a size-limited tmpfs (``--size``, bubblewrap 0.7 and later): a disk quota without root.
    tmpfs_size: bool = False

    @property
    def cgroup_controllers(self) -> set[str]:
        """Controllers usable for limits, either version."""
        return set(self.cgroup_v1) | set(self.cgroup_v2)


def _run(argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(
            argv, env=_CLEAN_ENV, capture_output=True, check=False, timeout=20, pass_fds=pass_fds
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def seccomp_fd(governed: bool = False) -> int:
    """A memfd holding the seccomp filter (a governed machine's, see ``seccomp``), positioned at its start (bwrap
    reads it once)."""
    fd = os.memfd_create("swarmyard-seccomp", os.MFD_CLOEXEC)
    os.write(fd, seccomp.build_filter(governed))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def probe(scratch: Path | None = None) -> HostReport:
    """Try every capability and report what works; never raises for a missing one."""
    bwrap = shutil.which("bwrap", path=_CLEAN_ENV["PATH"])
    version = None
    userns = seccomp_ok = tmpfs_size = False
    if bwrap is not None:
        done = _run([bwrap, "--version"])
        version = done.stdout.decode().strip().split()[-1] if done and done.returncode == 0 else None
        done = _run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"])
        userns = done is not None and done.returncode == 0
        if seccomp.supported_arch():
            fd = seccomp_fd()
            try:
                done = _run([bwrap, "--ro-bind", "/", "/", "--seccomp", str(fd), "true"], pass_fds=(fd,))
                seccomp_ok = done is not None and done.returncode == 0
            finally:
                os.close(fd)
        done = _run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--size", str(1 << 20),
                     "--tmpfs", "/tmp", "true"])
        tmpfs_size = done is not None and done.returncode == 0
    abi = landlock.abi_version()
    scratch = scratch or Path(tempfile.gettempdir())
    overlay = os.geteuid() == 0 and disks.overlay_supported(scratch)
    base = Path(tempfile.mkdtemp(prefix="ovl-userns-", dir=scratch))
    try:
        for part in ("l", "u", "w", "m"):
            (base / part).mkdir()
        done = _run(
            [
                "unshare",
                "--user",
                "--map-root-user",
                "--mount",
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base / 'l'},upperdir={base / 'u'},workdir={base / 'w'}",
                str(base / "m"),
            ]
        )
        overlay_userns = done is not None and done.returncode == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
    hierarchy = cgroups.discover()
    v1 = tuple(sorted(hierarchy.v1))
    v2 = tuple(sorted(hierarchy.v2_controllers & {"memory", "pids", "cpu"}))
    checks = (
        Check("bubblewrap", bwrap is not None, f"{bwrap} {version}" if bwrap else BWRAP_HINT),
        Check(
            "user namespaces", userns, "bwrap --unshare-all works" if userns else "bwrap --unshare-all failed"
        ),
        Check(
            "seccomp",
            seccomp_ok,
            f"{len(seccomp.build_program())}-instruction filter loaded by bwrap"
            if seccomp_ok
            else "bwrap --seccomp failed or the architecture is not x86_64",
        ),
        Check("landlock", abi >= 1, f"ABI {abi}" if abi else "not available (kernel or boot options)"),
        Check(
            "overlayfs",
            overlay,
            "mounted by the host for baselines and forks"
            if overlay
            else "not mountable here: disks are reflink-or-copy clones",
        ),
        Check("overlayfs in a user namespace", overlay_userns, "works" if overlay_userns else "refused"),
        _disk_quota(overlay and disks.quota_supported(), tmpfs_size, hierarchy),
        Check(
            "unmapped uid",
            os.geteuid() == 0 and shutil.which("unshare", path="/usr/bin:/bin") is not None,
            "a machine's uid 1000 is a host uid no account has"
            if os.geteuid() == 0
            else "not root: a machine's uid is yours on the host (your 0600 files are readable where bound)",
        ),
        Check("cgroup v1 controllers", bool(v1), ", ".join(v1) or "none writable"),
        Check("cgroup v2 controllers", bool(v2), ", ".join(v2) or "none enabled"),
        Check(
            "cgroup.kill",
            hierarchy.v2_kill,
            "v2 teardown kills a whole machine at once"
            if hierarchy.v2_kill
            else "teardown kills process by process",
        ),
        Check("rlimits", True, "last fallback for memory and pids"),
        _pause(hierarchy),
        _fork_memory(),
        _hibernate(hierarchy),
        _private_networks(),
        Check(
            "C compiler",
            (cc := native.compiler()) is not None,
            f"{cc} builds the fast machine init at first use"
            if cc
            else "none: machines boot the Python init (~40 ms slower); apt-get install gcc",
        ),
    )
    return HostReport(
        bwrap=bwrap,
        bwrap_version=version,
        user_namespaces=userns,
        seccomp=seccomp_ok,
        landlock_abi=abi,
        overlayfs=overlay,
        overlayfs_in_userns=overlay_userns,
        cgroup_v1=v1,
        cgroup_v2=v2,
        cgroup_kill=hierarchy.v2_kill,
        checks=checks,
        tmpfs_size=tmpfs_size,
    )


#: What to do on a host where no kind of disk quota works (the refusal of ``LocalBackend.check`` says it too).
NO_QUOTA_HINT = (
    "run as root with loop devices and mke2fs (an ext4 image per disk), or install bubblewrap 0.7 or later "
    "(a tmpfs per disk); else accept disks without a quota: Limits(disk_bytes=None)"
)


def _pause(hierarchy: cgroups.Hierarchy) -> Check:
    """Pausing needs each machine's cgroup v2 group (its ``cgroup.freeze``)."""
    if hierarchy.v2 is not None:
        return Check("pause", True, "the cgroup v2 freezer: a paused machine keeps its memory and uses no CPU")
    return Check("pause", False, "no writable cgroup v2 hierarchy, so no freezer: machines cannot be paused")


def _hibernate(hierarchy: cgroups.Hierarchy) -> Check:
    """Whether an idle machine's memory can be released (see :mod:`swarmyard.machines.idle`)."""
    from swarmyard.machines.idle import host_swap_reason

    if hierarchy.v2 is None:
        return Check("hibernate", False, "no writable cgroup v2 hierarchy: machines are never suspended")
    if "memory" not in hierarchy.controllers():
        return Check("hibernate", False, "no memory cgroup controller: a frozen machine's memory cannot be released")
    reason = host_swap_reason()
    if reason is not None:
        return Check("hibernate", False, f"no: {reason}")
    return Check("hibernate", True, "an idle machine's memory goes to swap after hibernate_s; its processes are kept")


def _fork_memory() -> Check:
    """What a fork carries: always the disk; its processes and memory where :mod:`checkpoint` says it can."""
    memory = checkpoint.fork_memory("local")
    if memory.kept:
        return Check("fork keeps memory", True, "a fork restores its source's processes with their memory")
    return Check("fork keeps memory", False, f"no: a fork copies the disk, not running processes ({memory.reason});"
                 " pause keeps memory in place instead")


def _private_networks() -> Check:
    from swarmyard.machines import networks

    reason = networks.available()
    if reason is None:
        return Check("private networks", True, "machines.create(networks=[...]): a bridge per network in a "
                     "namespace of its own, names as <name>.yard; no route out")
    return Check("private networks", False, f"none: {reason} (pasta and slirp4netns give a way out, not a "
                 "network between machines)")


def _disk_quota(image: bool, tmpfs: bool, hierarchy: cgroups.Hierarchy) -> Check:
    if image:
        return Check("disk quota", True, "each disk's writes land in a loop-mounted ext4 image of its size")
    if tmpfs:
        charged = ("counted in the machine's memory limit" if "memory" in hierarchy.controllers()
                   else "and no memory cgroup here counts it: each machine may take its quota of host RAM")
        return Check("disk quota", True, "each disk is a tmpfs of its size inside the machine (no root for an "
                     f"ext4 image): what a machine stores there is RAM, not host disk, {charged}")
    return Check("disk quota", False, f"none: {NO_QUOTA_HINT}")
