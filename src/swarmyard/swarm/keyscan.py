"""The end-of-run scan for provider keys in the machines: their environment, every ``/proc/*/environ`` and
``cmdline`` they can see, and their files (home and ``/tmp``).

The keys themselves never enter a machine to be looked for: the scanner gets each key's length, its first two
characters (a provider's public prefix, at most) and its SHA-256, finds the places where those two characters
stand and hashes the window of the key's length there. A match is reported by where it was, never by value.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from swarmyard.errors import SwarmyardError
from swarmyard.machines.environment import MACHINE_PYTHON

log = logging.getLogger(__name__)

#: Keys shorter than this are not looked for (they would match ordinary text by chance).
MIN_KEY_CHARS = 8

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
for root in (os.path.expanduser("~"), os.getcwd(), "/tmp"):
    for folder, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if not os.path.islink(path) and os.path.getsize(path) <= 64 << 20:
                    with open(path, "rb") as f:
                        look(path, f.read())
            except OSError:
                pass
print(json.dumps({"found": sorted(set(found))}))
"""


@dataclass(frozen=True, slots=True)
class KeyScan:
    """What the scan of the machines found: how many machines were scanned and where a key was seen."""

    machines: int
    places: tuple[str, ...]

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


def scan_machines(machines: Any, machine_ids: list[str], values: list[str]) -> KeyScan:
    """Scan every machine in ``machine_ids`` (a ``swarmyard.machines.Machines``) for the key ``values``."""
    places: list[str] = []
    if not targets(values):
        return KeyScan(len(machine_ids), ())
    for machine_id in machine_ids:
        try:
            result = machines.exec(machine_id, scan_command(values), timeout=300)
        except SwarmyardError as exc:
            log.warning("could not scan machine %s for provider keys: %s", machine_id, exc.message)
            places.append(f"{machine_id}: not scanned ({exc.code})")
            continue
        places += read_places(machine_id, result.stdout)
    return KeyScan(len(machine_ids), tuple(places))
