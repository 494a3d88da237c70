"""``swarmyard serve``'s token secret: whoever reads it forges an operator token.

Through the console script: a secret file that a group or other users can read, one that belongs to another
user, a symbolic link, are each refused with exit 1 and one line that says how to fix it, before the store is
touched; with no ``--secret-file`` the secret is created 0600 (``O_EXCL``) in a 0700 folder under the user's
state folder, never in the working folder.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from serving import SWARMYARD


def _env(home: Path) -> dict[str, str]:
    # No SWARMYARD_STATE_DIR or XDG_STATE_HOME: the default goes under this $HOME.
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}


def _serve(folder: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SWARMYARD), "serve", "--store", f"sqlite:///{folder / 'store.db'}", "--socket",
         str(folder / "plane.sock"), "--operator-token-file", str(folder / "operator-token"), *extra],
        cwd=folder, env=_env(folder / "home"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _planted(folder: Path, mode: int) -> Path:
    path = folder / "token-secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secrets.token_bytes(32))
    os.close(fd)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_secret_others_can_read_or_write_is_refused_exit_1(tmp_path: Path, mode: int) -> None:
    secret = _planted(tmp_path, mode)
    proc = _serve(tmp_path, "--secret-file", str(secret))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "insecure" in err.lower() or "refusing" in err, err
    assert f"chmod 600 {secret}" in err and f"{mode:o}" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "operator-token").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_secret_of_another_user_is_refused_exit_1(tmp_path: Path) -> None:
    secret = _planted(tmp_path, 0o600)
    os.chown(secret, 4242, 4242)
    proc = _serve(tmp_path, "--secret-file", str(secret))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "uid 4242" in err and "chmod 600" in err, err
    assert not (tmp_path / "store.db").exists()


def test_a_secret_that_is_a_symlink_is_refused_exit_1(tmp_path: Path) -> None:
    target = _planted(tmp_path, 0o600)
    link = tmp_path / "link-secret"
    link.symlink_to(target)
    proc = _serve(tmp_path, "--secret-file", str(link))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "symbolic link" in err, err


def test_the_default_secret_is_created_private_in_the_state_folder(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    proc = _serve(tmp_path)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # written once the secret and the operator token exist
        assert "control plane on" in line, line + proc.stderr.read()
    finally:
        # Stopped as soon as the secret exists (how serve exits on SIGTERM once serving is tested elsewhere):
        # it may not be serving yet.
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    state = tmp_path / "home" / ".local" / "state" / "swarmyard"
    for folder in (state, state / "serve"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    secret = state / "serve" / "token.secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_bytes()) == 32
    assert not (tmp_path / "token-secret").exists() and not (tmp_path / "token.secret").exists()
    # A second start reads the same secret: the operator token it wrote still verifies (same file, same bytes).
    before = secret.read_bytes()
    again = _serve(tmp_path)
    try:
        assert again.stderr is not None
        assert "control plane on" in again.stderr.readline()
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)
    assert secret.read_bytes() == before
