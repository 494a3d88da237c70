"""The read-only trees every machine of a ``local`` backend shares: its ``/etc`` and its ``/run``.

bwrap pays for each mount at every boot (a bind, a read-only remount and a walk of the path), so a dozen single
files bound one by one from the host's /etc cost about 2 ms a machine. Instead the few host entries an agent
needs are copied once into a prepared folder with the machine's own passwd, group and hostname, and each machine
binds that one folder. ``/run`` likewise: the init and the mount points for the control sockets, one bind.

The folder's name hashes what went into it (the host entries' identities and times, the init binary), so a host
that runs ``ldconfig`` or ``update-ca-certificates`` gets a fresh copy at the next backend start, and a folder
that machines of another backend still bind is never changed under them. ``/etc/ssl/private`` is left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from swarmyard.ids import new_id

#: Host /etc entries a machine sees (when the host has them).
ETC = (
    "ssl",
    "ca-certificates",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "mime.types",
)
_OWN = {
    "passwd": (
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:1000:1000:agent:/machine:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n",
    "hostname": "machine\n",
    # a machine on a private network binds its own over this one (names of its peers as <name>.yard)
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
}
#: Host entries never copied: private keys have no business in a machine.
_SKIP = {"private"}


def _identity(host_etc: Path, init: Path | None) -> str:
    digest = hashlib.sha256()
    for name in ETC:
        try:
            info = os.lstat(host_etc / name)
        except FileNotFoundError:
            digest.update(f"{name}:-\n".encode())
            continue
        digest.update(f"{name}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    for name, text in sorted(_OWN.items()):
        digest.update(f"{name}={text}".encode())
    digest.update(str(init).encode())
    return digest.hexdigest()[:20]


def prepare(root: Path, init: Path | None, host_etc: Path = Path("/etc")) -> Path:
    """The shared tree under ``root`` (made now unless an identical one exists): ``etc/`` and ``run/``.

    ``run/swarmyard/`` holds ``init`` (a copy of ``init`` when given), an empty ``ctl/`` folder and an empty
    ``plane.sock`` file, so the per-machine binds onto them need no writable parent.
    """
    target = root / "sys" / _identity(host_etc, init)
    if target.is_dir():
        return target
    target.parent.mkdir(mode=0o755, exist_ok=True)
    staging = target.parent / f".{target.name}.{new_id('tmp')}"
    try:
        etc = staging / "etc"
        etc.mkdir(parents=True, mode=0o755)
        for name in ETC:
            source = host_etc / name
            if source.is_symlink():
                os.symlink(os.readlink(source), etc / name)
            elif source.is_dir():
                shutil.copytree(source, etc / name, symlinks=True, ignore=lambda _d, names: _SKIP & set(names))
            elif source.is_file():
                shutil.copy2(source, etc / name)
        for name, text in _OWN.items():
            (etc / name).write_text(text)
        run = staging / "run" / "swarmyard"
        (run / "ctl").mkdir(parents=True, mode=0o755)
        (run / "plane.sock").touch(mode=0o644)
        if init is not None:
            shutil.copy2(init, run / "init")
        for folder in (staging, staging / "run"):
            folder.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            # Another backend on this root made the same tree first: use theirs.
            if not target.is_dir():
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
    return target
