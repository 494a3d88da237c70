"""The machine's init: runs inside the sandbox, serves execs and file transfers on the control socket (stdlib only).

Started by the backend as ``python -I -S`` with one JSON argument. It binds its control socket and (when the
machine has a control plane) the relay, applies Landlock, reports ready on a pipe, and then runs each request on
its own thread. A timed-out or abandoned exec has its whole process tree stopped and killed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from stat import S_ISREG
from typing import Any, NoReturn

from swarmyard.guest import landlock, noexec, seccomp, wire
from swarmyard.guest.relay import Relay

_CHUNK = 65536


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _marked(marker: bytes) -> set[int]:
    """Processes whose environment carries the exec's marker: descendants that setsid'd and double-forked away."""
    found: set[int] = set()
    if not marker:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if marker in handle.read().split(b"\0"):
                        found.add(int(entry))
            except OSError:
                continue
    return found


def _tree(root: int, marker: bytes = b"") -> set[int]:
    children = _children_map()
    found: set[int] = _marked(marker)
    todo = [root, *found]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(leader: int, marker: bytes = b"") -> None:
    """Stop the leader's process group, every descendant and every process carrying ``marker``, then kill them."""
    victims: set[int] = set()
    for _ in range(8):
        found = _tree(leader, marker) | {leader}
        for pid in found - victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        if found <= victims:
            break
        victims |= found
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _run_exec(conn: socket.socket, req: dict[str, Any]) -> None:
    stdin_data: bytes | None = req.get("stdin")
    started = time.monotonic()
    token = f"SWARMYARD_EXEC={os.urandom(8).hex()}"
    marker = token.encode()
    env = {**req["env"], "SWARMYARD_EXEC": token.partition("=")[2]}
    try:
        proc = subprocess.Popen(
            req["argv"],
            env=env,
            cwd=req.get("cwd"),
            start_new_session=True,
            close_fds=True,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        wire.send_json(conn, b"!", {"message": f"{req['argv'][0]}: {exc.strerror}", "errno": exc.errno})
        return
    _RUNNING[proc.pid] = marker
    if stdin_data is not None and proc.stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin_data), daemon=True).start()
    assert proc.stdout is not None and proc.stderr is not None
    timeout_s = req.get("timeout_s")
    deadline = None if timeout_s is None else started + float(timeout_s)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, b"o")
    sel.register(proc.stderr, selectors.EVENT_READ, b"e")
    sel.register(conn, selectors.EVENT_READ, b"c")
    timed_out = False
    streams = 2
    try:
        while streams:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                timed_out = True
                kill_tree(proc.pid, marker)
                break
            for key, _ in sel.select(wait):
                if key.data == b"c":  # the host hung up (cancelled): nothing may outlive the exec
                    kill_tree(proc.pid, marker)
                    proc.wait()
                    return
                data = os.read(key.fd, _CHUNK)
                if data:
                    wire.send_frame(conn, key.data, data)
                else:
                    sel.unregister(key.fileobj)
                    streams -= 1
        if deadline is None:
            returncode = proc.wait()
        else:
            try:
                returncode = proc.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc.pid, marker)
                returncode = proc.wait()
        # The leader is gone; stragglers that kept no pipe open would still be its session's: end them too.
        if timed_out:
            kill_tree(proc.pid, marker)
        wire.send_json(
            conn,
            b"x",
            {
                "exit_code": _exit_code(returncode),
                "timed_out": timed_out,
                "duration_s": time.monotonic() - started,
            },
        )
    except OSError:
        kill_tree(proc.pid, marker)
        proc.wait()
    finally:
        _RUNNING.pop(proc.pid, None)
        sel.close()
        proc.stdout.close()
        proc.stderr.close()


def _feed(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass


def _put(conn: socket.socket, req: dict[str, Any]) -> None:
    path = Path(req["path"])
    size = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # replaced, not rewritten in place: a file sent read-only (a governed slot's module, 0o400) takes its next
        # copy, and a symlink left where the file goes is replaced, not written through; open says what failed
        with contextlib.suppress(OSError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, int(req.get("mode", 0o644)))
    except OSError as exc:
        _drain_upload(conn)
        wire.send_json(conn, b"!", {"message": f"{path}: {exc.strerror}", "errno": exc.errno})
        return
    failed: OSError | None = None
    try:
        while (frame := wire.recv_frame(conn)) is not None and frame[1]:
            data = memoryview(frame[1])
            while failed is None and data:
                try:  # a full disk (ENOSPC) is said, as the C init says it, after the rest is drained
                    data = data[os.write(fd, data):]
                except OSError as exc:
                    failed = exc
            size += len(frame[1])
    finally:
        os.close(fd)
    if failed is not None:
        wire.send_json(conn, b"!", {"message": f"{path}: {failed.strerror}", "errno": failed.errno})
        return
    wire.send_json(conn, b"x", {"size": size})


def _drain_upload(conn: socket.socket) -> None:
    while (frame := wire.recv_frame(conn)) is not None and frame[1]:
        pass


def _get(conn: socket.socket, req: dict[str, Any]) -> None:
    path = Path(req["path"])
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is sent (a symlink to
        # /dev/zero or a FIFO would never end)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        wire.send_json(conn, b"!", {"message": f"{path}: {exc.strerror}", "errno": exc.errno})
        return
    if not S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        wire.send_json(conn, b"!", {"message": f"{path}: not a regular file", "errno": errno.EINVAL})
        return
    os.set_blocking(fd, True)
    handle = os.fdopen(fd, "rb")
    size = 0
    with handle:
        try:
            while chunk := handle.read(wire.MAX_FRAME):
                wire.send_frame(conn, b"d", chunk)
                size += len(chunk)
        except OSError as exc:  # a file that fails to read (/proc/self/mem: EIO) is an error, not a short file
            if exc.errno == errno.EPIPE or isinstance(exc, ConnectionError):
                raise
            wire.send_json(conn, b"!", {"message": f"{path}: {exc.strerror}", "errno": exc.errno})
            return
    wire.send_json(conn, b"x", {"size": size})


def _serve_one(conn: socket.socket) -> None:
    with conn:
        try:
            # Only the host may ask: a process of this machine has its peer pid in the machine's pid namespace,
            # and through the init it could run what its own exec lock (or the allowlist, by ld.so) refused.
            pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if _HOST_ONLY and pid != 0:
                return
            frame = wire.recv_frame(conn)
            if frame is None or frame[0] != b"q":
                return
            req = wire.decode_request(frame[1])
            op = req.get("op")
            if op == "exec":
                _run_exec(conn, req)
            elif op == "put":
                _put(conn, req)
            elif op == "get":
                _get(conn, req)
            elif op == "ping":
                wire.send_json(conn, b"x", {"pid": os.getpid()})
            else:
                wire.send_json(conn, b"!", {"message": f"unknown op {op!r}", "errno": 0})
        except (OSError, ValueError):
            return


_RUNNING: dict[int, bytes] = {}
#: Serve only peers outside this pid namespace (the host): set for an init that has a pid namespace of its own.
_HOST_ONLY = False
_PR_SET_DUMPABLE = 4


def _terminate(signum: int, frame: object) -> None:
    for pid, marker in list(_RUNNING.items()):
        kill_tree(pid, marker)
    os._exit(0)


def _boot_failed(ready_fd: int, exc: OSError) -> NoReturn:
    """Report a failure to start on the ready pipe (the host reads it as the boot's error) and give up."""
    os.write(ready_fd, json.dumps({"error": str(exc)}).encode() + b"\n")
    raise SystemExit(3) from exc


def main(argv: list[str] | None = None) -> None:
    """Bind, restrict, report ready on ``ready_fd``, then serve forever."""
    global _HOST_ONLY
    config: dict[str, Any] = json.loads((argv or sys.argv)[1])
    _HOST_ONLY = bool(config.get("host_only"))
    try:
        # A governed machine: its writable mounts noexec while the init still holds CAP_SYS_ADMIN (see noexec).
        noexec.mount_noexec(config.get("noexec", []))
    except OSError as exc:
        _boot_failed(config["ready_fd"], exc)
    if config.get("user") is not None:
        # Leave the root of the machine's user namespace (bwrap set the sandbox up as it) before anything else.
        uid = int(config["user"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    try:
        if config.get("nest_user") is not None:
            noexec.nest_user(int(config["nest_user"]))
        # Not dumpable (once the uid maps are written: a non-dumpable process cannot write its own): no process of
        # the machine (same uid) may open /proc/<init>/mem and make the init, which can exec, run code of its
        # choosing. Leaving root does this too; bwrap's own user namespace would have started us as the uid.
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        if config.get("noexec"):
            noexec.drop_capabilities()
        if config.get("seccomp_fd") is not None:  # the filter bwrap would have loaded before the remounts
            with os.fdopen(int(config["seccomp_fd"]), "rb") as handle:
                seccomp.load_filter(handle.read())
    except OSError as exc:
        _boot_failed(config["ready_fd"], exc)
    signal.signal(signal.SIGTERM, _terminate)
    # Bind by a relative name: a run folder deep under a temp dir can exceed the 108-byte socket path limit.
    os.chdir(os.path.dirname(config["ctl"]))
    name = os.path.basename(config["ctl"])
    if os.path.exists(name):
        os.unlink(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(256)
    os.chdir(config.get("cwd", "/"))
    ready: dict[str, Any] = {"pid": os.getpid(), "relay_port": None, "landlock_abi": 0}
    if config.get("relay_target"):
        relay = Relay(config["relay_target"], int(config.get("relay_port", 0)))
        relay.start()
        ready["relay_port"] = relay.port
    if config.get("landlock") is not None:
        try:
            ready["landlock_abi"] = landlock.restrict_writes(
                config["landlock"]["writable"], device_paths=config["landlock"].get("devices", []),
                exec_only=config["landlock"].get("exec_only", []),
            )
        except OSError as exc:
            # an exec allowlist is never dropped for a weaker sandbox: without it the machine has a shell
            if config.get("landlock_required", True) or config["landlock"].get("exec_only"):
                _boot_failed(config["ready_fd"], exc)
    os.write(config["ready_fd"], json.dumps(ready).encode() + b"\n")
    os.close(config["ready_fd"])
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
