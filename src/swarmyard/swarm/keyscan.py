"""The end-of-run scan for provider keys in the machines: their processes' ``environ`` and ``cmdline``, and their
files (the machine's disk, ``/tmp``, ``/dev/shm``, ``/var/tmp``).

Where the backend can see into a machine from outside (a machine of its own mount namespace: ``host_view``), this
process reads it there: the files through the root of a process in the machine, the processes' ``/proc`` entries
by their host pids. Nothing the machine's processes do can then change what the scan reports (a scanner started
in the machine could be answered for: a ``.pth`` in its home, a process writing ``{"found": []}`` into its
output). Elsewhere (no namespace of its own, another host) the scanner runs in the machine, with ``-P -s``.

Every file is read whole, streamed (a key across two reads is still found), up to ``MAX_BYTES`` and
``MAX_SECONDS`` a machine; a file past either, or one that cannot be read, is reported as a place not scanned
(it counts as found: a scan that did not look is never read as a clean machine).

The keys themselves never enter a machine to be looked for: the scanner gets each key's length, its first two
characters (a provider's public prefix, at most) and its SHA-256, finds the places where those two characters
stand and hashes the window of the key's length there. A match is reported by where it was, never by value.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmyard.errors import SwarmyardError
from swarmyard.machines.environment import MACHINE_PYTHON
from swarmyard.machines.supervised import HostView

log = logging.getLogger(__name__)

#: Keys shorter than this are not looked for (they would match ordinary text by chance).
MIN_KEY_CHARS = 8
#: What one machine's files are read up to: more than a machine's default disk holds (files past it are counted).
MAX_BYTES = 8 << 30
MAX_SECONDS = 300.0
_CHUNK = 1 << 20
#: The folders of a machine a process in it can write, beside its disk.
_WRITABLE = ("/tmp", "/dev/shm", "/var/tmp")

# Runs inside the machine with the machine's own interpreter; stdlib only, prints one JSON line.
_SCANNER = r"""
import hashlib, json, os, sys
targets = [(n, p.encode(), d) for n, p, d in json.loads(sys.argv[1])]
found = []
def look(where, data):
    for n, prefix, digest in targets:
        at = data.find(prefix)
        while at >= 0:
            if hashlib.sha256(data[at:at + n]).hexdigest() == digest:
                found.append(where)
                return
            at = data.find(prefix, at + 1)
look("env", "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    look(f"/proc/{pid}/{name}", f.read())
            except OSError:
                pass
tail = max([n for n, _, _ in targets] + [1]) - 1
for root in (os.path.expanduser("~"), os.getcwd(), "/tmp", "/dev/shm", "/var/tmp"):
    for folder, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if not os.path.islink(path):
                    with open(path, "rb") as f:
                        kept = b""
                        while chunk := f.read(1 << 20):
                            look(path, kept + chunk)
                            kept = (kept + chunk)[-tail:] if tail else b""
            except OSError:
                pass
print(json.dumps({"found": sorted(set(found))}))
"""


@dataclass(frozen=True, slots=True)
class KeyScan:
    """What the scan of the machines found: how many machines were scanned and where a key was seen; ``looked``
    is False when there was no key to look for (a keyless run: its 0 places prove nothing)."""

    machines: int
    places: tuple[str, ...]
    looked: bool = True

    @property
    def found(self) -> int:
        """Places a provider key was found in."""
        return len(self.places)


def targets(values: list[str]) -> list[tuple[int, str, str]]:
    """(length in bytes, first two characters, SHA-256) of every key worth looking for."""
    out = set()
    for value in values:
        if len(value) >= MIN_KEY_CHARS:
            raw = value.encode()
            out.add((len(raw), value[:2], hashlib.sha256(raw).hexdigest()))
    return sorted(out)


def scan_command(values: list[str]) -> list[str]:
    """The command that scans a machine for ``values`` (run it with the machine's interpreter)."""
    return [*MACHINE_PYTHON, "-c", _SCANNER, json.dumps(targets(values))]


def read_places(machine: str, stdout: bytes) -> list[str]:
    """The places a scan's output names; a scan that printed nothing readable counts as one place, so a broken
    scanner is never read as a clean machine."""
    try:
        data: Any = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        return [f"{machine}:{place}" for place in data["found"]]
    except (ValueError, IndexError, KeyError, TypeError):
        return [f"{machine}: the scan printed no result"]


class _Finder:
    """Looks for the targets in texts; streamed, the last ``tail`` bytes of a read are kept for the next."""

    def __init__(self, values: list[str]) -> None:
        self.targets = [(n, prefix.encode(), digest) for n, prefix, digest in targets(values)]
        self.tail = max(n for n, _, _ in self.targets) - 1

    def has_key(self, data: bytes) -> bool:
        for size, prefix, digest in self.targets:
            at = data.find(prefix)
            while at >= 0:
                if hashlib.sha256(data[at:at + size]).hexdigest() == digest:
                    return True
                at = data.find(prefix, at + 1)
        return False


def scan_view(view: HostView, values: list[str], *, max_bytes: int = MAX_BYTES,
              max_seconds: float = MAX_SECONDS) -> list[str]:
    """The places in a machine, read from outside it, where a key of ``values`` stands."""
    finder = _Finder(values)
    places: list[str] = []
    for pid in view.pids:
        for name in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{pid}/{name}").read_bytes()
                # a pid that ended and was reused by a process of this host is not the machine's
                if os.readlink(f"/proc/{pid}/ns/mnt") != view.namespace:
                    continue
            except OSError:
                continue  # ended while we looked
            if finder.has_key(data):
                places.append(f"/proc/{pid}/{name}")
    budget = [max_bytes]
    deadline = time.monotonic() + max_seconds
    skipped = 0
    for inside in (view.home, *_WRITABLE):
        top = view.root / inside.lstrip("/")
        for folder, _dirs, files in os.walk(top):  # links to folders are not followed
            for name in files:
                path = Path(folder, name)
                where = "/" + str(path.relative_to(view.root))
                found = _scan_file(path, finder, budget, deadline)
                if found is None:
                    skipped += 1
                elif found:
                    places.append(where)
    if skipped:
        places.append(f"{skipped} files not scanned (past {max_bytes} bytes or {max_seconds:.0f} s, or unreadable)")
    return places


def _scan_file(path: Path, finder: _Finder, budget: list[int], deadline: float) -> bool | None:
    """Whether the file at ``path`` holds a key; ``None``: not read to its end. A link is not followed (it would
    be resolved against this host's root)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False  # a link, a socket, a FIFO or a device holds no file's bytes
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return False if exc.errno in (errno.ELOOP, errno.ENOENT) else None  # made a link since, or gone
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # a FIFO or a device holds no file's bytes
        kept = b""
        while True:
            if budget[0] <= 0 or time.monotonic() > deadline:
                return None
            chunk = handle.read(min(_CHUNK, budget[0]))
            if not chunk:
                return False
            budget[0] -= len(chunk)
            if finder.has_key(kept + chunk):
                return True
            kept = (kept + chunk)[-finder.tail:] if finder.tail else b""


def scan_machines(machines: Any, machine_ids: list[str], values: list[str]) -> KeyScan:
    """Scan every machine in ``machine_ids`` (a ``swarmyard.machines.Machines``) for the key ``values``."""
    places: list[str] = []
    if not targets(values):
        return KeyScan(len(machine_ids), (), looked=False)
    for machine_id in machine_ids:
        view = machines.host_view(machine_id)
        if view is not None:
            places += [f"{machine_id}:{place}" for place in scan_view(view, values)]
            continue
        try:
            result = machines.exec(machine_id, scan_command(values), timeout=300)
        except SwarmyardError as exc:
            log.warning("could not scan machine %s for provider keys: %s", machine_id, exc.message)
            places.append(f"{machine_id}: not scanned ({exc.code})")
            continue
        places += read_places(machine_id, result.stdout)
    return KeyScan(len(machine_ids), tuple(places))
