"""A run's own witness: ``swarmyard witness serve --home HOME`` started as a child process of ``swarmyard run``.

    with WitnessProcess.start(run_id="run_...") as witness:
        witness.client()          # an HttpWitnessClient of its socket: what the run's audit log is cosigned by
        witness.user, witness.own_user

Its home is the host's (``swarmyard.audit.witness_home.default_home``), shared by every run, so it remembers what
it cosigned of every run's log; ``swarmyard audit verify RUN`` reads that home. Its socket and its stderr live in
``$TMPDIR/swarmyard-witness-UID/`` (0700), never in the run folder. The child gets a minimal environment (never
this process's: provider keys live there) and a stdin pipe this process holds, so it stops with its run even
after a SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from swarmyard import service_child
from swarmyard.audit.witness import HttpWitnessClient
from swarmyard.audit.witness_home import default_home
from swarmyard.errors import AuditError

#: How long the child may take to print its ready line (it may create its user first).
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
_CHILD_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")


def socket_folder() -> Path:
    """``$TMPDIR/swarmyard-witness-UID``, made 0700 if absent; refused if another user owns it or may write it."""
    path = Path(tempfile.gettempdir()) / f"swarmyard-witness-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    # under a world-writable temp folder: someone else may have made it first, as a trap
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise AuditError(f"{path} must be a folder of this user's that no one else can open (mode 0700)")
    return path


def _stop(proc: subprocess.Popen[bytes]) -> None:
    service_child.stop(proc, STOP_TIMEOUT_S)


def _ready(proc: subprocess.Popen[bytes], log: Path) -> dict[str, object]:
    line = service_child.ready_line(proc, READY_TIMEOUT_S)
    try:
        data = json.loads(line) if line else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("vkey"), str):
        _stop(proc)
        raise AuditError(f"the run's witness did not start: {service_child.why_not_started(proc, log)} "
                         f"(see {log})")
    return data


@dataclass(slots=True)
class WitnessProcess:
    """A running ``swarmyard witness serve --home`` child of a run."""

    proc: subprocess.Popen[bytes]
    socket: Path
    home: Path
    log: Path
    vkey: str
    #: the user it runs as, and whether that is a user of its own (started as root) or this process's
    user: str
    own_user: bool

    @classmethod
    def start(cls, *, run_id: str, home: Path | None = None) -> WitnessProcess:
        """Start the witness of ``home`` (the host's by default) on a socket of run ``run_id``'s and wait until
        it accepts; ``AuditError`` says why it did not."""
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise AuditError(f"not a run id: {run_id!r}")
        home = (home or default_home()).absolute()
        folder = socket_folder()
        socket_path, log = folder / f"{run_id}.sock", folder / f"{run_id}.log"
        argv = [sys.executable, "-m", "swarmyard.cli", "witness", "serve", "--home", str(home),
                "--socket", str(socket_path), "--exit-with-stdin"]
        env = {key: os.environ[key] for key in _CHILD_ENV_KEYS if key in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        handle: IO[bytes] = os.fdopen(fd, "ab")
        with handle:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, env=env,
                                    close_fds=True, start_new_session=True)
        ready = _ready(proc, log)
        return cls(proc, socket_path, home, log, str(ready["vkey"]), str(ready.get("user", "")),
                   bool(ready.get("own_user")))

    def client(self) -> HttpWitnessClient:
        """A client of this witness's socket."""
        return HttpWitnessClient(socket=self.socket)

    def describe(self) -> str:
        """One line: whose witness, where its home is."""
        whose = "its own user" if self.own_user else "this run's user: only file modes protect its key"
        return f"witness {self.vkey} as {self.user} ({whose}), home {self.home}"

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) and remove its socket."""
        _stop(self.proc)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
