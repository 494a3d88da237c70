"""The files an exec allowlist must hold for its programs to start: each program and its ELF interpreter.

The kernel opens a dynamically linked program's interpreter (``PT_INTERP``, ``/lib64/ld-linux-x86-64.so.2``) for
exec as well, so Landlock checks the execute right on it too. Shared libraries are mapped, not executed: they
need no entry.
"""

from __future__ import annotations

import os
import struct

_PT_INTERP = 3


def interpreter_of(path: str) -> str | None:
    """The ELF interpreter a program names, or ``None`` (static, a script, not ELF, unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None  # only 64-bit little-endian ELF (the hosts seccomp.py knows)
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                kind, = struct.unpack("<I", f.read(4))
                if kind == _PT_INTERP:
                    f.seek(phoff + i * phentsize + 8)
                    offset, = struct.unpack("<Q", f.read(8))
                    f.seek(phoff + i * phentsize + 32)
                    size, = struct.unpack("<Q", f.read(8))
                    f.seek(offset)
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def exec_allowlist(programs: tuple[str, ...]) -> tuple[str, ...]:
    """Each program's real path and its interpreter's, once each, in order."""
    out: list[str] = []
    for program in programs:
        real = os.path.realpath(program)
        interp = interpreter_of(real)
        for path in (real, os.path.realpath(interp) if interp else None):
            if path is not None and path not in out:
                out.append(path)
    return tuple(out)


def cli_allowlist(program: str, path: str) -> tuple[str, ...]:
    """What an agent CLI found on ``path`` needs to execute, and nothing else: the file it resolves to; when that
    is a script, the interpreter its ``#!`` line names (through ``/usr/bin/env``) and the native binaries of the
    same name its package vendors (an npm launcher script hands over to one: Codex's ``codex.js`` execs
    ``vendor/<target>/bin/codex``); and each one's ELF interpreter. Not what else the package vendors (ripgrep, a
    bwrap, helper hosts): those serve the CLI's own tools, which a governed worker has off. ``()`` when not found."""
    import shutil

    found = shutil.which(program, path=path)
    if found is None:
        return ()
    real = os.path.realpath(found)
    out = [real]
    try:
        with open(real, "rb") as f:
            line = f.readline(256)
    except OSError:
        line = b""
    if line.startswith(b"#!"):
        words = line[2:].decode("utf-8", "replace").split()
        if words:
            out.append(words[0])
            if os.path.basename(words[0]) == "env" and len(words) > 1:
                named = shutil.which(words[1], path=path)
                if named:
                    out.append(named)
        out += _vendored(real, program)
    return exec_allowlist(tuple(out))


def _vendored(script: str, program: str) -> list[str]:
    """The executable ELF files named ``program`` beneath the package folder of ``script`` (the nearest folder
    above it that holds a ``package.json``), sorted."""
    folder = os.path.dirname(script)
    while folder != "/" and not os.path.isfile(os.path.join(folder, "package.json")):
        folder = os.path.dirname(folder)
    if folder == "/":
        return []
    found = []
    for top, _, names in os.walk(folder):
        for name in names:
            candidate = os.path.join(top, name)
            if name == program and os.access(candidate, os.X_OK) and _is_elf(candidate):
                found.append(candidate)
    return sorted(found)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
