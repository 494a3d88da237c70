"""A seccomp filter built by hand as classic BPF, in the byte layout bwrap's ``--seccomp FD`` reads.

The filter checks the architecture first (a 32-bit or x32 syscall could otherwise reach a denied call under another
number), then denies a fixed list of syscalls with ``EPERM`` (io_uring among them), namespace flags on ``clone``,
the terminal injection ioctls ``TIOCSTI`` and ``TIOCLINUX``, and every socket family but the four a machine uses
(``socket`` and ``socketpair`` answer ``EAFNOSUPPORT``, as for a family the kernel lacks, so a program falls
back). The kernel truncates an ioctl request to 32 bits, so only the low word of the argument is compared:
``TIOCSTI | 1 << 32`` (the "high-bit variant") is denied the same way.
``clone3`` answers ``ENOSYS``: its flags sit in memory BPF cannot read, and libc falls back to ``clone``.
A governed machine's filter (``governed=True``) also answers ``memfd_create`` and ``memfd_secret`` with ``ENOSYS``:
a memfd lives on the kernel's internal mount, beneath no Landlock rule, so ``execve`` of one (``/proc/self/fd/N``
or ``execveat(fd, "", AT_EMPTY_PATH)``) would run any program past the exec allowlist. ``ENOSYS``, as for a kernel
without them, so a program that uses one for memory falls back (wasmtime does). Every other file a process can
name or hold an fd of is on a mount Landlock sees, so ``execveat`` needs no rule of its own.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
from dataclasses import dataclass

# BPF opcodes (linux/filter.h) and seccomp constants (linux/seccomp.h, linux/audit.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
# seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]  (little endian: the low word of args[i] is at 16 + 8 i)
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LO = 16
_OFF_ARG1_LO = 24
_SOCKET = 41
_SOCKETPAIR = 53

#: x86_64 syscall numbers denied with EPERM.
DENIED_SYSCALLS: dict[str, int] = {
    "ptrace": 101,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "acct": 163,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    # io_uring runs file and socket operations from kernel workers, around the per-syscall checks above (the
    # common container default denies it too).
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
}
_IOCTL = 16
_CLONE = 56
_CLONE3 = 435
#: Refused with ENOSYS in a governed machine (see the module docstring).
GOVERNED_ENOSYS: dict[str, int] = {"memfd_create": 319, "memfd_secret": 447}
#: Terminal ioctls that push input into another process's terminal or console.
DENIED_IOCTLS: dict[str, int] = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
#: The socket families a machine may open; the network namespace confines only these. AF_UNIX: the init's
#: control socket and the relay's way to the plane; AF_INET and AF_INET6: the relay's loopback port and
#: anything an agent serves or calls on loopback; AF_NETLINK: glibc's getaddrinfo asks the kernel for the
#: addresses configured (AI_ADDRCONFIG), as Python and Node do. Everything else (AF_VSOCK, which reaches the
#: hypervisor around the namespace, AF_PACKET, AF_BLUETOOTH, AF_ALG, AF_XDP...) is refused.
ALLOWED_SOCKET_FAMILIES: dict[str, int] = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NS_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
)


@dataclass(frozen=True, slots=True)
class _Insn:
    code: int
    jt: int
    jf: int
    k: int


def _stmt(code: int, k: int) -> _Insn:
    return _Insn(code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> _Insn:
    return _Insn(code, jt, jf, k)


def supported_arch() -> bool:
    """Whether this filter knows the host's syscall numbers (x86_64 only for now)."""
    return platform.machine() == "x86_64"


def build_program(governed: bool = False) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions (``governed``: a governed machine's, see above)."""
    deny = _stmt(_RET_K, _RET_ERRNO | errno.EPERM)
    allow = _stmt(_RET_K, _RET_ALLOW)
    prog: list[_Insn] = [
        _stmt(_LD_W_ABS, _OFF_ARCH),
        _jump(_JEQ_K, _AUDIT_ARCH_X86_64, 1, 0),
        deny,
        _stmt(_LD_W_ABS, _OFF_NR),
        _jump(_JGE_K, _X32_SYSCALL_BIT, 0, 1),
        deny,
    ]
    for nr in sorted(set(DENIED_SYSCALLS.values())):
        prog += [_jump(_JEQ_K, nr, 0, 1), deny]
    enosys = [_CLONE3, *(sorted(GOVERNED_ENOSYS.values()) if governed else [])]
    for nr in enosys:
        prog += [_jump(_JEQ_K, nr, 0, 1), _stmt(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # clone(flags, ...): deny any namespace flag in the low word of arg0.
    prog += [
        _jump(_JEQ_K, _CLONE, 0, 3),
        _stmt(_LD_W_ABS, _OFF_ARG0_LO),
        _jump(_JSET_K, _CLONE_NS_FLAGS, 0, 1),
        deny,
        _stmt(_LD_W_ABS, _OFF_NR),
    ]
    # socket(domain, ...) and socketpair(domain, ...): an allowed domain goes on to the checks below (past the
    # reload of the syscall number), any other is EAFNOSUPPORT. The kernel reads the domain as an int: the low word.
    families = sorted(ALLOWED_SOCKET_FAMILIES.values())
    n = len(families)
    prog += [_jump(_JEQ_K, _SOCKET, 1, 0), _jump(_JEQ_K, _SOCKETPAIR, 0, n + 3), _stmt(_LD_W_ABS, _OFF_ARG0_LO)]
    prog += [_jump(_JEQ_K, family, n - i, 0) for i, family in enumerate(families)]
    prog += [_stmt(_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT), _stmt(_LD_W_ABS, _OFF_NR)]
    # ioctl(fd, request, ...): compare only the low 32 bits of the request, as the kernel does.
    ioctls = sorted(DENIED_IOCTLS.values())
    prog += [_jump(_JEQ_K, _IOCTL, 0, 1 + 2 * len(ioctls)), _stmt(_LD_W_ABS, _OFF_ARG1_LO)]
    for request in ioctls:
        prog += [_jump(_JEQ_K, request, 0, 1), deny]
    prog.append(allow)
    return [(i.code, i.jt, i.jf, i.k) for i in prog]


@functools.cache
def build_filter(governed: bool = False) -> bytes:
    """The filter as the array of ``struct sock_filter`` bytes bwrap's ``--seccomp`` expects."""
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in build_program(governed))


#: x86_64 syscall numbers of exec.
_EXECVE = 59
_EXECVEAT = 322
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def build_exec_lock() -> list[tuple[int, int, int, int]]:
    """A filter that refuses ``execve`` and ``execveat`` with ``EACCES`` and allows everything else."""
    deny = _stmt(_RET_K, _RET_ERRNO | errno.EACCES)
    prog = [
        _stmt(_LD_W_ABS, _OFF_ARCH),
        _jump(_JEQ_K, _AUDIT_ARCH_X86_64, 1, 0),
        deny,  # another ABI's exec under another number
        _stmt(_LD_W_ABS, _OFF_NR),
        _jump(_JGE_K, _X32_SYSCALL_BIT, 0, 1),
        deny,
        _jump(_JEQ_K, _EXECVE, 0, 1),
        deny,
        _jump(_JEQ_K, _EXECVEAT, 0, 1),
        deny,
        _stmt(_RET_K, _RET_ALLOW),
    ]
    return [(i.code, i.jt, i.jf, i.k) for i in prog]


def lock_exec() -> None:
    """From now on neither this process nor any child it makes can exec anything (for good: a filter stays).

    A governed agent calls it as it starts, before it reads a model's first reply: its machine already lets it
    execute only its interpreter (Landlock, set by the machine's init); this takes even that away, so what the
    agent runs is the process it is. ``OSError`` when the kernel refuses the filter.
    """
    if not supported_arch():
        raise OSError(errno.ENOSYS, f"no exec lock for {platform.machine()} (x86_64 only)")
    load_filter(b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in build_exec_lock()))


def load_filter(raw: bytes) -> None:
    """Put the filter ``raw`` (``struct sock_filter`` bytes, as :func:`build_filter` makes) on this process and
    every child it makes, for good (after ``PR_SET_NO_NEW_PRIVS``). ``OSError`` when the kernel refuses it."""
    import ctypes

    if not raw or len(raw) % 8:
        raise OSError(errno.EINVAL, "a seccomp filter is a whole number of 8-byte instructions")
    filters = ctypes.create_string_buffer(raw, len(raw))

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _SockFprog(len(raw) // 8, ctypes.cast(filters, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(NO_NEW_PRIVS): {os.strerror(err)}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(SECCOMP_MODE_FILTER): {os.strerror(err)}")
