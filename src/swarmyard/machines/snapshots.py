"""Snapshots: named, versioned, read-only disks that machines start from (golden images, warm starts).

A snapshot's version ``N`` is the machine baseline ``NAME.vN`` (a frozen copy of a folder or of a machine's
disk, see ``prepare_baseline``), and ``NAME`` itself is kept pointing at the newest version, so a swarm file's
``workers.baseline = "NAME"`` starts every worker from it. Each version records the digest of its files, the
same digest :func:`tree_digest` gives a machine's disk: every machine made from one version starts with that
digest. Metadata lives beside the baselines, in ``snapshots/NAME/vN.json`` under the machines' root.

Snapshots belong to whoever made them, each in a namespace of its own on the root:

* the host operator's (``swarmyard machines snapshot create``, a swarm file's baseline, the benches): as above,
  ``NAME`` a plain name; every host client of the root may start machines from them, no coordinator machine may;
* a ``Boxd`` client's (``Snapshots(backend, client=ID)``): ``snapshots/~ID/NAME/vN.json``, its versions the
  baselines ``~ID~NAME.vN``, each version's record naming ``ID`` as its owner. Another client, and any
  coordinator machine outside the namespace its client gave it, finds them ``not_found``, exactly as a name no one
  used; the records stay when the maker's process exits, so they stay its (and the operator's). A client's names
  may hold dots: a coordinator ``boss`` of the client starts machines from ``boss.NAME`` when it asks for ``NAME``,
  a name without a dot (so ``boss.x.NAME`` is coordinator ``boss.x``'s, never ``boss``'s ``x.NAME``).

The namespaces keep clients apart, not users: every client of a root runs as the user who owns the root (see
:func:`swarmyard.machines.supervised.open_root`), who can read any of its folders anyway. What they stop is a
coordinator machine (code the client does not control) reaching a disk its client did not hand it.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from swarmyard.errors import ConflictError, InvalidInputError, NotFoundError
from swarmyard.machines import live
from swarmyard.machines.protocol import Backend

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,50}\Z")
#: A client's snapshot names may hold dots (``boss.golden``: its coordinator ``boss``'s ``golden``); they have
#: no ``NAME`` link among the baselines to collide with a version's folder.
_DOTTED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
#: A client's id, as its namespace's folder names it.
CLIENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,50}\Z")
#: Files a machine's disk digest leaves out: what the Boxd client writes into every machine to log its agents
#: in (each machine's own token), like a machine id.
IDENTITY_FILES = (".claude.json", ".codex/config.toml", ".config/opencode/opencode.json", ".pi/agent/models.json",
                  ".pi/agent/settings.json", ".swarmyard/claude-mcp.json")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One version of a snapshot."""

    name: str
    version: int
    digest: str
    size_bytes: int
    created_at: float
    source: str
    #: the client whose namespace holds it (``None``: the host operator's)
    owner: str | None = None

    @property
    def baseline(self) -> str:
        """The machine baseline this version is."""
        if self.owner is not None:
            return f"~{self.owner}~{self.name}.v{self.version}"
        return f"{self.name}.v{self.version}"


def parse_ref(ref: str, *, dotted: bool = False) -> tuple[str, int | None]:
    """``NAME`` or ``NAME:VERSION``; ``InvalidInputError`` for anything else (``dotted``: a client's name)."""
    if not isinstance(ref, str):
        raise InvalidInputError("a snapshot is named NAME or NAME:VERSION", field="snapshot")
    name, colon, version = ref.partition(":")
    if not (_DOTTED if dotted else _NAME).match(name):
        chars = "1-63 letters, digits, '.', '_' or '-'" if dotted else "1-51 letters, digits, '_' or '-'"
        raise InvalidInputError(f"a snapshot name is {chars}, starting with a letter or digit", field="snapshot")
    if not colon:
        return name, None
    if not version.isascii() or not version.isdigit() or version.startswith("0") or len(version) > 9:
        raise InvalidInputError(f"snapshot version {version!r} is not a whole number from 1", field="snapshot")
    return name, int(version)


def tree_digest(root: Path, leave_out: tuple[str, ...] = ()) -> tuple[str, int]:
    """The SHA-256 of a folder's files (their relative paths, modes and contents, in path order) and their size.

    Symbolic links count by their target text; folders by the files in them.
    """
    outer = hashlib.sha256()
    size = 0
    entries: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if rel not in leave_out:
                entries.append((rel, path))
    for rel, path in sorted(entries):
        info = path.lstat()
        if path.is_symlink():
            body = hashlib.sha256(os.readlink(path).encode()).hexdigest()
        else:
            inner = hashlib.sha256()
            with path.open("rb") as handle:
                while block := handle.read(1 << 20):
                    inner.update(block)
            body = inner.hexdigest()
            size += info.st_size
        outer.update(f"{rel}\0{info.st_mode & 0o777:o}\0{body}\n".encode())
    return outer.hexdigest(), size


class Snapshots:
    """The snapshots of one machines backend (kept under its root) in one namespace: the host operator's
    (``client=None``) or the client ``client``'s."""

    def __init__(self, backend: Backend, client: str | None = None) -> None:
        root = getattr(backend, "root", None)
        if not isinstance(root, Path):
            raise InvalidInputError(f"the {backend.name} backend keeps no snapshots", field="backend")
        if client is not None and (not isinstance(client, str) or not CLIENT_ID.match(client)):
            raise InvalidInputError("a client id is 1-51 letters, digits, '_' or '-', starting with a letter or "
                                    "digit", field="client")
        self._backend = backend
        self.client = client
        self._baselines = root / "baselines"
        self._meta = root / "snapshots" if client is None else root / "snapshots" / f"~{client}"

    def _parse(self, ref: str) -> tuple[str, int | None]:
        return parse_ref(ref, dotted=self.client is not None)

    def _versions_of(self, name: str) -> list[Snapshot]:
        folder = self._meta / name
        if name.startswith("~") or not folder.is_dir():
            return []
        found = []
        for path in folder.glob("v*.json"):
            snapshot = Snapshot(**json.loads(path.read_text()))
            if snapshot.owner == self.client and snapshot.name == name:  # its record names this namespace
                found.append(snapshot)
        return sorted(found, key=lambda s: s.version)

    def versions(self, name: str) -> list[Snapshot]:
        """Every version of ``name``, oldest first; ``NotFoundError`` when it has none."""
        found = self._versions_of(self._parse(name)[0])
        if not found:
            raise NotFoundError("snapshot", name)
        return found

    def get(self, ref: str) -> Snapshot:
        """``NAME`` (its newest version) or ``NAME:VERSION``."""
        name, version = self._parse(ref)
        for snapshot in reversed(self._versions_of(name)):
            if version is None or snapshot.version == version:
                return snapshot
        raise NotFoundError("snapshot", ref)

    def list(self) -> list[Snapshot]:
        """The newest version of every snapshot, by name."""
        if not self._meta.is_dir():
            return []
        newest = [self._versions_of(p.name) for p in sorted(self._meta.iterdir()) if p.is_dir()]
        return [versions[-1] for versions in newest if versions]

    def check_baseline(self, name: str) -> None:
        """Refuse a baseline this namespace may not start a machine from: another client's snapshot version is
        ``not_found`` (as a name no one used), and a name that is no folder of the baselines is invalid."""
        if not isinstance(name, str) or not name or "/" in name or "\0" in name or name.startswith("."):
            raise InvalidInputError("a baseline is named by its folder's name", field="baseline")
        if name.startswith("~") and (self.client is None or not name.startswith(f"~{self.client}~")):
            raise NotFoundError("baseline", name)

    def create(self, name: str, *, folder: Path | None = None, machine_id: str | None = None) -> Snapshot:
        """A new version of ``name`` from a folder or from a live machine's disk (exactly one of them)."""
        name, version = self._parse(name)
        if version is not None:
            raise InvalidInputError("a snapshot's version is given by swarmyard: name it without one",
                                    field="snapshot")
        if (folder is None) == (machine_id is None):
            raise InvalidInputError("snapshot a folder or a machine, one of them", field="from")
        if folder is not None and not Path(folder).is_dir():
            raise InvalidInputError(f"{folder} is not a folder", field="from")
        existing = self._versions_of(name)
        number = existing[-1].version + 1 if existing else 1
        baseline = Snapshot(name, number, "", 0, 0.0, "", self.client).baseline
        if machine_id is not None:
            from swarmyard.machines.supervised import SupervisedBackend

            if not isinstance(self._backend, SupervisedBackend):
                raise InvalidInputError(f"the {self._backend.name} backend cannot snapshot a machine", field="from")
            if machine_id not in {info.id for info in self._backend.list()}:
                # another process's machine, by id or name (see swarmyard.machines.live): named by its id
                machine_id = live.find(self._backend.root, machine_id)[1].id
            made = self._backend.baseline_from_machine(machine_id, baseline)
            source = f"machine {machine_id}"
            for rel in IDENTITY_FILES:  # a machine's own login (its token) is no part of what others start from
                (made.path / rel).unlink(missing_ok=True)
        else:
            assert folder is not None
            made = self._backend.prepare_baseline(baseline, Path(folder))
            source = f"folder {Path(folder).resolve()}"
        digest, size = tree_digest(made.path, IDENTITY_FILES)
        snapshot = Snapshot(name, number, digest, size, time.time(), source, self.client)
        (self._meta / name).mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_atomic(self._meta / name / f"v{number}.json", json.dumps(asdict(snapshot)))
        if self.client is None:
            self._point(name, baseline)  # a swarm file's ``workers.baseline = "NAME"`` names the operator's
        return snapshot

    def _point(self, name: str, baseline: str) -> None:
        """Make the baseline ``name`` the newest version (a symlink swapped in one rename)."""
        link = self._baselines / name
        if link.exists() and not link.is_symlink():
            raise ConflictError(f"a baseline named {name!r} that is no snapshot already exists")
        staged = self._baselines / f".{name}.link"
        staged.unlink(missing_ok=True)
        staged.symlink_to(baseline)
        os.replace(staged, link)

    def delete(self, ref: str) -> builtins.list[Snapshot]:
        """Delete one version (``NAME:VERSION``) or all of them (``NAME``); a version a live machine runs on (of any
        process of this root) is refused, and nothing is deleted."""
        name, version = self._parse(ref)
        doomed = [s for s in self._versions_of(name) if version is None or s.version == version]
        if not doomed:
            raise NotFoundError("snapshot", ref)
        # this process's machines, and those of every other process on this root (a Boxd script, a run)
        in_use = {info.baseline for info in self._backend.list()}
        in_use |= {machine.baseline for machine in live.machines(self._baselines.parent)}
        busy = [s for s in doomed if s.baseline in in_use]
        if busy:
            raise ConflictError(f"snapshot {busy[0].name}:{busy[0].version} is the disk of a live machine")
        for snapshot in doomed:
            shutil.rmtree(self._baselines / snapshot.baseline, ignore_errors=True)
            (self._meta / name / f"v{snapshot.version}.json").unlink(missing_ok=True)
        left = self._versions_of(name)
        if left:
            if self.client is None:
                self._point(name, left[-1].baseline)
            return doomed
        if self.client is None:
            (self._baselines / name).unlink(missing_ok=True)
        shutil.rmtree(self._meta / name, ignore_errors=True)
        return doomed


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    os.replace(staged, path)
