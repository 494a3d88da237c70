"""The machine init in C: compiled once from ``swarmyard/guest/init.c`` with the system C compiler, cached by source hash.

A Python init costs ~40 ms of start-up inside every sandbox (the interpreter plus its imports), four times what
bwrap itself costs; the C init speaks the same protocol and starts in about a millisecond. Compiling takes well
under a second and happens once per host and source version. Without a working compiler the ``local`` backend
falls back to the Python init (slower, same isolation) and says so in the log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from swarmyard import guest
from swarmyard.errors import SandboxError

_log = logging.getLogger(__name__)
#: The C source shipped in the package.
SOURCE = Path(guest.__file__).with_name("init.c")
_COMPILE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
_FLAGS = ("-O2", "-pthread", "-Wall")
#: Linked statically where the C library allows it: no dynamic loader run at each of the two execs a machine's
#: boot makes (the launcher, then the init in the sandbox), about 0.25 ms each.
_STATIC = ("-static",)
_BUILT: dict[Path, Path | None] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where compiled inits are kept: a private folder of this user's under the temp dir."""
    return Path(tempfile.gettempdir()) / f"swarmyard-init-{os.getuid()}"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    # Another user's folder (or one others may write to) could hand us their binary to run as the init.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SandboxError(f"{path} is not a private folder of this user's; refusing to run an init from it")
    return path


def compiler() -> str | None:
    """The system C compiler, if there is one."""
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name, path=_COMPILE_ENV["PATH"])
        if found:
            return found
    return None


def build(cache: Path | None = None) -> Path:
    """Compile the init (or find it already compiled) and return its path; raises :class:`SandboxError`."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(_FLAGS + _STATIC).encode()).hexdigest()[:20]
    folder = _private_dir(cache or cache_dir())
    target = folder / f"init-{digest}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    cc = compiler()
    if cc is None:
        raise SandboxError("no C compiler (cc, gcc or clang) found; install gcc for the fast machine init")
    staging = folder / f".init-{digest}.{os.getpid()}.{threading.get_ident()}"
    # Static first; a host without a static C library (libc.a) gets the dynamically linked init.
    for extra in (_STATIC, ()):
        try:
            done = subprocess.run(
                [cc, *_FLAGS, *extra, "-o", str(staging), str(SOURCE)],
                env=_COMPILE_ENV,
                capture_output=True,
                check=False,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"cannot compile the machine init with {cc}: {exc}") from exc
        if done.returncode == 0:
            break
    if done.returncode != 0:
        staging.unlink(missing_ok=True)
        raise SandboxError(
            f"cannot compile the machine init with {cc}: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    # Rename is atomic: a concurrent process sees either no binary or a whole one.
    os.replace(staging, target)
    return target


def native_init(cache: Path | None = None) -> Path | None:
    """The compiled init, built on first use; ``None`` (logged once) when it cannot be built here."""
    key = cache or cache_dir()
    with _LOCK:
        if key not in _BUILT:
            try:
                _BUILT[key] = build(cache)
            except SandboxError as exc:
                _log.warning("machines fall back to the Python init (slower start-up): %s", exc)
                _BUILT[key] = None
        return _BUILT[key]
