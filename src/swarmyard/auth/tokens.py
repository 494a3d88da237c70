"""Capability tokens: one per worker, scoped to a goal, a group and the worker id, with an expiry.

A token is ``sy1.<payload>.<mac>``: the payload is base64url canonical JSON, the MAC is HMAC-SHA256 under the
control plane's secret. The store keeps only the SHA-256 of each token, so a leaked database does not leak
tokens, and revocation is a store update that the next call sees. Operator tokens use the same format with
``role = "operator"`` and are not stored.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from swarmyard.canonical import canonical_json
from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import ForbiddenError, InsecureSecretError, InvalidTokenError, NotFoundError
from swarmyard.ids import new_id
from swarmyard.secret_files import write_secret_file
from swarmyard.store.protocol import WorkersStore

_PREFIX = "sy1"
# Tokens whose signature verified, kept so each call does not redo base64, HMAC and JSON: a bounded map
_OPENED_MAX = 4096
# A token this authority signs is about 200 characters; anything far longer is not one of ours
_TOKEN_MAX_CHARS = 4096
#: What stands in the place of a token of this authority's in text a worker submits (``TokenAuthority.redact``).
REDACTED = "[capability token]"
# A token as it stands in text: the prefix, a base64url payload and the 43 characters of a base64url HMAC-SHA256
# (characters that may follow the MAC are left where they are: the token ends there)
_IN_TEXT = re.compile(r"sy1\.([A-Za-z0-9_-]{8,4000})\.([A-Za-z0-9_-]{43})")
_IN_BYTES = re.compile(_IN_TEXT.pattern.encode())


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a verified worker token speaks for."""

    worker_id: str
    goal_id: str
    group: str
    expires_at: float


def token_hash(token: str) -> str:
    """The hex SHA-256 under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_or_create_secret(path: Path) -> bytes:
    """The control plane's 32-byte token secret, created with ``O_CREAT | O_EXCL`` and mode 0600 on first use.

    An existing file is read only if it is a regular file of this user's that no group or other user can read or
    write (checked on the descriptor read, not on the name): anyone who can read it forges an operator token.
    Otherwise :class:`~swarmyard.errors.InsecureSecretError`, which says how to fix it."""
    with contextlib.suppress(FileExistsError):  # it exists, or another process created it first
        write_secret_file(path, secrets.token_bytes(32))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InsecureSecretError(str(path), "it is a symbolic link", "point --secret-file at the file "
                                      "itself") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InsecureSecretError(str(path), "it is not a regular file", "point --secret-file at a file")
        if info.st_uid != os.getuid():
            raise InsecureSecretError(str(path), f"it belongs to uid {info.st_uid}, not to this user "
                                      f"({os.getuid()})", f"chown {os.getuid()} {path} && chmod 600 {path}, or "
                                      "let swarmyard create a new one")
        if info.st_mode & 0o077:
            raise InsecureSecretError(str(path), f"its mode is {stat.S_IMODE(info.st_mode):o}: others can read "
                                      "or write it", f"chmod 600 {path}, and make a new one if anyone else may "
                                      "have read it (tokens signed with it are forgeable)")
        secret = handle.read()
    if len(secret) < 32:
        raise InvalidTokenError(f"token secret at {path.name} is too short")
    return secret


class TokenAuthority:
    """Issues, verifies and revokes capability tokens."""

    def __init__(self, secret: bytes, store: WorkersStore, clock: Clock | None = None) -> None:
        self._secret = secret
        self._store = store
        self._clock = clock or SystemClock()
        # token -> its payload once the MAC verified; expiry and revocation are still checked on every call
        self._opened: dict[str, dict[str, object]] = {}

    def _sign(self, payload: dict[str, object]) -> str:
        body = _b64(canonical_json(payload))
        mac = hmac.new(self._secret, f"{_PREFIX}.{body}".encode(), hashlib.sha256).digest()
        return f"{_PREFIX}.{body}.{_b64(mac)}"

    def _signed_here(self, payload: str, mac: str) -> bool:
        expected = hmac.new(self._secret, f"{_PREFIX}.{payload}".encode(), hashlib.sha256).digest()
        return hmac.compare_digest(_b64(expected), mac)

    def redact(self, text: str) -> str:
        """``text`` with every token this authority signed (a worker's or an operator's, live or expired: the MAC
        is checked, not the store) replaced by ``REDACTED``.

        For what a worker submits: its agent can read its own token (its environment, ``/proc``) and print it into
        a finding, a post or an artifact, which the store keeps and the report and dashboard show. Only what
        verifies is replaced, so text that merely looks like a token stays as written; a token the agent encoded
        (base64, split over lines) is not found."""
        if "sy1." not in text:
            return text
        return _IN_TEXT.sub(lambda m: REDACTED if self._signed_here(m[1], m[2]) else m[0], text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``redact`` for bytes (an artifact): the token's characters are ASCII whatever the encoding around them."""
        if b"sy1." not in data:
            return data
        return _IN_BYTES.sub(lambda m: REDACTED.encode() if self._signed_here(m[1].decode(), m[2].decode())
                             else m[0], data)

    def _open(self, token: str) -> dict[str, object]:
        payload = self._opened.get(token)
        if payload is None:
            payload = self._verify_mac(token)
            if len(self._opened) >= _OPENED_MAX:
                self._opened.clear()  # simpler than LRU; a swarm has far fewer live tokens than this
            self._opened[token] = payload
        exp = payload.get("exp")
        if not isinstance(exp, int) or exp <= int(self._clock.now() * 1000):
            raise InvalidTokenError("token has expired")
        return payload

    def _verify_mac(self, token: str) -> dict[str, object]:
        # The MAC is checked before the payload is decoded: a forged payload (say JSON nested 20,000 deep)
        # never reaches a parser. Only what this authority signed is parsed.
        parts = token.split(".")
        if len(token) > _TOKEN_MAX_CHARS or len(parts) != 3 or parts[0] != _PREFIX:
            raise InvalidTokenError("malformed token")
        try:
            mac = _unb64(parts[2])
            expected = hmac.new(self._secret, f"{_PREFIX}.{parts[1]}".encode(), hashlib.sha256).digest()
        except (ValueError, UnicodeEncodeError) as exc:
            raise InvalidTokenError("malformed token") from exc
        if not hmac.compare_digest(mac, expected):
            raise InvalidTokenError("token signature does not verify")
        try:
            payload = json.loads(_unb64(parts[1]))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidTokenError("malformed token") from exc
        if not isinstance(payload, dict):
            raise InvalidTokenError("malformed token")
        return payload

    def issue(self, goal_id: str, group: str, *, ttl_s: float,
              worker_id: str | None = None) -> tuple[str, WorkerIdentity]:
        """Issue a worker token, register the worker and store the token's hash."""
        worker_id = worker_id or new_id("wrk")
        expires_ms = int((self._clock.now() + ttl_s) * 1000)
        token = self._sign({"role": "worker", "wid": worker_id, "goal": goal_id, "group": group,
                            "exp": expires_ms, "n": secrets.token_hex(8)})
        self._store.add_worker(worker_id, goal_id, group, token_hash(token), expires_ms / 1000)
        return token, WorkerIdentity(worker_id, goal_id, group, expires_ms / 1000)

    def verify_signed(self, token: str) -> WorkerIdentity:
        """The identity a worker token's signature vouches for, checking its expiry but NOT the store.

        For a caller that checks revocation and the token's hash itself in the same transaction as its write
        (the broker's reservation, ``Store.reserve_for_worker``): every other caller uses ``verify``.
        """
        payload = self._open(token)
        if payload.get("role") != "worker":
            raise InvalidTokenError("not a worker token")
        return WorkerIdentity(str(payload["wid"]), str(payload["goal"]), str(payload["group"]),
                              int(str(payload["exp"])) / 1000)

    def verify(self, token: str) -> WorkerIdentity:
        """The identity behind a worker token; ``InvalidTokenError`` if forged, expired, revoked, unknown."""
        payload = self._open(token)
        if payload.get("role") != "worker":
            raise InvalidTokenError("not a worker token")
        worker_id = str(payload["wid"])
        try:
            worker = self._store.get_worker(worker_id)
        except NotFoundError:
            raise InvalidTokenError("unknown worker") from None
        if worker.revoked:
            raise InvalidTokenError(f"worker {worker_id} has been revoked")
        if not hmac.compare_digest(worker.token_hash, token_hash(token)):
            raise InvalidTokenError("token is not the worker's current token")
        return WorkerIdentity(worker_id, str(payload["goal"]), str(payload["group"]),
                              int(str(payload["exp"])) / 1000)

    def verify_for_goal(self, token: str, goal_id: str) -> WorkerIdentity:
        """Verify and require the token's goal to be ``goal_id`` (403 otherwise)."""
        identity = self.verify(token)
        if identity.goal_id != goal_id:
            raise ForbiddenError(f"worker {identity.worker_id} is not scoped to goal {goal_id}")
        return identity

    def issue_operator(self, *, ttl_s: float = 365 * 86400.0) -> str:
        """An operator token (full access to the operator API)."""
        return self._sign({"role": "operator", "exp": int((self._clock.now() + ttl_s) * 1000),
                           "n": secrets.token_hex(8)})

    def verify_operator(self, token: str) -> None:
        """Raise unless ``token`` is a valid operator token."""
        if self._open(token).get("role") != "operator":
            raise ForbiddenError("an operator token is required")

    def revoke(self, worker_id: str) -> None:
        """Revoke a worker's token."""
        self._store.revoke_worker(worker_id)
