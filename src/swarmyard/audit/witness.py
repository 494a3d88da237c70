"""The witness: cosigns a log's checkpoint only when a valid consistency proof shows that it extends the last
one it cosigned, and refuses a fork or a rewrite (``WitnessRefusedError``, HTTP 409).

It keeps, per origin, the log's verifier key (given with ``--log`` or pinned on first use), the size, root and
text of the last checkpoint it cosigned, in one JSON file replaced atomically, so a restart forgets nothing.
Over HTTP it speaks the C2SP tlog-witness ``add-checkpoint`` request body::

    old <size>\\n
    <base64 consistency proof hash>\\n ...
    \\n
    <signed checkpoint note>

and answers with its cosignature line; a body over ``MAX_REQUEST_BYTES`` is refused (413) by its declared length
before it is read, or by a running count when chunked. ``GET /key`` answers its verifier key, and
``GET /checkpoint?origin=O`` the last checkpoint it cosigned for log ``O`` (the signed note with its cosignature
line): what ``audit verify`` compares a run's log with, so that a log rolled back below what the witness saw fails.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from swarmyard.audit.checkpoint import open_checkpoint, read_checkpoint
from swarmyard.audit.merkle import verify_consistency
from swarmyard.audit.note import COSIGNATURE_V1, NoteSignature, Signer, Verifier, parse_note
from swarmyard.audit.witness_home import WitnessHome
from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import (
    AuditError,
    InvalidInputError,
    InvalidProofError,
    InvalidSignatureError,
    NotFoundError,
    SwarmyardError,
    WitnessRefusedError,
)
from swarmyard.plane.limits import read_limited
from swarmyard.secret_files import load_or_create_ed25519

log = logging.getLogger(__name__)

LOG_KEY_HEADER = "x-swarmyard-log-key"
MAX_REQUEST_BYTES = 64 * 1024
#: digits of the largest tree size (2**64 - 1) a request may name
_MAX_SIZE_DIGITS = 20


class WitnessClient(Protocol):
    """Anything that cosigns checkpoints: the in-process ``Witness`` or an ``HttpWitnessClient``."""

    def verifier(self) -> Verifier:
        """The witness's cosignature verifier key."""
        ...

    def add_checkpoint(self, old_size: int, proof: Sequence[bytes], note: str, *,
                       log_vkey: str | None = None) -> NoteSignature:
        """Cosign ``note`` given a consistency proof from ``old_size``, the size the caller believes was last
        cosigned; ``log_vkey`` pins an unknown log's key on first use."""
        ...


@dataclass(frozen=True, slots=True)
class LogState:
    """What the witness remembers of one log."""

    vkey: str
    size: int
    root_hash: bytes | None
    checkpoint: str | None


class WitnessState:
    """Per-origin ``LogState`` in one JSON file, rewritten atomically (temp file, fsync, rename); ``publish``
    (a witness home's) is told each log's new checkpoint once the file holds it.

    Several witness processes may share one file (every ``swarmyard run`` on a host starts one on the host's
    home): ``locked()`` holds an exclusive ``flock`` on ``FILE.lock`` and re-reads the file, so each
    check-then-record sees what the others recorded and none overwrites another's logs.
    """

    def __init__(self, path: Path, *, publish: Callable[[str, str], None] | None = None) -> None:
        self.path = path
        self._publish = publish
        self._logs: dict[str, LogState] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            raw = json.loads(self.path.read_text())
            logs = {}
            for origin, item in raw["logs"].items():
                root = item["root"]
                logs[origin] = LogState(item["vkey"], int(item["size"]),
                                        None if root is None else base64.b64decode(root), item["checkpoint"])
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"witness state {self.path.name} is unreadable: {exc}") from exc
        self._logs = logs

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state file's lock, with what is on disk now loaded, until the block ends."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._load()
            yield
        finally:
            os.close(fd)  # releases the lock

    def get(self, origin: str) -> LogState | None:
        """The state of one log, if known."""
        return self._logs.get(origin)

    def put(self, origin: str, state: LogState) -> None:
        """Record a log's new state durably before anyone is told about it."""
        self._logs[origin] = state
        body = {"logs": {o: {"vkey": s.vkey, "size": s.size, "checkpoint": s.checkpoint,
                             "root": None if s.root_hash is None else base64.b64encode(s.root_hash).decode()}
                         for o, s in self._logs.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle, sort_keys=True, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        if self._publish is not None and state.checkpoint is not None:
            self._publish(origin, state.checkpoint)


class Witness:
    """Cosigns checkpoints that consistently extend what it cosigned before; refuses everything else."""

    def __init__(self, signer: Signer, state: WitnessState, *, clock: Clock | None = None,
                 logs: Sequence[Verifier] = (), trust_on_first_use: bool = True) -> None:
        if signer.alg != COSIGNATURE_V1:
            raise InvalidInputError("a witness signs with a cosignature (type 0x04) key", field="signer")
        self.signer = signer
        self.state = state
        self.clock = clock or SystemClock()
        self.trust_on_first_use = trust_on_first_use
        self._configured = {v.name: v for v in logs}
        # One request at a time: check-then-record must not interleave for the same origin.
        self._lock = threading.Lock()

    @classmethod
    def from_files(cls, name: str, key_path: Path, state_path: Path, **kwargs: Any) -> Witness:
        """A witness whose key (created 0600 if absent) and state live in the given files."""
        signer = Signer(name, load_or_create_ed25519(key_path), COSIGNATURE_V1)
        return cls(signer, WitnessState(state_path), **kwargs)

    @classmethod
    def from_home(cls, name: str, home: WitnessHome, **kwargs: Any) -> Witness:
        """A witness of a home (``swarmyard.audit.witness_home``, prepared): its key and state in the private
        folder, its key and every checkpoint it cosigns published in the public one."""
        signer = Signer(name, load_or_create_ed25519(home.key_path), COSIGNATURE_V1)
        home.publish_key(signer.verifier)
        return cls(signer, WitnessState(home.state_path, publish=home.publish), **kwargs)

    def verifier(self) -> Verifier:
        """The witness's cosignature verifier key."""
        return self.signer.verifier

    def _log_verifier(self, origin: str, log_vkey: str | None) -> Verifier:
        configured = self._configured.get(origin)
        known = self.state.get(origin)
        pinned = configured or (Verifier.parse(known.vkey) if known else None)
        if pinned is not None:
            if log_vkey is not None and Verifier.parse(log_vkey) != pinned:
                raise WitnessRefusedError(origin, "the log's key differs from the one pinned for this origin")
            return pinned
        if log_vkey is None or not self.trust_on_first_use:
            raise NotFoundError("log", origin)
        offered = Verifier.parse(log_vkey)
        if offered.name != origin:
            raise WitnessRefusedError(origin, f"the log key is named {offered.name!r}, not after the origin")
        return offered

    def latest(self, origin: str) -> str:
        """The last checkpoint cosigned for ``origin``, as a signed note with the cosignature line."""
        with self._lock, self.state.locked():
            known = self.state.get(origin)
        if known is None or known.checkpoint is None:
            raise NotFoundError("log", origin)
        return known.checkpoint

    def add_checkpoint(self, old_size: int, proof: Sequence[bytes], note: str, *,
                       log_vkey: str | None = None) -> NoteSignature:
        """Check and cosign ``note``; record it as this origin's latest before returning the cosignature."""
        origin = read_checkpoint(note).checkpoint.origin
        with self._lock, self.state.locked():
            verifier = self._log_verifier(origin, log_vkey)
            signed, _ = open_checkpoint(note, verifier, origin=origin)
            new = signed.checkpoint
            known = self.state.get(origin)
            last_size = known.size if known else 0
            last_root = known.root_hash if known else None
            if old_size != last_size:
                raise WitnessRefusedError(origin, f"old size {old_size} is not the last cosigned size",
                                          witness_size=last_size)
            if new.size < last_size:
                raise WitnessRefusedError(origin, f"size {new.size} rolls back cosigned size {last_size}",
                                          witness_size=last_size)
            if last_root is None:
                if proof:
                    raise WitnessRefusedError(origin, "a first checkpoint takes no proof", witness_size=0)
            else:
                try:
                    verify_consistency(last_size, new.size, proof, last_root, new.root_hash)
                except InvalidProofError as exc:
                    raise WitnessRefusedError(origin, f"fork or rewrite: {exc.reason}",
                                              witness_size=last_size) from exc
            cosignature = self.signer.signature(signed.note.text, timestamp=int(self.clock.now()))
            self.state.put(origin, LogState(verifier.vkey, new.size, new.root_hash,
                                            signed.note.with_signature(cosignature).render()))
        log.info("cosigned %s at size %d", origin, new.size)
        return cosignature


# -- HTTP ------------------------------------------------------------------------------------------------

def parse_add_checkpoint(body: str) -> tuple[int, list[bytes], str]:
    """Split a tlog-witness ``add-checkpoint`` body into old size, proof hashes and the checkpoint note."""
    head, sep, note = body.partition("\n\n")
    lines = head.split("\n")
    if not sep or not lines[0].startswith("old "):
        raise InvalidInputError("add-checkpoint body must start with 'old <size>' and a blank line",
                                field="body")
    size_text = lines[0][4:]
    # ASCII digits only, no leading zero, and short: ``isdigit`` alone takes "²" and "①", which int() refuses,
    # and int() refuses more than 4300 digits; a tree size fits in 20
    if (not size_text.isascii() or not size_text.isdigit() or len(size_text) > _MAX_SIZE_DIGITS
            or (size_text != "0" and size_text[0] == "0")):
        raise InvalidInputError(f"old size {size_text[:40]!r} is not a decimal number", field="old")
    try:
        proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError("a proof line is not valid base64", field="proof") from exc
    return int(size_text), proof, note


def format_add_checkpoint(old_size: int, proof: Sequence[bytes], note: str) -> str:
    """The ``add-checkpoint`` request body."""
    return "".join([f"old {old_size}\n", *(base64.b64encode(h).decode() + "\n" for h in proof), "\n", note])


def _error_response(exc: SwarmyardError) -> JSONResponse:
    status = exc.status
    if isinstance(exc, InvalidSignatureError):
        status = 403  # the note is not signed by the log the witness knows under that origin
    elif isinstance(exc, InvalidInputError):
        status = 400
    return JSONResponse(exc.to_dict(), status_code=status)


def create_app(witness: Witness) -> Starlette:
    """The witness's ASGI app; the state file is written in the thread pool, never on the event loop."""

    async def add_checkpoint(request: Request) -> Response:
        try:
            # refused by its declared length before a byte is read, and by a running count (chunked bodies)
            body = await read_limited(request.stream(), request.headers.get("content-length"), MAX_REQUEST_BYTES)
            old_size, proof, note = parse_add_checkpoint(body.decode("utf-8"))
            cosignature = await run_in_threadpool(witness.add_checkpoint, old_size, proof, note,
                                                  log_vkey=request.headers.get(LOG_KEY_HEADER))
        except UnicodeDecodeError:
            return JSONResponse({"error": {"code": "invalid_input", "message": "body is not UTF-8"}},
                                status_code=400)
        except SwarmyardError as exc:
            return _error_response(exc)
        return PlainTextResponse(cosignature.line)

    def key(request: Request) -> Response:
        return PlainTextResponse(witness.verifier().vkey + "\n")

    def checkpoint(request: Request) -> Response:
        origin = request.query_params.get("origin")
        if not origin:
            return _error_response(InvalidInputError("give the log's origin: ?origin=...", field="origin"))
        try:
            return PlainTextResponse(witness.latest(origin))
        except SwarmyardError as exc:
            return _error_response(exc)

    return Starlette(routes=[Route("/add-checkpoint", add_checkpoint, methods=["POST"]),
                             Route("/key", key, methods=["GET"]),
                             Route("/checkpoint", checkpoint, methods=["GET"])])


class HttpWitnessClient:
    """Talks to a witness over a Unix socket or a loopback port."""

    @classmethod
    def at(cls, where: str, *, timeout_s: float = 10.0) -> HttpWitnessClient:
        """A client of the witness at ``where``: an ``http(s)://`` URL, else a Unix socket path."""
        if where.startswith(("http://", "https://")):
            return cls(url=where, timeout_s=timeout_s)
        return cls(socket=Path(where), timeout_s=timeout_s)

    def __init__(self, *, socket: Path | None = None, url: str | None = None,
                 timeout_s: float = 10.0) -> None:
        if (socket is None) == (url is None):
            raise InvalidInputError("give the witness a socket or a url, not both", field="witness")
        transport = httpx.HTTPTransport(uds=str(socket)) if socket is not None else None
        self._http = httpx.Client(base_url=url or "http://witness", transport=transport, timeout=timeout_s)
        self._verifier: Verifier | None = None

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AuditError(f"witness unreachable: {exc}") from exc

    def verifier(self) -> Verifier:
        """The witness's verifier key, as it announces it."""
        if self._verifier is None:
            response = self._request("GET", "/key")
            if response.status_code != 200:
                raise AuditError(f"witness answered {response.status_code} for its key")
            self._verifier = Verifier.parse(response.text)
        return self._verifier

    def latest(self, origin: str) -> str:
        """The last checkpoint the witness cosigned for ``origin`` (``NotFoundError`` if it knows none)."""
        response = self._request("GET", "/checkpoint", params={"origin": origin})
        if response.status_code == 404:
            raise NotFoundError("log", origin)
        if response.status_code != 200:
            raise AuditError(f"witness answered {response.status_code} for the checkpoint of {origin}")
        return response.text

    def add_checkpoint(self, old_size: int, proof: Sequence[bytes], note: str, *,
                       log_vkey: str | None = None) -> NoteSignature:
        """Ask for a cosignature; a refusal raises the witness's typed error."""
        headers = {LOG_KEY_HEADER: log_vkey} if log_vkey else {}
        body = format_add_checkpoint(old_size, proof, note)
        response = self._request("POST", "/add-checkpoint", content=body, headers=headers)
        if response.status_code == 200:
            signature = parse_note("x\n\n" + response.text).signatures[0]
            if not self.verifier().verify(parse_note(note).text, signature.signature):
                raise InvalidSignatureError("the witness's cosignature does not verify",
                                            key_name=signature.name)
            return signature
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {}
        origin = read_checkpoint(note).checkpoint.origin
        reason = str(error.get("reason") or error.get("message") or f"HTTP {response.status_code}")
        if response.status_code == 409:
            raise WitnessRefusedError(origin, reason, witness_size=error.get("witness_size"))
        if response.status_code == 403:
            raise InvalidSignatureError(reason)
        raise AuditError(f"witness answered {response.status_code}: {reason}")


def make_server(witness: Witness, *, socket: Path | None = None, port: int | None = None) -> uvicorn.Server:
    """A uvicorn server for the witness on a Unix socket or a port on 127.0.0.1 (never another address)."""
    if (socket is None) == (port is None):
        raise InvalidInputError("serve the witness on a socket or a port, not both", field="socket")
    app = create_app(witness)
    if socket is not None:
        config = uvicorn.Config(app, uds=str(socket), log_level="warning", lifespan="off")
    else:
        config = uvicorn.Config(app, host="127.0.0.1", port=port or 0, log_level="warning", lifespan="off")
    return uvicorn.Server(config)
