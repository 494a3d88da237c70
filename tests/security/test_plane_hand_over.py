"""Started as root, ``swarmyard serve`` hands the SQLite store and its ``blobs/`` tree to the plane's user before
dropping to it; the plane's user already owns that tree (it wrote it on an earlier start), so it may swap any folder
in it for a symlink while root walks it, or hard-link into it any file it can read and write. The hand-over must
then change nothing outside the tree: not the witness's key, whose folder a swapped symlink points to, nor a file
of root's linked in.

The swap is what a racing process of the plane's user does; here it is made deterministic by a hook on the standard
library's walkers (``os.fwalk``, ``pathlib.Path.rglob``, whichever the hand-over lists the tree with), which swaps
the folder right after the listing. The real ``swarmyard.plane.privileges.hand_over`` runs, as root, in a process of
its own; ownership is read from the files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import child_env, serve, stop

from swarmyard.identity import PLANE_USER, WITNESS_USER, ensure_system_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hand-over changes owners")

# Runs as root in its own interpreter: the hooks stay there. argv: the store's folder, the folder to swap, the
# witness home the symlink points to.
_HAND_OVER = """
import os, pathlib, sys
from swarmyard.identity import PLANE_USER, ensure_system_user
from swarmyard.plane.privileges import hand_over

plane, swapped, home = (pathlib.Path(a) for a in sys.argv[1:4])

def swap():
    if not swapped.is_symlink():
        os.rename(swapped, swapped.with_name(swapped.name + "-moved"))
        os.symlink(home, swapped)

real_fwalk, real_rglob = os.fwalk, pathlib.Path.rglob

def fwalk(*args, **kwargs):
    walk = real_fwalk(*args, **kwargs)
    yield next(walk)  # blobs/ itself, listed with its folder z still a folder
    swap()
    yield from walk

def rglob(self, pattern):
    listed = list(real_rglob(self, pattern))
    swap()
    return iter(listed)

os.fwalk, pathlib.Path.rglob = fwalk, rglob
hand_over(ensure_system_user(PLANE_USER), plane / "store.db")
print("swapped" if swapped.is_symlink() else "not swapped")
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-h-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_folder_of_blobs_swapped_for_a_symlink_during_the_hand_over_hands_over_nothing_outside(folder: Path) -> None:
    plane, witness = ensure_system_user(PLANE_USER), ensure_system_user(WITNESS_USER)
    home = folder / "witness"
    key = home / "private" / "witness.key"
    key.parent.mkdir(parents=True)
    key.write_text("seed\n")
    for path, mode in ((home, 0o711), (key.parent, 0o700), (key, 0o600)):
        os.chown(path, witness.uid, witness.gid)
        path.chmod(mode)
    # the store's folder and blobs/ are the plane's, from an earlier start; z/private/witness.key mirrors the home
    store = folder / "plane"
    (store / "blobs" / "z" / "private").mkdir(parents=True)
    (store / "blobs" / "z" / "private" / "witness.key").write_text("")
    for path in [store, *store.rglob("*")]:
        os.chown(path, plane.uid, plane.gid)
    # what root made on a start as root, which the hand-over exists for
    (store / "store.db").write_text("")
    (store / "blobs" / "ab").mkdir()
    (store / "blobs" / "ab" / "blob").write_text("x")

    done = subprocess.run([sys.executable, "-c", _HAND_OVER, str(store), str(store / "blobs" / "z"), str(home)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "swapped", done.stdout + done.stderr

    assert [p.stat().st_uid for p in (home, key.parent, key)] == [witness.uid] * 3
    # the plane's user still cannot read the key (the check can fail: it reads its own blob)
    as_plane = {"user": plane.uid, "group": plane.gid, "extra_groups": [], "capture_output": True, "text": True,
                "timeout": 30}
    assert subprocess.run(["/bin/cat", str(key)], **as_plane).returncode != 0  # type: ignore[call-overload]
    # and what root made in the store was handed over, through the same walk
    for path in (store / "store.db", store / "blobs" / "ab", store / "blobs" / "ab" / "blob"):
        assert path.stat().st_uid == plane.uid, path
    blob = subprocess.run(["/bin/cat", str(store / "blobs" / "ab" / "blob")], **as_plane)  # type: ignore[call-overload]
    assert blob.returncode == 0 and blob.stdout == "x", blob


def test_a_file_outside_the_store_hard_linked_into_it_keeps_its_owner_when_serve_starts_as_root(folder: Path) -> None:
    """The plane's user links a file of root's it may read and write (0666, outside the store) into ``blobs/``;
    the next ``swarmyard serve`` started as root leaves it root's, says so, hands over what root made in the store
    and serves as the plane's user."""
    plane = ensure_system_user(PLANE_USER)
    store = folder / "plane"
    store.mkdir()
    os.chown(store, plane.uid, plane.gid)
    url = f"sqlite:///{store / 'store.db'}"
    stop(serve(folder, store=url))  # the first start as root: the store is made, and the plane's
    assert (store / "store.db").stat().st_uid == plane.uid

    victim = folder / "victim"
    victim.write_text("outside\n")
    victim.chmod(0o666)
    as_plane = {"user": plane.uid, "group": plane.gid, "extra_groups": [], "capture_output": True, "text": True,
                "timeout": 30}
    linked = subprocess.run(["/bin/sh", "-c", f"mkdir -p {store}/blobs/ab && ln {victim} {store}/blobs/ab/hl"],
                            **as_plane)  # type: ignore[call-overload]
    assert linked.returncode == 0, linked.stderr
    assert (store / "blobs" / "ab" / "hl").stat().st_ino == victim.stat().st_ino
    (store / "blobs" / "cd").mkdir()
    (store / "blobs" / "cd" / "blob").write_text("x")  # root's, one link: handed over as before

    proc = serve(folder, store=url, env=child_env())
    stop(proc)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert f"serving as {PLANE_USER} (uid {plane.uid})" in stderr, stderr
    assert f"{store / 'blobs' / 'ab' / 'hl'} has 2 links" in stderr, stderr
    assert (victim.stat().st_uid, victim.stat().st_gid, victim.read_text()) == (0, 0, "outside\n")
    for path in (store / "blobs" / "cd", store / "blobs" / "cd" / "blob"):
        assert path.stat().st_uid == plane.uid, path
