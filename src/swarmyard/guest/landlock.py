"""Landlock through raw syscalls (ctypes), stdlib only so the in-sandbox init can import it cheaply.

The init calls :func:`restrict_writes` after bwrap has built the sandbox's mounts (a landlocked thread may no
longer change its mounts) and before it runs any command: from then on every process in the machine can write
only beneath the given paths, and (ABI 6+) cannot signal or reach abstract Unix sockets outside its domain.
Given ``exec_only`` files, it also handles the execute right: from then on only those files can be executed.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence

# x86_64 and aarch64 share these numbers (they were added after the syscall tables were unified).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* bits that change the file system, with the ABI that introduced each; and EXECUTE.
_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_CHAR = 1 << 6
_MAKE_DIR = 1 << 7
_MAKE_REG = 1 << 8
_MAKE_SOCK = 1 << 9
_MAKE_FIFO = 1 << 10
_MAKE_BLOCK = 1 << 11
_MAKE_SYM = 1 << 12
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_IOCTL_DEV = 1 << 15  # ABI 5
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1  # ABI 6


class LandlockUnavailable(OSError):
    """The kernel has no usable Landlock (not built in, disabled, or too old for what was asked)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI the kernel offers, or 0 when it has none."""
    result = int(_libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    return max(result, 0)


def write_access(abi: int) -> int:
    """Every write-like access right the given ABI knows."""
    access = (
        _WRITE_FILE
        | _REMOVE_DIR
        | _REMOVE_FILE
        | _MAKE_CHAR
        | _MAKE_DIR
        | _MAKE_REG
        | _MAKE_SOCK
        | _MAKE_FIFO
        | _MAKE_BLOCK
        | _MAKE_SYM
    )
    if abi >= 2:
        access |= _REFER
    if abi >= 3:
        access |= _TRUNCATE
    if abi >= 5:
        access |= _IOCTL_DEV
    return access


def restrict_writes(writable: Sequence[str], *, device_paths: Sequence[str] = (),
                    exec_only: Sequence[str] = ()) -> int:
    """Landlock the calling process: writes only beneath ``writable``; ``device_paths`` get file writes only;
    with ``exec_only``, only those files may be executed (nothing beneath ``writable`` among them).

    Returns the ABI used. Raises :class:`LandlockUnavailable` when the kernel has none.
    """
    libc = _libc()
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable(ctypes.get_errno(), "Landlock is not available on this kernel")
    handled = write_access(abi) | (_EXECUTE if exec_only else 0)
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr { u64 handled_access_fs; u64 handled_access_net; u64 scoped; }
    attr = struct.pack("=QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("=QQ", handled, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), 0))
    if ruleset < 0:
        err = ctypes.get_errno()
        raise LandlockUnavailable(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for path, access in [
            *((p, handled & ~_EXECUTE) for p in writable),
            *((p, handled & (_WRITE_FILE | _TRUNCATE | _IOCTL_DEV)) for p in device_paths),
            *((p, _EXECUTE) for p in exec_only),
        ]:
            _add_path_rule(libc, ruleset, path, access)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(NO_NEW_PRIVS): {os.strerror(err)}")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        # struct landlock_path_beneath_attr { u64 allowed_access; s32 parent_fd; } __attribute__((packed))
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
