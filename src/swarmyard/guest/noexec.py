"""What the Python init does for a governed machine before its seccomp filter: writable mounts made ``noexec``
(stdlib only, like the init).

Landlock's execute right stops ``execve`` of a file outside the allowlist, but not ``ld.so FILE``: the loader is
allowed (every dynamically linked program needs it) and maps the file itself. A ``noexec`` mount is what the
kernel checks at ``mmap(PROT_EXEC)``, so an ELF written to a writable folder can be neither executed nor loaded.
``mount_setattr`` needs ``CAP_SYS_ADMIN`` in the machine's user namespace: the init calls it before it gives up
its capabilities, and before the filter that denies the call is loaded.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
from collections.abc import Sequence

_SYS_MOUNT_SETATTR = 442
_SYS_CAPSET = 126
_MOUNT_ATTR_NOEXEC = 0x08
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_NEWUSER = 0x10000000
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24


def read_only_beneath(path: str) -> list[str]:
    """The read-only mounts strictly beneath ``path`` that are not ``noexec``: the machine's view of the interpreter
    and its packages sits there when they are installed beneath a writable folder (a virtual environment under
    /tmp, say). Nothing can write them, so they keep their exec."""
    kept = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as mounts:
        for line in mounts:
            fields = line.split(" ")
            if len(fields) < 6:
                continue
            point = re.sub(r"\\([0-3][0-7]{2})", lambda m: chr(int(m[1], 8)), fields[4])
            options = fields[5].split(",")
            if point.startswith(path.rstrip("/") + "/") and "ro" in options and "noexec" not in options:
                kept.append(point)
    return kept


def mount_noexec(paths: Sequence[str]) -> None:
    """Mark each path's mount ``noexec``, with every writable mount beneath it (but not beneath ``/``: its tree
    holds ``/usr``). ``OSError`` when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", _MOUNT_ATTR_NOEXEC, 0, 0, 0), 32)
    back = ctypes.create_string_buffer(struct.pack("=QQQQ", 0, _MOUNT_ATTR_NOEXEC, 0, 0), 32)
    for path in paths:
        recursive = path != "/"
        kept = read_only_beneath(path) if recursive else []
        calls = [(path, _AT_RECURSIVE if recursive else 0, attr, "noexec")] + [(k, 0, back, "exec") for k in kept]
        for target, flags, what, name in calls:
            if libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, os.fsencode(target), flags, what,
                            ctypes.c_size_t(32)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mount_setattr({name}) {target}: {os.strerror(err)}")


def nest_user(uid: int) -> None:
    """Become ``uid`` (and its gid) in a user namespace of our own nested in the machine's, as bwrap does when it is
    not root and the sandbox's uid is not 0: bwrap's own nested namespace would not own the machine's mounts, so it
    is made here, after they were marked noexec. ``OSError`` when the kernel refuses."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUSER): {os.strerror(err)}")
    for name, text in (("uid_map", f"{uid} {outer_uid} 1\n"), ("setgroups", "deny"),
                       ("gid_map", f"{uid} {outer_gid} 1\n")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


def drop_capabilities() -> None:
    """Give up every capability (a sandbox bwrap started as a non-root uid holds the ones it was given as
    ambient ones; a nested user namespace starts with all of them), and the bounding set where ``CAP_SETPCAP``
    allows. ``OSError`` when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    cap = 0
    while cap < 64 and libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # refused without CAP_SETPCAP: the uid drop took it already
        cap += 1
    head = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(24)  # two struct __user_cap_data_struct, all zero
    if (libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0
            or libc.syscall(_SYS_CAPSET, head, data) != 0):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot drop capabilities: {os.strerror(err)}")
