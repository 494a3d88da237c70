"""The framing spoken over a machine's control socket, between the host and the in-sandbox init (stdlib only).

A request is one frame of kind ``q`` holding JSON, optionally followed by ``d`` frames (upload data) and an empty
``d`` frame. Answers are frames: ``o``/``e`` (stdout/stderr bytes), ``d`` (download data), ``x`` (JSON: the end,
exit status or ok) and ``!`` (JSON: an error with ``message`` and ``errno``).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!cI")
#: Largest frame either side sends; bigger payloads are split.
MAX_FRAME = 1 << 20


def send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    """Send one frame."""
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def send_json(sock: socket.socket, kind: bytes, value: dict[str, Any]) -> None:
    """Send one frame holding JSON."""
    send_frame(sock, kind, json.dumps(value).encode())


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, MAX_FRAME))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """Receive one frame as ``(kind, payload)``, or ``None`` when the peer closed the connection."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    kind, size = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over the {MAX_FRAME} limit")
    payload = _recv_exact(sock, size) if size else b""
    if payload is None:
        return None
    return kind, payload
