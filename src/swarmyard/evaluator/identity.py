"""The evaluator's own Unix user: created when missing, given the bundle and state, and switched to for good.

Run as root, ``serve`` makes the system user ``swarmyard-eval`` (no shell, no home), hands it the bundle and
the state folder (owner only: folders 0700, files 0600) and drops to it (setgroups, setgid, setuid),
so neither the control plane's user nor a worker can read the hidden data or the signing key.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import EvaluatorError

log = logging.getLogger(__name__)

EVAL_USER = "swarmyard-eval"
_USERADD_EXISTS = 9  # useradd's exit status when the name is taken (another serve won the race)


@dataclass(frozen=True, slots=True)
class Identity:
    """A Unix user and its primary group."""

    name: str
    uid: int
    gid: int


def current_identity() -> Identity:
    """The user this process runs as."""
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Identity(name=name, uid=uid, gid=os.getgid())


def ensure_system_user(name: str = EVAL_USER) -> Identity:
    """Return the system user ``name``, creating it (no shell, no home) if it does not exist yet."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                "--shell", "/usr/sbin/nologin", name]
        done = subprocess.run(argv, capture_output=True, text=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, check=False)
        if done.returncode not in (0, _USERADD_EXISTS):
            raise EvaluatorError(f"could not create the system user {name!r}: {done.stderr.strip()}",
                                 user=name) from None
        entry = pwd.getpwnam(name)
        log.warning("created system user %s (uid %d)", name, entry.pw_uid)
    return Identity(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def protect_tree(root: Path, owner: Identity | None) -> None:
    """Make ``root`` and all in it owner-only (folders 0700, files 0600), owned by ``owner`` if given."""
    paths = [root, *root.rglob("*")]
    for path in paths:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue  # never follow a link out of the tree (bundles refuse them; this is the second guard)
        if owner is not None:
            os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
        os.chmod(path, 0o700 if stat.S_ISDIR(info.st_mode) else 0o600)


def drop_privileges(to: Identity) -> None:
    """Switch this process to ``to`` for good (supplementary groups cleared); check that root is gone."""
    os.setgroups([])
    os.setgid(to.gid)
    os.setuid(to.uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:  # pragma: no cover - would mean setuid did not stick
        raise EvaluatorError("privileges could not be dropped")
    log.info("running as %s (uid %d, gid %d)", to.name, to.uid, to.gid)

