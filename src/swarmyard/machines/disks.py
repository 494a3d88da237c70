"""Machine disks: overlayfs over a read-only baseline where the host allows it, else a reflink-or-copy clone.

A fork snapshots the source's upper layer (only what the source changed, usually small) into a new read-only
layer, so neither machine sees the other's later writes while the baseline below them is shared, never copied.

A disk with a quota (``Limits.disk_bytes``) keeps its upper layer in a file system of its own: a sparse ext4 image
of exactly that size, copied from a template made once per size, attached to a loop device and mounted beside
the disk (its ``space``). The kernel enforces it: a full disk is ``ENOSPC`` inside the machine, and the host's
free space drops by at most the image's size. A size-limited tmpfs would be cheaper to mount, but its pages are
charged to the machine's memory limit and the host's RAM (a 1 GiB disk would eat a 1 GiB memory limit), and
project quotas need a host file system mounted with them; loop devices need only root, which overlayfs needs too.

Without root, a disk with a quota is that tmpfs instead (``tmpfs_bytes``), mounted by bubblewrap in the machine's
own user and mount namespaces: still ``ENOSPC`` at the quota, and nothing on the host's disk, but it is memory.
It starts with a copy of its baseline or fork snapshot (its ``seed``), made inside the machine before its init.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import SandboxError

_CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


_MNT_DETACH = 2
_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


_MS_NOSUID = 2
_MS_NODEV = 4
# linux/loop.h
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
#: struct loop_config: u32 fd, u32 block_size, struct loop_info64 (232 bytes, lo_flags at offset 52), u64[8].
_LOOP_CONFIG_SIZE = 4 + 4 + 232 + 64
_LO_FLAGS_OFFSET = 8 + 52
_TEMPLATES = threading.Lock()


def quota_supported() -> bool:
    """Whether this process can give disks a quota: root with loop devices and ``mke2fs``."""
    return (
        os.geteuid() == 0
        and os.access("/dev/loop-control", os.R_OK | os.W_OK)
        and shutil.which("mke2fs", path=_CLEAN_ENV["PATH"]) is not None
    )


def space_template(folder: Path, size: int, owner: tuple[int, int] | None) -> Path:
    """The empty ext4 image of ``size`` bytes (made once per size and owner) that each quota'd disk copies.

    It holds ``upper/`` (the machine's writable root, owned by ``owner``) and ``work/`` (overlayfs's).
    No journal (a machine's disk does not outlive a crash of its host) and lazy inode tables: the image is a
    sparse file of about 100 KiB, whatever its size.
    """
    uid, gid = owner or (os.getuid(), os.getgid())
    path = folder / f"ext4-{size}-{uid}.img"
    with _TEMPLATES:
        if path.exists():
            return path
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".img-", dir=folder))
        try:
            tree = staging / "tree"
            (tree / "upper").mkdir(parents=True)
            (tree / "work").mkdir(mode=0o700)
            os.chmod(tree / "upper", 0o755)
            os.chown(tree / "upper", uid, gid)
            image = staging / "image"
            with open(image, "wb") as handle:
                handle.truncate(size)
            done = subprocess.run(
                ["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0",
                 "-E", "lazy_itable_init=1,nodiscard", "-d", str(tree), str(image)],
                env=_CLEAN_ENV, capture_output=True, check=False,
            )
            if done.returncode != 0:
                raise SandboxError(f"cannot make a {size}-byte disk image: "
                                   f"{done.stderr.decode(errors='replace').strip()}")
            image.rename(path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def sparse_copy(source: Path, target: Path) -> None:
    """Copy ``source`` to a new file ``target`` writing only its data extents (the holes stay holes)."""
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(src).st_size
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(src, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(src, start, os.SEEK_HOLE)
                while start < end:
                    chunk = os.pread(src, min(end - start, 1 << 20), start)
                    os.pwrite(dst, chunk, start)
                    start += len(chunk)
                offset = end
            os.ftruncate(dst, size)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def mount_space(image: Path, target: Path) -> None:
    """Attach ``image`` to a free loop device (detached again when unmounted) and mount it at ``target``."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        # as the compiled init does (see mount_space in swarmyard/guest/init.c): a free device is taken and bound
        # one machine at a time, and the slow parts (the image's write-back, the mount) run outside that lock
        os.fsync(backing)
        for _ in range(64):
            fcntl.flock(control, fcntl.LOCK_EX)
            try:
                device, loop = _attach_free(control, backing)
            finally:
                fcntl.flock(control, fcntl.LOCK_UN)
            try:
                if _libc().mount(device.encode(), os.fsencode(target), b"ext4", _MS_NOSUID | _MS_NODEV,
                                 b"noinit_itable") != 0:
                    err = ctypes.get_errno()
                    if err == errno.EBUSY:
                        # still held as another machine's went (the close below clears it): take another
                        continue
                    raise SandboxError(f"cannot mount the disk image at {target}: {os.strerror(err)}")
                return
            finally:
                os.close(loop)
        raise SandboxError("no free loop device for a machine's disk", retryable=True)
    except OSError as exc:
        raise SandboxError(f"cannot attach the disk image {image.name}: {exc}") from exc
    finally:
        os.close(backing)
        os.close(control)


def _attach_free(control: int, backing: int) -> tuple[str, int]:
    """Bind ``backing`` to a free loop device: its path and an open descriptor (the caller holds the lock)."""
    for _ in range(64):
        number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
        device = f"/dev/loop{number}"
        if not os.path.exists(device):
            # A /dev that is not devtmpfs (a container's) gets no node for a device made on demand.
            with contextlib.suppress(FileExistsError):
                os.mknod(device, stat.S_IFBLK | 0o600, os.makedev(7, number))
        loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        config = bytearray(_LOOP_CONFIG_SIZE)
        struct.pack_into("=I", config, 0, backing)
        struct.pack_into("=I", config, _LO_FLAGS_OFFSET, _LO_FLAGS_AUTOCLEAR)
        try:
            fcntl.ioctl(loop, _LOOP_CONFIGURE, bytes(config))
        except OSError as exc:
            os.close(loop)
            if exc.errno == errno.EBUSY:
                continue  # another machine took that free device first
            raise
        return device, loop
    raise SandboxError("no free loop device for a machine's disk", retryable=True)


def _mount(options: str, target: Path) -> None:
    if _libc().mount(b"overlay", os.fsencode(target), b"overlay", 0, options.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"cannot mount the overlay disk at {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Unmount ``target``, lazily if something still holds it."""
    path = os.fsencode(target)
    if _libc().umount2(path, 0) != 0 and _libc().umount2(path, _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"cannot unmount {target}: {os.strerror(err)}")


def overlay_supported(scratch: Path) -> bool:
    """Whether this process can mount overlayfs (tried for real in a throwaway folder)."""
    scratch.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ovl-probe-", dir=scratch))
    try:
        for part in ("l", "u", "w", "m"):
            (base / part).mkdir()
        done = _run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base / 'l'},upperdir={base / 'u'},workdir={base / 'w'}",
                str(base / "m"),
            ]
        )
        if done:
            _run(["umount", str(base / "m")])
        return done
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, env=_CLEAN_ENV, capture_output=True, check=False).returncode == 0
    except OSError:
        return False


def clone_tree(source: Path, target: Path) -> None:
    """Copy a tree with ``cp -a --reflink=auto``: shared blocks where the file system can, a full copy elsewhere."""
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--no-target-directory", str(source), str(target)],
        env=_CLEAN_ENV,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise SandboxError(f"cannot copy {source.name}: {done.stderr.decode(errors='replace').strip()}")


@dataclass(slots=True)
class Disk:
    """One machine's disk: the folder bound at the machine's home, plus the layers beneath it."""

    root: Path
    lowers: tuple[Path, ...]
    overlay: bool
    #: A shared, always-empty folder to stand as the lower layer of a disk without a baseline.
    empty: Path | None = None
    #: Whether :meth:`make_folders` already ran (so :meth:`mount` skips it).
    made: bool = False
    #: The disk's quota: its upper layer lives in an ext4 image of this size (``None``: on the host's disk).
    space_bytes: int | None = None
    #: The disk's quota when the disk is a tmpfs of this size that the sandbox mounts in its own mount namespace
    #: (no root needed; it costs RAM, not host disk). The host's folder is then only the seed, if any.
    tmpfs_bytes: int | None = None
    #: What a tmpfs disk starts with: a baseline, or a fork's snapshot (``None``: it starts empty).
    seed: Path | None = None

    @property
    def merged(self) -> Path:
        """The folder the sandbox sees as its disk."""
        return self.root / "disk"

    @property
    def image(self) -> Path:
        """The disk's ext4 image (with a quota)."""
        return self.root / "disk.img"

    @property
    def space(self) -> Path:
        """Where the image is mounted (with a quota): it holds the upper and work folders."""
        return self.root / "space"

    @property
    def _layers(self) -> Path:
        return self.space if self.space_bytes is not None else self.root

    @property
    def upper(self) -> Path:
        """Where the machine's own writes land (the disk itself without overlayfs)."""
        return self._layers / "upper" if self.overlay else self.merged

    def make_folders(self, owner: tuple[int, int] | None = None, template: Path | None = None) -> None:
        """Create the disk's folders (the merged view, and overlayfs's upper and work folders); the machine's
        writable root (upper, else the disk itself) belongs to ``owner`` when given. With a quota, ``template``
        is the empty image to copy (its upper folder already belongs to ``owner``)."""
        self.merged.mkdir(parents=True, exist_ok=True)
        if self.space_bytes is not None:
            if template is None or not self.overlay:
                raise SandboxError("a disk with a quota needs overlayfs and its image template")
            self.space.mkdir(exist_ok=True)
            sparse_copy(template, self.image)
            self.made = True
            return
        if self.overlay:
            (self.root / "upper").mkdir(exist_ok=True)
            (self.root / "work").mkdir(exist_ok=True)
        if owner is not None:
            os.chown(self.upper, *owner)
        self.made = True

    def overlay_options(self) -> str:
        """The overlayfs mount options of this disk."""
        lowers = self.lowers
        if not lowers:
            # overlayfs needs at least one lower layer; an empty one costs nothing (a shared one not even a mkdir).
            empty = self.empty
            if empty is None:
                empty = self.root / "empty"
                empty.mkdir(exist_ok=True)
            lowers = (empty,)
        return f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={self.upper},workdir={self._layers / 'work'}"

    def space_args(self) -> list[str]:
        """The launcher's options that mount this disk's image before its overlay (none without a quota)."""
        return [] if self.space_bytes is None else ["--space", str(self.image), str(self.space)]

    def mount(self) -> None:
        """Create the folders (unless made already) and mount the overlay here (else the disk is a plain folder).

        The ``local`` backend with its compiled launcher does not call this: the launcher mounts the overlay in a
        mount namespace of the machine's own (see ``swarmyard/guest/init.c``), so the host's mount table stays small.
        """
        if not self.made:
            self.make_folders()
        if self.space_bytes is not None:
            mount_space(self.image, self.space)
        if self.overlay:
            _mount(self.overlay_options(), self.merged)

    def snapshot(self, target: Path, through: Path = Path("/")) -> tuple[Path, ...]:
        """Freeze this disk's current state as read-only layers for a fork; returns the fork's lower layers.

        ``through``: the root the disk is seen from (a machine's own mount namespace, ``/proc/PID/root``, when
        its image or overlay is mounted only there).
        """
        if not self.overlay:
            clone_tree(through / self.merged.relative_to("/"), target)
            return ()
        clone_tree(through / self.upper.relative_to("/"), target)
        return (target, *self.lowers)

    def unmount(self) -> None:
        """Unmount the overlay and the image (lazily if something still holds them) and remove the folders."""
        if self.overlay and self.merged.is_mount():
            unmount(self.merged)
        if self.space_bytes is not None and self.space.is_mount():
            unmount(self.space)  # the loop device detaches itself once the file system is gone
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root)
