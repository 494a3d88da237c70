"""Machine disks: overlayfs over a read-only baseline where the host allows it, else a reflink-or-copy clone.

A fork snapshots the source's upper layer (only what the source changed, usually small) into a new read-only
layer, so neither machine sees the other's later writes while the baseline below them is shared, never copied.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile
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


def mount_overlay(lowers: tuple[Path, ...], upper: Path, work: Path, target: Path) -> None:
    """Mount overlayfs with mount(2) directly: running mount(8) costs a process and ~3 ms per machine."""
    _mount(f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}", target)


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

    @property
    def merged(self) -> Path:
        """The folder the sandbox sees as its disk."""
        return self.root / "disk"

    @property
    def upper(self) -> Path:
        """Where the machine's own writes land (the disk itself without overlayfs)."""
        return self.root / "upper" if self.overlay else self.merged

    def make_folders(self, owner: tuple[int, int] | None = None) -> None:
        """Create the disk's folders (the merged view, and overlayfs's upper and work folders); the machine's
        writable root (upper, else the disk itself) belongs to ``owner`` when given."""
        self.merged.mkdir(parents=True, exist_ok=True)
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
        return f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={self.upper},workdir={self.root / 'work'}"

    def mount(self) -> None:
        """Create the folders (unless made already) and mount the overlay here (else the disk is a plain folder).

        The ``local`` backend with its compiled launcher does not call this: the launcher mounts the overlay in a
        mount namespace of the machine's own (see ``sandbox_init.c``), so the host's mount table stays small.
        """
        if not self.made:
            self.make_folders()
        if self.overlay:
            _mount(self.overlay_options(), self.merged)

    def snapshot(self, target: Path) -> tuple[Path, ...]:
        """Freeze this disk's current state as read-only layers for a fork; returns the fork's lower layers."""
        if not self.overlay:
            clone_tree(self.merged, target)
            return ()
        clone_tree(self.upper, target)
        return (target, *self.lowers)

    def unmount(self) -> None:
        """Unmount the overlay (lazily if something still holds it) and remove the machine's folders."""
        if self.overlay and self.merged.is_mount():
            unmount(self.merged)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root)
