"""The host's side of a machine's control socket: exec, streamed exec and file transfer requests to its init."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from swarmyard.errors import (
    MachineNotRespondingError,
    MachineRefusedError,
    NotFoundError,
    PayloadTooLargeError,
    SandboxError,
    SwarmyardError,
)
from swarmyard.guest import wire
from swarmyard.machines.protocol import ExecEvent, ExecResult, OutputCap

#: Extra time the host waits past an exec's own timeout before it gives up on the init and hangs up.
GRACE_S = 5.0
#: The longest a wait for an exec's next output blocks in one system call. The kernel hands a signal sent to the
#: process (SIGTERM ending a Boxd script) to any thread that does not block it; Python runs its handler in the main
#: thread only, and only once that thread comes back from its system call: an exec of a long command waiting in
#: ``recv`` would hear it only when the command ended. Waking this often runs the handler within this bound.
WAKE_S = 0.5
#: How long a file transfer waits on the init between two steps before it says the machine is not responding.
TRANSFER_TIMEOUT_S = 60.0
#: The most a download brings back: the whole file is held in this process, and a machine decides what its
#: files are (a symlink to ``/dev/zero`` never ends; the init refuses files that are not regular, this counts).
MAX_DOWNLOAD_BYTES = 64 << 20
#: What the init answers when a request names what is not there (a missing file or folder, a command not found).
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
#: What the init answers when a request asks what the machine itself refuses: a folder, a device or FIFO, a file it
#: may not read or write, an argv past the kernel's limits, a full disk. The caller's doing, not the host's: 4xx.
_REFUSED = frozenset({errno.EISDIR, errno.EINVAL, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG,
                      errno.E2BIG, errno.ENOEXEC, errno.EIO, errno.ETXTBSY, errno.ENOSPC, errno.EDQUOT,
                      errno.EFBIG, errno.EEXIST, errno.ENXIO, errno.ENODEV, errno.EFAULT})


class _Kept:
    """One stream of an exec as the host keeps it: a head, a tail, and a count of everything written."""

    def __init__(self, cap: OutputCap) -> None:
        self._cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._cap.head_bytes - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self._cap.tail_bytes > 0:
            self.tail += data
            if len(self.tail) > 2 * self._cap.tail_bytes:
                # trimmed in batches: a frame at a time would move the whole tail for every frame
                del self.tail[: len(self.tail) - self._cap.tail_bytes]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self._cap.tail_bytes)

    def value(self) -> bytes:
        tail = self.tail[-self._cap.tail_bytes :] if self._cap.tail_bytes else b""
        return bytes(self.head) + bytes(tail)


def _await_data(sock: socket.socket, timeout_s: float | None, answering: Callable[[], None] | None = None) -> None:
    """Return once ``sock`` has data (or its peer hung up); ``TimeoutError`` after ``timeout_s`` with none. Waits in
    slices of :data:`WAKE_S`, between which the main thread runs the signal handlers due (see there) and
    ``answering`` raises if the machine can no longer answer (its init stopped from inside meanwhile)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
        if left <= 0:
            raise TimeoutError("no output from the machine in time")
        if poller.poll(left * 1000):
            return
        if answering is not None:
            answering()


class InitClient:
    """Talks to one machine's init over its Unix socket (one connection per request)."""

    def __init__(self, machine_id: str, socket_path: Path, output_cap: OutputCap | None = None) -> None:
        self.machine_id = machine_id
        self.socket_path = socket_path
        self.output_cap = output_cap or OutputCap()

    def _connect(self, timeout_s: float | None) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        # Reach the socket through an O_PATH descriptor of its folder: run folders under a deep temp dir can
        # exceed the 108-byte sun_path limit.
        dir_fd = os.open(self.socket_path.parent, os.O_PATH | os.O_CLOEXEC)
        try:
            sock.connect(f"/proc/self/fd/{dir_fd}/{self.socket_path.name}")
        except OSError as exc:
            sock.close()
            raise SandboxError(
                f"machine {self.machine_id} is not reachable: {exc}", machine_id=self.machine_id
            ) from exc
        finally:
            os.close(dir_fd)
        return sock

    def stream_exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
        answering: Callable[[], None] | None = None,
    ) -> Iterator[ExecEvent]:
        """Run a command; yield ``stdout``/``stderr`` events and finally one ``exit`` event. ``answering``, called
        while no output comes, raises when the machine can no longer answer (the wait would never end)."""
        started = time.monotonic()
        host_timeout = None if timeout_s is None else timeout_s + GRACE_S
        request = wire.encode_request("exec", argv=argv, env=env, cwd=cwd, timeout_s=timeout_s, stdin=stdin)
        if len(request) > wire.MAX_FRAME:
            # one frame carries the whole request: a larger one the init would refuse by hanging up
            raise PayloadTooLargeError("an exec's command, environment and stdin", len(request), wire.MAX_FRAME)
        sock = self._connect(host_timeout)
        stdout, stderr = _Kept(self.output_cap), _Kept(self.output_cap)

        def result(exit_code: int, timed_out: bool) -> ExecResult:
            return ExecResult(stdout.value(), stderr.value(), exit_code, timed_out, time.monotonic() - started,
                              truncated=stdout.truncated or stderr.truncated, stdout_bytes=stdout.total,
                              stderr_bytes=stderr.total)

        try:
            wire.send_frame(sock, b"q", request)
            while True:
                try:
                    _await_data(sock, host_timeout, answering)
                    frame = wire.recv_frame(sock)
                except TimeoutError:
                    # Closing the connection makes the init kill the command's process tree.
                    yield ExecEvent("exit", result=result(137, True))
                    return
                if frame is None:
                    raise SandboxError(
                        f"machine {self.machine_id} went away during exec", machine_id=self.machine_id
                    )
                kind, payload = frame
                if kind in (b"o", b"e"):
                    (stdout if kind == b"o" else stderr).add(payload)
                    yield ExecEvent("stdout" if kind == b"o" else "stderr", data=payload)
                elif kind == b"x":
                    status = json.loads(payload)
                    yield ExecEvent("exit", result=result(int(status["exit_code"]), bool(status["timed_out"])))
                    return
                else:
                    raise self._error(payload, "command")
        except OSError as exc:
            raise SandboxError(
                f"machine {self.machine_id}: exec failed: {exc}", machine_id=self.machine_id
            ) from exc
        finally:
            sock.close()

    def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
        answering: Callable[[], None] | None = None,
    ) -> ExecResult:
        """Run a command to completion (``answering``: see :meth:`stream_exec`)."""
        for event in self.stream_exec(argv, env=env, cwd=cwd, timeout_s=timeout_s, stdin=stdin, answering=answering):
            if event.result is not None:
                return event.result
        raise SandboxError(
            f"machine {self.machine_id}: exec ended without a status", machine_id=self.machine_id
        )

    def upload(self, path: str, data: bytes, mode: int) -> None:
        """Write ``data`` to ``path`` inside the machine."""
        request = wire.encode_request("put", path=path, mode=mode)
        if len(data) <= wire.MAX_FRAME:
            # the request, the data and its end in one write: the init reads them with no wait between (a wake-up
            # of its thread per frame was most of a small upload's time)
            with self._answering(), self._connect(TRANSFER_TIMEOUT_S) as sock:
                wire.send_frames(sock, [(b"q", request), (b"d", data), (b"d", b"")] if data
                                 else [(b"q", request), (b"d", b"")])
                self._finish(sock, "path")
            return
        with self._answering(), self._request(request) as sock:
            for start in range(0, len(data), wire.MAX_FRAME):
                wire.send_frame(sock, b"d", data[start : start + wire.MAX_FRAME])
            wire.send_frame(sock, b"d", b"")
            self._finish(sock, "path")

    def upload_many(self, files: Sequence[tuple[str, bytes, int]]) -> None:
        """Write several files (path, data, mode) at once: every request is sent, each on a connection of its own,
        before any answer is read, so the init's threads write them side by side and this thread waits for them
        together. A thread per file, as a caller would otherwise use, costs a wake-up of each on a busy host.
        Every answer is read before the first refusal is raised. A file over one frame is sent on its own."""
        socks: list[socket.socket] = []
        failure: BaseException | None = None
        try:
            with self._answering():
                for path, data, mode in files:
                    if len(data) > wire.MAX_FRAME:
                        self.upload(path, data, mode)
                        continue
                    sock = self._connect(TRANSFER_TIMEOUT_S)
                    socks.append(sock)
                    request = wire.encode_request("put", path=path, mode=mode)
                    wire.send_frames(sock, [(b"q", request), (b"d", data), (b"d", b"")] if data
                                     else [(b"q", request), (b"d", b"")])
                for sock in socks:
                    try:
                        self._finish(sock, "path")
                    except (SwarmyardError, OSError) as exc:
                        failure = failure or exc
                if failure is not None:
                    raise failure
        finally:
            for sock in socks:
                sock.close()

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Around a file transfer: an init that does not answer within ``TRANSFER_TIMEOUT_S`` (a process in the
        machine may stop it) is said as such, naming only the machine, not as a bare ``TimeoutError``."""
        try:
            yield
        except TimeoutError as exc:
            raise MachineNotRespondingError(
                f"machine {self.machine_id} did not answer within {TRANSFER_TIMEOUT_S:.0f} s: its init is stopped "
                "or stuck; a delete still works", machine_id=self.machine_id) from exc

    def download(self, path: str, max_bytes: int = MAX_DOWNLOAD_BYTES) -> bytes:
        """Read ``path`` from inside the machine; more than ``max_bytes`` raises ``PayloadTooLargeError``."""
        chunks: list[bytes] = []
        size = 0
        with self._answering(), self._request(wire.encode_request("get", path=path)) as sock:
            while True:
                frame = wire.recv_frame(sock)
                if frame is None:
                    raise SandboxError(f"machine {self.machine_id} went away", machine_id=self.machine_id)
                if frame[0] == b"d":
                    size += len(frame[1])
                    if size > max_bytes:
                        # hanging up (leaving the with) stops the init's sending
                        raise PayloadTooLargeError(f"{path} in machine {self.machine_id}", size, max_bytes)
                    chunks.append(frame[1])
                    continue
                if frame[0] == b"x":
                    return b"".join(chunks)
                raise self._error(frame[1], "path", path)

    def _request(self, request: bytes) -> socket.socket:
        sock = self._connect(TRANSFER_TIMEOUT_S)
        wire.send_frame(sock, b"q", request)
        return sock

    def _finish(self, sock: socket.socket, field: str) -> None:
        frame = wire.recv_frame(sock)
        if frame is None:
            raise SandboxError(f"machine {self.machine_id} went away", machine_id=self.machine_id)
        if frame[0] != b"x":
            raise self._error(frame[1], field)

    def _error(self, payload: bytes, field: str, path: str | None = None) -> SwarmyardError:
        """The init's refusal as the caller's error: a file that is not there is ``not_found`` (a download), what
        the machine refuses is ``MachineRefusedError`` (400) naming ``field``; anything else stays the host's
        ``SandboxError``."""
        body = json.loads(payload)
        code = body.get("errno")
        message = f"machine {self.machine_id}: {body.get('message')}"
        if code in _ABSENT and path is not None:
            return NotFoundError("file", path)
        if code in _ABSENT or code in _REFUSED:
            return MachineRefusedError(message, field=field, errno=code, machine_id=self.machine_id)
        return SandboxError(message, machine_id=self.machine_id, errno=code)
