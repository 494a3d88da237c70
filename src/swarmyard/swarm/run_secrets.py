"""Where a run keeps its secrets: outside the run folder, which reports, readers and machines can see.

Each run has a private folder of its own under the user's state folder::

    $SWARMYARD_STATE_DIR/runs/RUN/      (default $XDG_STATE_HOME/swarmyard, i.e. ~/.local/state/swarmyard)
        token.secret    the control plane's token secret (whoever holds it forges any capability token)
        log.key         the audit log's Ed25519 signing seed (whoever holds it re-signs a rewritten log)
    $SWARMYARD_STATE_DIR/serve/token.secret   ``swarmyard serve``'s token secret without ``--secret-file``

Every folder from ``swarmyard/`` down is 0700 and each secret is created 0600 with ``O_EXCL`` (never written and
then chmod-ed). The run folder keeps only public keys: ``audit/log.vkey`` is what ``swarmyard audit verify`` reads.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from swarmyard.errors import UserError

TOKEN_SECRET = "token.secret"
LOG_KEY = "log.key"


def state_dir() -> Path:
    """The user's swarmyard state folder: ``$SWARMYARD_STATE_DIR``, else ``$XDG_STATE_HOME/swarmyard``."""
    given = os.environ.get("SWARMYARD_STATE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "swarmyard"


def run_secrets(run_id: str) -> Path:
    """The private folder of run ``run_id``'s secrets, made (0700 at every level of swarmyard's) if absent."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise UserError(f"not a run id: {run_id!r}")
    return _private("runs", run_id)


def private_state_dir() -> Path:
    """The user's swarmyard state folder, made 0700 if absent (refused if another user owns it or may open it):
    what a run's witness home is made in when the run is not root's."""
    return _private()


def serve_secret() -> Path:
    """Where ``swarmyard serve`` and ``swarmyard broker serve`` keep their token secret unless told otherwise:
    ``serve/token.secret`` in the state folder (made 0700 if absent), never the working folder."""
    return _private("serve") / TOKEN_SECRET


def _private(*parts: str) -> Path:
    top = state_dir()
    top.parent.mkdir(parents=True, exist_ok=True)
    folder = top
    for part in ("", *parts):
        folder = folder / part if part else folder
        folder.mkdir(mode=0o700, exist_ok=True)
        _check_private(folder)
    return folder


def log_key(run_id: str, audit_dir: Path) -> Path:
    """Where run ``run_id`` signs its audit log from: its private folder, unless the run was made when the key
    lived in ``audit/`` (a resumed run keeps signing with the key its checkpoints were signed with)."""
    legacy = audit_dir / LOG_KEY
    return legacy if legacy.exists() else run_secrets(run_id) / LOG_KEY


def _check_private(folder: Path) -> None:
    info = os.lstat(folder)
    # A folder others may enter (or one of someone else's) would hand them the run's secrets, or us theirs.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UserError(f"{folder} must be a folder of this user's that no one else can open (mode 0700): "
                        f"it holds a run's secrets")
