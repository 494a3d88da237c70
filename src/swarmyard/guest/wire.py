"""The framing spoken over a machine's control socket, between the host and the in-sandbox init (stdlib only).

A request is one frame of kind ``q`` holding tagged fields (1 tag byte, a big-endian u32 length, the bytes; see
:func:`encode_request`), optionally followed by ``d`` frames (upload data) and an empty ``d`` frame. Fields rather
than JSON, so the init written in C reads requests without a JSON parser. Answers are frames: ``o``/``e`` (stdout/stderr bytes), ``d`` (download data), ``x`` (JSON: the end,
exit status or ok) and ``!`` (JSON: an error with ``message`` and ``errno``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

_HEADER = struct.Struct("!cI")
_FIELD = struct.Struct("!cI")
#: Largest frame either side sends; bigger payloads are split.
MAX_FRAME = 1 << 20


def send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    """Send one frame."""
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def send_frames(sock: socket.socket, frames: Sequence[tuple[bytes, bytes]]) -> None:
    """Send several frames in one write."""
    sock.sendall(b"".join(_HEADER.pack(kind, len(payload)) + payload for kind, payload in frames))


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


def encode_request(
    op: str,
    *,
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float | None = None,
    stdin: bytes | None = None,
    path: str | None = None,
    mode: int | None = None,
) -> bytes:
    """A request as tagged fields: ``o`` op, ``a`` argv (repeated), ``v`` ``K=V`` (repeated), ``c`` cwd,
    ``t`` timeout in seconds, ``i`` stdin, ``p`` path, ``m`` mode (decimal)."""
    fields: list[tuple[bytes, bytes]] = [(b"o", op.encode())]
    fields += [(b"a", os.fsencode(a)) for a in argv]
    fields += [(b"v", os.fsencode(f"{k}={v}")) for k, v in (env or {}).items()]
    if cwd is not None:
        fields.append((b"c", os.fsencode(cwd)))
    if timeout_s is not None:
        fields.append((b"t", repr(float(timeout_s)).encode()))
    if stdin is not None:
        fields.append((b"i", stdin))
    if path is not None:
        fields.append((b"p", os.fsencode(path)))
    if mode is not None:
        fields.append((b"m", str(int(mode)).encode()))
    return b"".join(_FIELD.pack(tag, len(value)) + value for tag, value in fields)


def decode_request(payload: bytes) -> dict[str, Any]:
    """The fields of :func:`encode_request` back as a dict (``argv`` a list, ``env`` a dict)."""
    req: dict[str, Any] = {"argv": [], "env": {}, "cwd": None, "timeout_s": None, "stdin": None}
    offset = 0
    while offset < len(payload):
        tag, size = _FIELD.unpack_from(payload, offset)
        offset += _FIELD.size
        value = payload[offset : offset + size]
        if len(value) != size:
            raise ValueError("truncated request field")
        offset += size
        if tag == b"o":
            req["op"] = value.decode()
        elif tag == b"a":
            req["argv"].append(os.fsdecode(value))
        elif tag == b"v":
            name, _, val = os.fsdecode(value).partition("=")
            req["env"][name] = val
        elif tag in (b"c", b"p"):
            req["cwd" if tag == b"c" else "path"] = os.fsdecode(value)
        elif tag == b"t":
            req["timeout_s"] = float(value)
        elif tag == b"i":
            req["stdin"] = value
        elif tag == b"m":
            req["mode"] = int(value)
    return req
