"""Running the scoring code: a bubblewrap child with rlimits, a wall-clock timeout and an allow-listed env.

The child sees read-only system folders, a private tmpfs ``/tmp``, and exactly three things from the bundle
side, all read-only: the entry point, the artifact (``/eval/artifact``) and the chosen split's data
(``/eval/data``). It has no network (``--unshare-all``), its own session and PID namespace, and dies with its
parent. CPU time, address space and processes are rlimits set by ``prlimit`` before ``bwrap`` starts (no
``preexec_fn``: the server forks from worker threads, where that is unsafe); the process limit is counted per
user, and root is exempt from it, so it holds when the evaluator runs as its own user, as ``evaluator serve``
does. On the wall-clock timeout the whole process group is killed.

The scoring code's stdout must be exactly one line holding one integer in [0, max_score]. Its stderr is logged
here and never returned to callers: it may quote the hidden data, and errors travel back to workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from swarmyard.errors import SandboxError, SandboxUnavailableError, ScoringError, ScoringLimitError
from swarmyard.evaluator.bundle import Bundle, Split

log = logging.getLogger(__name__)

_INTEGER = re.compile(rb"\A(0|[1-9][0-9]{0,18})\n?\Z")
_STDERR_KEEP = 4096
#: The only variables the scoring code gets; nothing from the evaluator's own environment leaks in.
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp",
              "PYTHONDONTWRITEBYTECODE": "1"}
_SYSTEM_DIRS = ("/usr",)
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")


class ScoringSandbox(Protocol):
    """Runs a bundle's scoring code on one artifact and returns the integer it printed."""

    def run(self, bundle: Bundle, split: Split, artifact: Path) -> int:
        """Score ``artifact`` against ``split``; raise ``ScoringError`` or ``SandboxError`` on failure."""
        ...


def _require(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise SandboxUnavailableError(f"{tool} is not installed: apt-get install -y {package}")
    return found


class BwrapSandbox:
    """The scoring sandbox built on bubblewrap."""

    def __init__(self) -> None:
        self._bwrap = _require("bwrap", "bubblewrap")
        self._prlimit = _require("prlimit", "util-linux")

    def argv(self, bundle: Bundle, split: Split, artifact: Path) -> list[str]:
        """The full command line: ``prlimit ... bwrap ... interpreter entry artifact data``."""
        limits = bundle.limits
        entry_inside = f"/eval/{bundle.manifest.scoring.entry}"
        # soft CPU limit sends SIGXCPU (reported as cpu_time); the hard one a second later is SIGKILL
        cmd = [self._prlimit, f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
               f"--as={limits.memory_mib << 20}", f"--nproc={_process_limit(limits.max_processes)}", "--core=0",
               "--",
               self._bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        for folder in _SYSTEM_DIRS:
            cmd += ["--ro-bind", folder, folder]
        for link in _SYSTEM_LINKS:
            if os.path.islink(link):
                cmd += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                cmd += ["--ro-bind", link, link]
        for extra in _SYSTEM_FILES:
            cmd += ["--ro-bind-try", extra, extra]
        # No /proc: through /proc/PID/fd any process inside (same user, same PID namespace) could open the
        # scorer's stdout, or bwrap's own copy of it as PID 1, and write digits into the score.
        cmd += ["--dev", "/dev", "--size", str(limits.tmpfs_mib << 20), "--tmpfs", "/tmp",
                "--ro-bind", str(bundle.entry_path), entry_inside,
                "--ro-bind", str(artifact), "/eval/artifact",
                "--ro-bind", str(bundle.split_dir(split)), "/eval/data",
                "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        env = {**_CHILD_ENV, "SWARMYARD_SPLIT": split.value, "SWARMYARD_ARTIFACT": "/eval/artifact",
               "SWARMYARD_DATA": "/eval/data"}
        for name, value in env.items():
            cmd += ["--setenv", name, value]
        cmd += ["--", bundle.manifest.scoring.interpreter, entry_inside, "/eval/artifact", "/eval/data"]
        return cmd

    def run(self, bundle: Bundle, split: Split, artifact: Path) -> int:
        """Score ``artifact`` against ``split`` inside the sandbox."""
        limits = bundle.limits
        started = time.monotonic()
        proc = subprocess.Popen(self.argv(bundle, split, artifact), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(_CHILD_ENV),
                                start_new_session=True, close_fds=True)
        try:
            stdout, stderr, why = _collect(proc, started + limits.timeout_s, limits.max_output_bytes)
        finally:
            _kill_group(proc)
        elapsed = time.monotonic() - started
        log.info("scoring %s/%s exited %s after %.2fs", bundle.name, split.value, proc.returncode, elapsed)
        if stderr:
            tail = stderr[-_STDERR_KEEP:].decode("utf-8", "replace")
            log.warning("scoring stderr (kept private): %s", tail)
        if why == "wall_time":
            raise ScoringLimitError("wall_time", limits.timeout_s)
        if why == "output":
            raise ScoringLimitError("output", limits.max_output_bytes)
        return _parse(proc.returncode, stdout, stderr, bundle)


def _process_limit(extra: int) -> int:
    """RLIMIT_NPROC for one scoring run: ``extra`` tasks more than this user runs now.

    The kernel counts every task (thread) of the real uid against the limit, not only the sandbox's: the
    evaluator's own threads and, when it shares its user with the run, all the run's processes count too, so a
    flat limit would fail scoring for a user that already runs that many.
    """
    uid = os.getuid()
    if uid == 0:
        return extra  # exempt from the limit anyway
    tasks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_bytes()  # bytes: no codec to import after the privilege drop
        except OSError:
            continue  # gone while we looked
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if fields.get(b"Uid", b"").split()[:1] == [str(uid).encode()]:
            threads = fields.get(b"Threads", b"1").strip()
            tasks += int(threads) if threads.isdigit() else 1
    return tasks + extra


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout (at most ``cap`` bytes) and the tail of stderr until both close and the child exits."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "wall_time"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk
                if buffer is out and len(out) > cap:
                    return bytes(out), bytes(err), "output"
                if buffer is err and len(err) > 2 * _STDERR_KEEP:
                    del err[:-_STDERR_KEEP]
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), "wall_time"
    return bytes(out), bytes(err), None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child's whole process group (bwrap and, through --die-with-parent, everything inside)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it may exit between the poll and the kill
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _parse(returncode: int, stdout: bytes, stderr: bytes, bundle: Bundle) -> int:
    limits = bundle.limits
    if returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGXCPU, -signal.SIGKILL):
        raise ScoringLimitError("cpu_time", limits.cpu_s)
    if returncode != 0:
        if stderr.startswith(b"bwrap:"):
            raise SandboxError(f"bubblewrap could not start the scoring sandbox (exit {returncode})")
        if b"MemoryError" in stderr or b"Cannot allocate memory" in stderr:
            raise ScoringLimitError("memory", limits.memory_mib)
        raise ScoringError(f"the scoring code exited with status {returncode}", reason="exit_status")
    # Exactly one line holding one integer: anything else (a second line, a prefix another process wrote into
    # the pipe) is refused, and the output itself is never quoted back, as it could carry what the data holds.
    if not _INTEGER.match(stdout):
        raise ScoringError("the scoring code did not print exactly one integer line", reason="bad_output")
    score = int(stdout)
    if not 0 <= score <= bundle.manifest.scoring.max_score:
        raise ScoringError(f"the scoring code printed a score outside [0, {bundle.manifest.scoring.max_score}]",
                           reason="out_of_range")
    return score
