"""The relay: TCP on 127.0.0.1 inside the machine, forwarded to the control plane's Unix socket (stdlib only).

Agent CLIs speak HTTP to a base URL; the sandbox has no network but loopback, so the init runs this relay and
``OPENAI_BASE_URL=http://127.0.0.1:PORT/v1`` reaches the bind-mounted control plane socket unchanged.
"""

from __future__ import annotations

import socket
import sys
import threading

_CHUNK = 65536


class Relay:
    """Accepts TCP connections on ``127.0.0.1:port`` and pipes each to a new connection to ``target`` (a path)."""

    def __init__(self, target: str, port: int = 0) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()

    def start(self) -> None:
        """Serve in a daemon thread."""
        threading.Thread(target=self._serve, name="relay", daemon=True).start()

    def close(self) -> None:
        """Stop accepting; open connections end with their peers."""
        self._closed.set()
        self._listener.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError as exc:
            # The init has no logging set up (it starts bare to boot fast); its stderr is the machine's boot log.
            sys.stderr.write(f"relay: cannot reach {self.target}: {exc}\n")
            client.close()
            upstream.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF, then half-close ``dst`` so HTTP request/response framing keeps working."""
    try:
        while chunk := src.recv(_CHUNK):
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
