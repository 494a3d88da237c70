"""Who ``swarmyard serve`` runs as: started as root, the control plane's own system user (``swarmyard-plane``).

The plane holds the store, the provider keys and the audit log's key, and must not be able to read the
evaluator's protected bundle or the witness's key: those are 0700 folders of ``swarmyard-eval`` and
``swarmyard-witness``. So, started as root, ``serve`` does what needs root first (reads its token secret, writes
the operator token, opens and migrates the store, binds its sockets, imports every module it will use and
builds its app, since the interpreter and its packages' data, such as the CA file a TLS client reads, may live
where the plane's user cannot read) and then drops to its user for good, keeping as
supplementary groups only the evaluator's and the witness's groups, which open their sockets (mode 0660) and
nothing else of theirs (their files are owner-only).

What the plane writes must then be its user's: the SQLite file, its ``-wal``/``-shm`` and ``blobs/`` are handed
to it, and the folders it creates files in (the store's, ``--audit-dir``, ``--trajectories``, ``--cache-dir``)
must be ones it can write (``install -d -o swarmyard-plane -m 0700 /var/lib/swarmyard/plane``). When one is not,
the plane stays root and says so, naming the folder, rather than fail on its first write; ``--user root`` keeps
root without a word. ``swarmyard serve`` runs no machines, so it needs no root capability after the switch.
"""

from __future__ import annotations

import grp
import importlib
import logging
import os
import pkgutil
import socket
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from swarmyard.identity import EVAL_USER, PLANE_USER, WITNESS_USER, Identity, ensure_system_user

if TYPE_CHECKING:
    from swarmyard.plane.server import Listen

log = logging.getLogger(__name__)

__all__ = ["PLANE_USER", "chown_tree", "hand_over", "import_everything", "peer_groups", "plane_identity",
           "prepare_switch", "sqlite_file"]


def _allows(who: Identity, info: os.stat_result, bits: int) -> bool:
    """Whether ``who`` (no supplementary groups) has ``bits`` (r=4, w=2, x=1) on a file with ``info``."""
    if info.st_uid == who.uid:
        shift = 6
    elif info.st_gid == who.gid:
        shift = 3
    else:
        shift = 0
    return (info.st_mode >> shift) & bits == bits


def unwritable(who: Identity, folder: Path) -> str | None:
    """Why ``who`` cannot make files in ``folder`` (made later if absent: then in its nearest existing parent),
    or ``None`` if it can."""
    folder = folder.absolute()
    target = folder
    while not target.exists():
        target = target.parent
    for ancestor in reversed(target.parents):
        if not _allows(who, ancestor.stat(), 1):
            return f"{ancestor} is not searchable by {who.name}"
    info = target.stat()
    if not stat.S_ISDIR(info.st_mode) or not _allows(who, info, 3):
        return f"{target} is not writable by {who.name}"
    return None


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///`` store URL (as ``open_store`` reads it), else ``None``."""
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return None
    return Path(url.removeprefix("sqlite:///")).absolute()


def plane_identity(user: str, store_url: str, writes_in: Sequence[Path]) -> tuple[Identity | None, str | None]:
    """Started as root: the plane's user to switch to, or ``None`` and why it stays root (``None`` when asked
    to, with ``--user root``); ``writes_in`` are the folders it makes files in beside the store's. Not root:
    ``(None, None)``, nothing to switch."""
    if os.geteuid() != 0 or user == "root":
        return None, None
    runner = ensure_system_user(user)
    store = sqlite_file(store_url)
    for folder in [*writes_in, *([store.parent] if store is not None else [])]:
        why = unwritable(runner, folder)
        if why is not None:
            return None, why
    return runner, None


def prepare_switch(runner: Identity, store_url: str, listen: Listen) -> tuple[socket.socket | None,
                                                                               socket.socket | None]:
    """What needs root before the switch: the store handed to ``runner``, the sockets bound (returned, for the
    server to serve), every module imported."""
    from swarmyard.plane.server import bind

    hand_over(runner, sqlite_file(store_url))
    sockets = bind(listen)
    import_everything()
    return sockets


def hand_over(runner: Identity, sqlite_file: Path | None) -> None:
    """Give ``runner`` the SQLite store (the file, its ``-wal``/``-shm``, its ``blobs/`` tree) it must write.

    The store's folder and ``blobs/`` may already be the plane's, so its user may swap any folder in them for a
    symlink while this runs (as root): a walk by path would then follow it and hand over whatever it points to
    (the witness's key). So the folder is opened once, everything is named relative to an open folder and never
    followed (``os.fwalk`` opens each folder and checks it is the one it listed), and each is changed in place.
    It may also hard-link any file it can read and write into them: a file is changed only through an open
    descriptor that shows it has one link, so a file of another's outside the store is left as it is.
    """
    if sqlite_file is None:
        return
    try:
        folder = os.open(sqlite_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for name in (sqlite_file.name, sqlite_file.name + "-wal", sqlite_file.name + "-shm"):
            _give(runner, name, folder, sqlite_file.parent)
        chown_tree(runner, "blobs", folder, sqlite_file.parent)
    finally:
        os.close(folder)


#: How a file is opened to be handed over: never through a symlink, never blocking (a FIFO put in its place),
#: never becoming a terminal's.
_OPEN_TO_GIVE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _give(runner: Identity, name: str, folder: int, where: Path) -> None:
    """The regular file ``name`` in the open ``folder`` (``where``, for the log) to ``runner``, unless it is
    missing, not a regular file (a symlink, a FIFO: root makes none in the store, and the plane needs none of
    them to be its own), already the runner's, or linked from elsewhere too.

    A file with more than one link is also a file outside the store (or may be): the plane's user can hard-link
    into the store any file it can read and write, and changing its owner would hand it that file for good. The
    link count is read on the descriptor that is then changed, so a name swapped in between changes nothing."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode) or (info.st_uid, info.st_gid) == (runner.uid, runner.gid):
        return
    try:
        fd = os.open(name, _OPEN_TO_GIVE, dir_fd=folder)
    except OSError as exc:  # gone, or swapped for a symlink (ELOOP) or a socket (ENXIO)
        log.warning("not handed to %s: %s (%s)", runner.name, where / name, exc.strerror)
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_uid, info.st_gid) == (runner.uid, runner.gid):
            return
        if info.st_nlink != 1:
            log.warning("not handed to %s: %s has %d links, so it is also a file elsewhere (left owned by uid %d)",
                        runner.name, where / name, info.st_nlink, info.st_uid)
            return
        os.fchown(fd, runner.uid, runner.gid)
    finally:
        os.close(fd)


def chown_tree(runner: Identity, name: str, folder: int, where: Path) -> None:
    """The folder ``name`` in the open ``folder`` (``where``, for the log) and all in it to ``runner``, as
    ``_give`` hands over a file; a symlink is never followed, and a folder swapped for a symlink while walking is
    passed over (``os.fwalk`` without ``follow_symlinks``)."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        return  # a symlink (or a file) where blobs/ should be: nothing of the store's to hand over
    for path, _, files, dir_fd in os.fwalk(name, dir_fd=folder, follow_symlinks=False):
        here = os.fstat(dir_fd)  # a folder has one name (no hard links to folders): it is the store's
        if (here.st_uid, here.st_gid) != (runner.uid, runner.gid):
            os.fchown(dir_fd, runner.uid, runner.gid)
        for entry in files:  # its folders are handed over as the walk opens them
            _give(runner, entry, dir_fd, where / path)


def peer_groups() -> list[int]:
    """The evaluator's and the witness's groups (those that exist): their sockets are 0660 in their group."""
    gids = []
    for name in (EVAL_USER, WITNESS_USER):
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return gids


#: Modules that third-party code imports lazily on a request, beyond what importing swarmyard pulls in.
_LAZY = ("anyio._backends._asyncio", "uvicorn.protocols.http.h11_impl", "uvicorn.protocols.http.httptools_impl",
         "uvicorn.protocols.websockets.auto", "uvicorn.lifespan.off", "uvicorn.lifespan.on", "uvicorn.loops.asyncio",
         "uvicorn.loops.uvloop", "h11", "email.utils", "concurrent.futures.thread", "encodings.idna", "sqlite3",
         "starlette.formparsers", "httpcore._sync.connection_pool", "httpcore._async.connection_pool",
         "httpx._transports.default", "multiprocessing.connection", "json.decoder", "ssl", "hmac", "secrets", "rich._emoji_codes",
         "rich._emoji_replace", "rich.markup", "rich.traceback")


def import_everything() -> int:
    """Import every swarmyard module (and ``_LAZY``) now, while the interpreter's folders are readable; return how
    many imported. One that needs a missing optional extra is skipped: the plane does not use it either."""
    import swarmyard

    count = 0
    names = [info.name for info in pkgutil.walk_packages(swarmyard.__path__, "swarmyard.")]
    for name in [*names, *_LAZY]:
        if name.endswith(("__main__", ".agent")) or ".bench." in name:
            continue  # entry points and benchmarks: never loaded by a serving plane
        try:
            importlib.import_module(name)
        except Exception:  # an optional extra that is not installed, or a module for another platform
            log.debug("not imported: %s", name, exc_info=True)
            continue
        count += 1
    return count
