"""The system users swarmyard's services run as when started as root, and the switch to one of them.

Started as root, each of the three services runs as a system user of its own, made on first use (no shell, no
home), so that none can read what another holds: the control plane (``swarmyard serve``) as ``swarmyard-plane``,
the evaluator as ``swarmyard-eval`` (its protected bundle and signing key), the witness as ``swarmyard-witness``
(its key and the checkpoints it cosigned). Each keeps its state in a folder it owns (0700, files 0600): what the
service needs from its starting user's rights (binding a socket, reading a secret, copying a bundle) is done
first, then ``drop_privileges`` switches to the service's user for good.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import SwarmyardError, UserError

log = logging.getLogger(__name__)

PLANE_USER = "swarmyard-plane"
EVAL_USER = "swarmyard-eval"
WITNESS_USER = "swarmyard-witness"
_USERADD_EXISTS = 9  # useradd's exit status when the name is taken (another service won the race)


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


def ensure_system_user(name: str, *, error: type[SwarmyardError] = UserError) -> Identity:
    """Return the system user ``name``, creating it (no shell, no home) if it does not exist yet; a failure is
    raised as ``error`` (the service's own error type) naming the user."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                "--shell", "/usr/sbin/nologin", name]
        done = subprocess.run(argv, capture_output=True, text=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, check=False)
        if done.returncode not in (0, _USERADD_EXISTS):
            raise error(f"could not create the system user {name!r}: {done.stderr.strip()}", user=name) from None
        entry = pwd.getpwnam(name)
        log.warning("created system user %s (uid %d)", name, entry.pw_uid)
    if entry.pw_uid == 0:
        raise error(f"the system user {name!r} is root: a service's own user must not be", user=name)
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


def drop_privileges(to: Identity, *, groups: Sequence[int] = (), error: type[SwarmyardError] = UserError) -> None:
    """Switch this process to ``to`` for good, with only ``groups`` as supplementary groups; check that root is
    gone."""
    os.setgroups(list(groups))
    os.setgid(to.gid)
    os.setuid(to.uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:  # pragma: no cover - would mean setuid did not stick
        raise error("privileges could not be dropped", user=to.name)
    log.info("running as %s (uid %d, gid %d)", to.name, to.uid, to.gid)
