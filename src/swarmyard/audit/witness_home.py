"""A witness's home: the folder that holds its key and state, and publishes what ``audit verify`` reads.

::

    HOME/                   0711 (anyone may pass to public/, no one list it); started as root, owned by the
                            witness's own user (swarmyard-witness)
      private/              0700: witness.key (its Ed25519 seed, 0600, made by the witness's user), state.json
      public/               0755: witness.vkey, and checkpoints/ORIGIN.note (ORIGIN %-quoted): the last
                            checkpoint it cosigned of each log, with its cosignature line (0644)

``swarmyard run`` starts a witness on the host's home (``default_home``) for every run unless told not to, and
``swarmyard audit verify RUN`` reads the same home with no flag: the witness's key and the size and root it last
cosigned come from a folder the control plane's user cannot write (started as root, the plane and the witness
are different users), never from the run folder. So a log cut back to an earlier cosigned checkpoint, or
rewritten and re-signed with the run's own log key, fails. The public half is readable by anyone: a cosigned
checkpoint is meant to be shown; only the key is secret.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from swarmyard.audit.note import Verifier
from swarmyard.errors import AuditError, UserError
from swarmyard.identity import Identity

#: The home a witness started as root uses unless ``SWARMYARD_WITNESS_DIR`` names another.
SYSTEM_HOME = Path("/var/lib/swarmyard/witness")
PRIVATE, PUBLIC = "private", "public"
KEY_FILE, STATE_FILE, VKEY_FILE, CHECKPOINTS = "witness.key", "state.json", "witness.vkey", "checkpoints"
_ENTRIES = frozenset({PRIVATE, PUBLIC})


def default_home() -> Path:
    """The host's witness home: ``$SWARMYARD_WITNESS_DIR``; else ``/var/lib/swarmyard/witness`` for root, and
    ``witness/`` in the user's swarmyard state folder for anyone else."""
    given = os.environ.get("SWARMYARD_WITNESS_DIR")
    if given:
        return Path(given)
    if os.geteuid() == 0:
        return SYSTEM_HOME
    from swarmyard.swarm.run_secrets import private_state_dir

    # made private first: the run's secrets go in the same folder, which must never be made open to others
    return private_state_dir() / "witness"


def homes_to_read() -> list[Path]:
    """Where ``audit verify`` looks, in order: the one ``$SWARMYARD_WITNESS_DIR`` names, else the system's home
    (a run made as root) and then this user's."""
    if os.environ.get("SWARMYARD_WITNESS_DIR"):
        return [default_home()]
    from swarmyard.swarm.run_secrets import state_dir

    return [SYSTEM_HOME, state_dir() / "witness"]


def _file_name(origin: str) -> str:
    return quote(origin, safe="") + ".note"


def _write_public(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by all (it is public), durable before the rename."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)  # a umask of 077 (the witness's) would have made it owner-only
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class WitnessHome:
    """The folders of one witness home (see the module docstring)."""

    root: Path

    @property
    def key_path(self) -> Path:
        """The witness's Ed25519 seed."""
        return self.root / PRIVATE / KEY_FILE

    @property
    def state_path(self) -> Path:
        """What the witness remembers of every log."""
        return self.root / PRIVATE / STATE_FILE

    @property
    def public(self) -> Path:
        """What anyone may read: the witness's verifier key and its latest cosigned checkpoints."""
        return self.root / PUBLIC

    def prepare(self, owner: Identity | None) -> None:
        """Make the folders with the starting user's rights; given ``owner`` (started as root), hand them all to
        it. A folder holding anything else is refused: this changes the owner of everything in it."""
        if self.root.exists():
            if not self.root.is_dir() or self.root.is_symlink():
                raise UserError(f"{self.root} is not a folder: give a witness home folder")
            strangers = sorted(e.name for e in self.root.iterdir() if e.name not in _ENTRIES)
            if strangers:
                raise UserError(f"{self.root} holds {strangers[0]!r}, which is not a witness's: give an empty or "
                                "witness-only folder")
        self.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        folders = {self.root: 0o711, self.root / PRIVATE: 0o700,
                   self.public: 0o755, self.public / CHECKPOINTS: 0o755}
        for folder, mode in folders.items():
            folder.mkdir(mode=mode, exist_ok=True)
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode):
                raise UserError(f"{folder} is not a folder")
            os.chmod(folder, mode)
        if owner is None:
            return
        for path in [*folders, *(self.root / PRIVATE).iterdir(), *(self.public / CHECKPOINTS).iterdir(),
                     *(p for p in self.public.iterdir() if p.is_file())]:
            os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
        for path in (self.root / PRIVATE).iterdir():
            os.chmod(path, 0o600, follow_symlinks=False)

    def publish_key(self, verifier: Verifier) -> None:
        """Publish the witness's verifier key (a home keeps one key for good: a different one is refused)."""
        path = self.public / VKEY_FILE
        if path.exists():
            if path.read_text().strip() != verifier.vkey:
                raise AuditError(f"{path} names another witness key than {self.key_path.name} holds")
            return
        _write_public(path, verifier.vkey + "\n")

    def publish(self, origin: str, note: str) -> None:
        """Publish the last checkpoint cosigned for ``origin`` (after the state recorded it)."""
        _write_public(self.public / CHECKPOINTS / _file_name(origin), note)

    def published_key(self) -> Verifier | None:
        """The witness's verifier key as this home publishes it, if it has one."""
        try:
            return Verifier.parse((self.public / VKEY_FILE).read_text().strip())
        except FileNotFoundError:
            return None

    def published(self, origin: str) -> str | None:
        """The last checkpoint the witness cosigned for ``origin``, if any."""
        try:
            return (self.public / CHECKPOINTS / _file_name(origin)).read_text()
        except FileNotFoundError:
            return None

    def owner(self) -> str:
        """Who owns the home (a name, else the uid)."""
        uid = self.root.stat().st_uid
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)
