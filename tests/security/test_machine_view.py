"""What a machine can see: the read-only view made for it, never the invoker's folder, home, PYTHONPATH or secrets.

A run is started the way a user starts one, through the real console script and through ``python -m
swarmyard.cli``, from a folder that holds canary ``.env``, ``token.secret`` and ``log.key`` files (and an earlier
run's folder), with ``$HOME`` and ``$PYTHONPATH`` pointing at throwaway folders full of canaries (the PYTHONPATH folder and the
user site under that home are both named ``site-packages``, and both are on the run's ``sys.path``). The worker's
model (a scripted provider read from a replies file) has its agent run one shell command in its machine: it
writes the machine's mount table and the name of every readable file holding a canary to the agent's own stderr,
which the runner keeps in the run's agent log. Then: no canary anywhere (but the control one, planted in the
package folder every machine sees, which shows the scan finds what it can read), no mount of those folders, and the run's
own secrets outside the run folder, private.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Machines
from swarmyard.machines.identity import private_userns
from swarmyard.machines.local import PACKAGE_DIR, LocalBackend

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CONSOLE_SCRIPT = Path(sys.executable).with_name("swarmyard")
WORKER, LEAD = "scripted-worker", "scripted-lead"


def _canary(kind: str) -> tuple[str, str]:
    """A canary string and how the scan command spells it: in two pieces, so the command never holds it whole
    (the agent's own files would otherwise match the command it was given)."""
    head, tail = f"SYCANARY{kind.upper()}", secrets.token_hex(8)
    return head + tail, f'"{head}""{tail}"'


def _scan_command(spelled: list[str]) -> str:
    """A shell command for the worker: the mount table and every readable file that holds a canary, written to
    the agent's stderr (its parent's descriptor 2), between markers. /proc, /sys and /dev are the machine's own;
    /usr is the host's system tree, where no test can have put a canary."""
    patterns = " ".join(f"-e {s}" for s in spelled)
    return (
        "out=/proc/$PPID/fd/2; "
        "{ echo SCAN-BEGIN; echo MOUNTS; cat /proc/self/mountinfo; echo HITS; "
        f"grep -lsF {patterns} /proc/self/mountinfo; "
        "for d in /* /.[!.]*; do case $d in /proc|/sys|/dev|/usr) ;; "
        f'*) grep -rlsF {patterns} "$d" ;; esac; done; '
        "echo UID $(id -u); echo SCAN-END; } > $out 2>/dev/null; echo scanned"
    )


def _replies(command: str) -> dict[str, list[dict[str, object]]]:
    run: dict[str, object] = {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}
    submit: dict[str, object] = {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "scan", "body": "scanned"}}]}
    synthesis: dict[str, object] = {
        "tool_calls": [{"name": "submit_finding", "arguments": {"title": "synthesis", "body": "done"}}]
    }
    return {WORKER: [run, submit], LEAD: [synthesis]}


def swarm_text(replies: Path) -> str:
    """One worker and the lead on the scripted provider; the runs folder is the default (``runs/`` here)."""
    return f"""
[goal]
objective = "Look around."
budget_usd = "1"
call_cap = 20
deadline_s = 300
[[tasks.lenses]]
title = "look"
prompt = "Look."
[policy]
kind = "team"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 240
max_steps = 4
model = "{WORKER}"
[lead]
model = "{LEAD}"
[providers.script]
kind = "scripted"
models = ["{WORKER}", "{LEAD}"]
replies = "{replies}"
"""


@pytest.fixture
def world() -> Iterator[dict[str, object]]:
    """A working folder, a home and a PYTHONPATH folder, each with canaries; the canary strings and spellings.

    Under a short temp path: the plane's Unix socket lives in the run folder (at most 107 bytes)."""
    base = Path(os.path.realpath(tempfile.mkdtemp(prefix="sy-")))
    # The PYTHONPATH folder and the user site are both named site-packages, as a bind of "every site-packages
    # folder on sys.path" would have taken them.
    work, home, extra = base / "w", base / "home", base / "pylib" / "site-packages"
    found: dict[str, str] = {}
    spelled: list[str] = []

    def plant(path: Path, kind: str, mode: int = 0o600) -> None:
        value, spelling = _canary(kind)
        found[str(path)] = value
        spelled.append(spelling)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
        path.chmod(mode)

    plant(work / ".env", "env", 0o644)
    plant(work / "token.secret", "token")
    plant(work / "log.key", "logkey")
    plant(work / "runs" / "run_earlier" / "token.secret", "oldrun")
    plant(work / ".git" / "config", "git", 0o644)
    plant(home / ".ssh" / "id_ed25519", "ssh")
    plant(home / ".npmrc", "npmrc", 0o644)
    plant(extra / "settings.py", "pythonpath", 0o644)
    plant(extra / "secret.txt", "pythonpathsite", 0o644)
    user_site = home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    plant(user_site / "usersite.txt", "usersite", 0o644)
    # The control: a canary where every machine looks (the package folder), which the scan must find.
    control = Path(PACKAGE_DIR) / f".canary-control-{secrets.token_hex(6)}"
    plant(control, "control", 0o644)
    replies = base / "replies.json"
    replies.write_text(json.dumps(_replies(_scan_command(spelled))))
    (work / "swarm.toml").write_text(swarm_text(replies))
    (home / "swarm.toml").write_text(swarm_text(replies))
    try:
        yield {"work": work, "home": home, "extra": extra, "canaries": found, "control": control}
    finally:
        control.unlink()
        shutil.rmtree(base, ignore_errors=True)


def _env(home: Path, extra: Path) -> dict[str, str]:
    # Only what a user's shell would hand over; no SWARMYARD_STATE_DIR: the secrets go under this $HOME.
    return {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(extra), "LANG": "C.UTF-8"}


def _scan_of(run_dir: Path) -> tuple[list[str], list[str], str]:
    """The worker's report from its agent log: mount table lines, files with a canary, its uid."""
    logs = [p for p in (run_dir / "agents").glob("*.log") if "SCAN-BEGIN" in p.read_text(errors="replace")]
    assert logs, f"no agent log holds the scan: {sorted(p.name for p in (run_dir / 'agents').glob('*'))}"
    text = logs[0].read_text(errors="replace")
    body = text.split("SCAN-BEGIN\n", 1)[1].split("SCAN-END", 1)[0]
    mounts, rest = body.split("MOUNTS\n", 1)[1].split("HITS\n", 1)
    hits, uid = rest.rsplit("UID ", 1)
    return mounts.splitlines(), [h for h in hits.splitlines() if h.strip()], uid.strip()


@pytest.mark.parametrize(("entry", "start"), [("console-script", "work"), ("python-m", "work"),
                                              ("python-m", "home")])
def test_a_run_machine_sees_no_folder_home_pythonpath_or_secret(world: dict[str, object], entry: str,
                                                                 start: str) -> None:
    work, home, extra = Path(str(world["work"])), Path(str(world["home"])), Path(str(world["extra"]))
    argv = [str(CONSOLE_SCRIPT)] if entry == "console-script" else [sys.executable, "-m", "swarmyard.cli"]
    folder = work if start == "work" else home  # python -m puts the folder it starts in first on sys.path
    done = subprocess.run([*argv, "run", "swarm.toml", "--quiet"], cwd=folder, env=_env(home, extra),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p for p in (folder / "runs").iterdir() if p.name != "run_earlier"]

    mounts, hits, uid = _scan_of(run_dir)
    assert hits == [str(world["control"])], f"canaries readable inside the machine: {hits}"
    assert uid == "1000"
    # No mount of the working folder, the home or the PYTHONPATH folder: the one mount from any of them is the
    # plane's socket in the run folder, bound by itself.
    for line in mounts:
        root = line.split()[3]
        for place in (work, home, extra):
            if root == str(place) or root.startswith(f"{place}/"):
                assert root == str(run_dir / "plane.sock"), line

    # The run's own secrets: outside the run folder, in a private folder under the user's state dir.
    assert not list(run_dir.rglob("token.secret")) and not list(run_dir.rglob("log.key"))
    vault = home / ".local" / "state" / "swarmyard" / "runs" / run_dir.name
    for folder in (vault.parent.parent, vault.parent, vault):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for name in ("token.secret", "log.key"):
        assert stat.S_IMODE((vault / name).stat().st_mode) == 0o600, name
    # ... and the run folder, its store and the store's WAL are the run's own.
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for name in ("store.db", "store.db-wal"):
        if (run_dir / name).exists():
            assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    assert (run_dir / "store.db").exists()

    # What reads the run still works from the public key the run folder keeps.
    vkey = (run_dir / "audit" / "log.vkey").read_text().strip()
    verify = subprocess.run([*argv, "audit", "verify", str(run_dir), "--log-key", vkey], cwd=work,
                            env=_env(home, extra), capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "OK" in verify.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the unmapped uid needs root (a second uid_map entry)")
def test_a_private_file_that_a_bind_exposes_is_unreadable_inside(tmp_path: Path) -> None:
    """A bind that slips through: a 0600 file of the invoker's inside a folder every machine sees (the swarmyard
    package folder). The machine sees that the file exists but cannot read it; a 0644 one beside it reads."""
    assert private_userns() is not None
    tag = secrets.token_hex(6)
    private, public = Path(PACKAGE_DIR) / f".canary-{tag}-private", Path(PACKAGE_DIR) / f".canary-{tag}-public"
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"private\n")
    os.close(fd)
    public.write_text("public\n")
    machines = Machines(LocalBackend(tmp_path / "m"))
    try:
        info = machines.create("peek")
        ready = machines.wait_until_ready(info.id)
        assert "unmapped-uid" in ready.enforced
        listed = machines.exec(info.id, ["ls", "-ln", str(private)], timeout=30)
        assert listed.ok, listed.stderr
        assert listed.stdout.split()[2] == b"0"  # the invoker (root) as the machine sees it: not its own uid
        read = machines.exec(info.id, ["cat", str(private)], timeout=30)
        assert read.exit_code != 0 and b"Permission denied" in read.stderr
        assert machines.exec(info.id, ["cat", str(public)], timeout=30).stdout == b"public\n"
    finally:
        machines.close()
        private.unlink()
        public.unlink()


def test_a_store_and_its_wal_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """store.db is created 0600 before SQLite opens it, and SQLite gives its -wal and -shm the database's mode:
    with a umask that would leave them world-readable, all three are 0600 while the store is open."""
    from swarmyard.store import open_store

    before = os.umask(0o000)
    try:
        store = open_store(f"sqlite:///{tmp_path / 'store.db'}", serving=True)
    finally:
        os.umask(before)
    try:
        store.record_event("test.private", {"n": 1})
        for name in ("store.db", "store.db-wal", "store.db-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    finally:
        store.close()
