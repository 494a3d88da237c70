"""A run's own evaluator: ``swarmyard evaluator serve`` started as a child process, bound to the run's goal.

    with EvaluatorProcess.start(bundle, run_id="run_...", goal="goal_...") as evaluator:
        evaluator.socket, evaluator.user, evaluator.own_user     # where it listens and who it runs as
        AsyncEvaluatorClient(evaluator.socket)                   # what the control plane scores through

Its folder is ``$TMPDIR/swarmyard-eval-UID/RUN/`` (beside the machines' ``swarmyard-machines-UID``)::

    eval.sock      the socket: the control plane's user and the evaluator's group only (0660); no machine
                   sees this folder, so a worker reaches the evaluator only through the plane's tools
    state/         the evaluator's own (key, holdout ledger, the bundle's copy while it runs), 0700 as its user
    serve.log      the child's stderr, which may quote hidden data: 0600, never in the run folder

The key and the holdout ledger stay after the run (a few kilobytes): a resumed run's evaluator signs with the
same key and finds the holdout spent.
Started as root, the folders are 0711 (the evaluator's user must pass through them to its state, and may list
nothing); otherwise 0700. The child gets a minimal environment, never this process's (provider keys live there).
Its stdin is a pipe this process holds: it stops when that ends, so it dies with its run even after a SIGKILL.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from swarmyard import service_child
from swarmyard.errors import EvaluatorError
from swarmyard.evaluator.server import BUNDLE_COPY

#: How long the child may take to print its ready line (it creates a user and copies the bundle first).
READY_TIMEOUT_S = 120.0
#: How long it may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0
_CHILD_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")


def evaluator_home() -> Path:
    """The folder every run's evaluator folder is made in (not made here)."""
    return Path(tempfile.gettempdir()) / f"swarmyard-eval-{os.getuid()}"


def _folder(path: Path, mode: int) -> Path:
    """Make ``path`` with ``mode`` if absent; refuse one this user does not own or others may write to."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    info = os.lstat(path)
    # it lives under a world-writable temp folder: someone else may have made it first, as a trap
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise EvaluatorError(f"{path} must be a folder of this user's that no one else can write to", path=str(path))
    os.chmod(path, mode)
    return path


def run_folder(run_id: str) -> Path:
    """The evaluator folder of run ``run_id``, made if absent."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise EvaluatorError(f"not a run id: {run_id!r}")
    mode = 0o711 if os.geteuid() == 0 else 0o700
    return _folder(_folder(evaluator_home(), mode) / run_id, mode)


def _ready_line(proc: subprocess.Popen[bytes], log: Path) -> dict[str, object]:
    line = service_child.ready_line(proc, READY_TIMEOUT_S)
    if not line:
        _stop(proc)
        raise EvaluatorError(f"the evaluator did not start: {service_child.why_not_started(proc, log)}",
                             log=str(log))
    try:
        data = json.loads(line)
    except ValueError as exc:
        _stop(proc)
        raise EvaluatorError("the evaluator's ready line is not JSON", log=str(log)) from exc
    if not isinstance(data, dict):
        _stop(proc)
        raise EvaluatorError("the evaluator's ready line is not a JSON object", log=str(log))
    return data


def _stop(proc: subprocess.Popen[bytes]) -> None:
    service_child.stop(proc, STOP_TIMEOUT_S)


@dataclass(slots=True)
class EvaluatorProcess:
    """A running ``swarmyard evaluator serve`` child, answering for one goal on its own socket."""

    proc: subprocess.Popen[bytes]
    socket: Path
    state_dir: Path
    log: Path
    #: the bundle's name, the user it runs as, whether that is a user of its own (not this process's)
    name: str
    user: str
    own_user: bool
    #: the raw Ed25519 public key that verifies its scores
    public_key: bytes

    @classmethod
    def start(cls, bundle: Path, *, run_id: str, goal: str) -> EvaluatorProcess:
        """Start the evaluator for ``goal`` on ``bundle`` (only read: serve copies it) and wait until it
        accepts; ``EvaluatorError`` says why it did not."""
        folder = run_folder(run_id)
        socket_path, state, log = folder / "eval.sock", folder / "state", folder / "serve.log"
        argv = [sys.executable, "-m", "swarmyard.cli", "evaluator", "serve", str(bundle), "--socket",
                str(socket_path), "--state", str(state), "--goal", goal, "--exit-with-stdin"]
        env = {key: os.environ[key] for key in _CHILD_ENV_KEYS if key in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            handle: IO[bytes] = os.fdopen(fd, "ab")
        except BaseException:
            os.close(fd)
            raise
        with handle:
            # stdin is a pipe nothing is written to: when this process dies, even by SIGKILL, the child reads end
            # of file and stops, so no evaluator outlives its run and blocks the run's resume
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, env=env,
                                    close_fds=True, start_new_session=True)
        ready = _ready_line(proc, log)
        try:
            key = base64.b64decode(str(ready["public_key"]), validate=True)
            if len(key) != 32:
                raise ValueError("not 32 bytes")
            return cls(proc, socket_path, state, log, str(ready["name"]), str(ready["user"]),
                       bool(ready.get("own_user")), key)
        except (KeyError, ValueError, binascii.Error) as exc:
            _stop(proc)
            raise EvaluatorError(f"the evaluator's ready line lacks a field: {exc}", log=str(log)) from exc

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def describe(self) -> str:
        """One line for the run's summary: which bundle, and as which user."""
        whose = "its own user" if self.own_user else "this run's user: only file modes protect the bundle"
        return f"{self.name}, as {self.user} ({whose})"

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``). Its key and holdout ledger stay; its
        copy of the bundle goes (the next start copies the bundle afresh)."""
        _stop(self.proc)
        shutil.rmtree(self.state_dir / BUNDLE_COPY, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
