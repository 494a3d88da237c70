"""``swarmyard machines`` on the host: one long-lived ``Boxd`` client that every command of the CLI talks to.

A command of the CLI lasts one call, and a machine lives as long as the client that made it. So the first
``swarmyard machines new`` starts ``swarmyard machines serve`` in the background: a ``Boxd`` client (its own
embedded plane and broker) that holds the machines between commands, until ``swarmyard machines stop`` or until it
has had no machine for ``idle_s``. It listens on a Unix socket in ``<machines root>/cli/`` (a folder of this user's,
0700, as :func:`~swarmyard.machines.supervised.open_root` checks), and asks every call for the bearer token in the
file beside it (created 0600): only this user's commands reach it.

It serves the ``/v1/machines`` routes a coordinator machine's ``Boxd()`` speaks (see :mod:`swarmyard.boxd._spawn`),
with the same JSON, so one client (:class:`~swarmyard.boxd._remote.RemoteMachines`) serves the CLI on the host and
inside a coordinator machine. The rules are the client's: the service sees only the machines its client made (a
script's own ``Boxd()`` is another client: neither sees the other's), its ``max_machines`` and ``spawn_cap`` hold,
and a coordinator it made (``--spawn``) names its machines in its own namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swarmyard.boxd._models import Machine
from swarmyard.boxd._remote import RemoteMachines
from swarmyard.errors import InvalidInputError, InvalidTokenError, SwarmyardError, UserError
from swarmyard.jsondepth import check_nesting
from swarmyard.plane.limits import read_limited

log = logging.getLogger(__name__)

#: The largest body a command sends (an upload): 64 MiB, as a coordinator's.
MAX_BODY_BYTES = 64 << 20
#: How long a service with no machine stays up before it stops by itself.
IDLE_S = 600.0
#: How long ``new`` waits for a service it started to listen (it prepares the sandbox's view of the host once).
START_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class Place:
    """Where the service of a machines root listens: its socket, token, start lock and log."""

    folder: Path

    @classmethod
    def of(cls, root: Path | None) -> Place:
        """The service's folder under the machines root (made 0700 if missing)."""
        from swarmyard.machines.supervised import open_root

        folder = open_root(root) / "cli"
        folder.mkdir(mode=0o700, exist_ok=True)
        return cls(folder)

    @property
    def socket(self) -> Path:
        return self.folder / "machines.sock"

    @property
    def token(self) -> Path:
        return self.folder / "token"

    @property
    def log(self) -> Path:
        return self.folder / "serve.log"

    def listening(self) -> bool:
        """Whether a service answers on the socket (a socket file a killed service left does not)."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.socket))
        except OSError:
            return False
        finally:
            probe.close()
        return True


def client(root: Path | None, *, start: bool) -> RemoteMachines | None:
    """The machines of this root's service; with ``start``, a service is started when none listens (``None``
    when none listens and ``start`` is false: no service, no machines)."""
    place = Place.of(root)
    if not place.listening():
        if not start:
            return None
        _start(place, root)
    try:
        token = place.token.read_text().strip()
    except OSError as exc:
        raise UserError(f"the machines service's token {place.token} cannot be read: {exc.strerror}") from exc
    return RemoteMachines("http://machines", token, transport=httpx.HTTPTransport(uds=str(place.socket)),
                          may_spawn=True)


def _start(place: Place, root: Path | None) -> None:
    """Start the service in the background and return once it listens; one at a time (a lock file)."""
    with open(place.folder / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if place.listening() or _starting(place):
            return  # another command started it meanwhile, or one started by hand is coming up
        read_end, write_end = os.pipe()
        argv = [sys.executable, "-m", "swarmyard.cli", "machines", "serve", "--ready-fd", str(write_end)]
        if root is not None:
            argv += ["--root", str(root)]
        with open(place.log, "ab") as out:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=(write_end,),
                                     start_new_session=True)  # not in the terminal's group: Ctrl-C there spares it
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            said = ready.readline()  # a line once it listens; end of file if it died first
        if said.strip() != b"ready":
            child.wait()
            if _starting(place):
                return  # one started by hand took the root first: it serves
            tail = place.log.read_bytes()[-1500:].decode("utf-8", "replace")
            raise UserError(f"the machines service did not start (exit {child.returncode}): {tail.strip()}")


def _starting(place: Place) -> bool:
    """Whether a service that holds the root (its serve lock) listens, once it does (``swarmyard machines serve``
    started by hand a moment ago); ``False`` when none holds it, or the one that did let go (it stopped)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if place.listening():
            return True
        with open(place.folder / "serve.lock", "w") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                return False
        time.sleep(0.1)  # another process's progress: there is nothing to wait on but its socket
    raise UserError(f"the machines service of {place.folder} holds its lock but did not listen within "
                    f"{START_TIMEOUT_S:.0f} s (see {place.log})")


def serve(root: Path | None, *, ready_fd: int | None = None, idle_s: float = IDLE_S, providers: Path | None = None,
          model: str | None = None, max_machines: int = 128, spawn_cap: int = 8) -> None:
    """Serve this root's machines until ``stop``, a signal, or ``idle_s`` without a machine."""
    import uvicorn

    from swarmyard.boxd._client import Boxd

    place = Place.of(root)
    with open(place.folder / "serve.lock", "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"a machines service already serves {place.folder}") from None
        boxd = Boxd(root=root, providers=providers, model=model, max_machines=max_machines, spawn_cap=spawn_cap)
        token = secrets.token_urlsafe(32)
        with contextlib.suppress(FileNotFoundError):
            place.token.unlink()
        fd = os.open(place.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # born 0600, never chmod-ed after
        with os.fdopen(fd, "w") as out:
            out.write(token)
        with contextlib.suppress(FileNotFoundError):
            place.socket.unlink()  # a killed service's (we hold the serve lock: none listens on it)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(place.socket))
        os.chmod(place.socket, 0o600)
        listener.listen(128)
        server = uvicorn.Server(uvicorn.Config(_app(boxd, token, lambda: _stop(server)), log_level="warning",
                                               timeout_graceful_shutdown=5))
        idle = threading.Thread(target=_idle_watch, args=(boxd, server, idle_s), daemon=True, name="machines-idle")
        idle.start()
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
        try:
            server.run(sockets=[listener])
        finally:
            for path in (place.socket, place.token):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            boxd.close()


def _stop(server: Any) -> None:
    server.should_exit = True


def _idle_watch(boxd: Any, server: Any, idle_s: float) -> None:
    """Stop the server once it has had no machine for ``idle_s`` (a service nobody uses does not stay for good)."""
    empty_since: float | None = None
    while not server.should_exit:
        now = time.monotonic()
        if boxd.machines.list():
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= idle_s:
            log.info("no machine for %.0f s: the machines service stops", idle_s)
            server.should_exit = True
            return
        time.sleep(min(5.0, idle_s / 4))


def _app(boxd: Any, token: str, stop: Callable[[], None]) -> Starlette:
    machines = boxd.machines

    def handler(work: Callable[[Request, dict[str, Any]], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
                if not secrets.compare_digest(given.encode(), token.encode()):
                    raise InvalidTokenError("not the machines service's token")
                raw = await read_limited(request.stream(), request.headers.get("content-length"), MAX_BODY_BYTES)
                check_nesting(raw)
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise InvalidInputError("the body must be a JSON object", field="body")
                answer = await asyncio.to_thread(work, request, body)
            except SwarmyardError as exc:
                return JSONResponse(exc.to_dict(), status_code=exc.status)
            except (ValueError, TypeError) as exc:
                error = InvalidInputError(f"bad request: {exc}")
                return JSONResponse(error.to_dict(), status_code=error.status)
            return JSONResponse(answer)

        return endpoint

    def create(request: Request, body: dict[str, Any]) -> Any:
        spawn = body.get("spawn", False)
        if not isinstance(spawn, bool):
            raise InvalidInputError("spawn must be true or false", field="spawn")
        return _json(machines.create(_opt_str(body, "name"), networks=_opt_names(body), spawn=spawn,
                                     from_snapshot=_opt_str(body, "from_snapshot")))

    def named(request: Request) -> str:
        return str(request.path_params["machine"])

    def execute(request: Request, body: dict[str, Any]) -> Any:
        env = body.get("env")
        if env is not None and not isinstance(env, dict):
            raise InvalidInputError("env must be an object", field="env")
        result = machines.exec(named(request), body.get("command"), env=env, cwd=_opt_str(body, "cwd"),
                               timeout=body.get("timeout"), stdin=_opt_b64(body, "stdin_b64"))
        return {"stdout_b64": base64.b64encode(result.stdout_raw).decode(),
                "stderr_b64": base64.b64encode(result.stderr_raw).decode(), "exit_code": result.exit_code,
                "timed_out": result.timed_out, "duration_s": result.duration_s, "truncated": result.truncated}

    def delete(request: Request, body: dict[str, Any]) -> Any:
        machines.delete(named(request))
        return {"deleted": named(request)}

    def upload(request: Request, body: dict[str, Any]) -> Any:
        data = _opt_b64(body, "data_b64") or b""
        return {"written": machines.files.upload(named(request), _opt_str(body, "path") or "", data)}

    def download(request: Request, body: dict[str, Any]) -> Any:
        data = machines.files.download(named(request), _opt_str(body, "path") or "")
        return {"data_b64": base64.b64encode(data).decode()}

    def stopping(request: Request, body: dict[str, Any]) -> Any:
        stop()  # the machines are deleted as the service ends (Boxd.close)
        return {"stopping": True}

    at = "/v1/machines/{machine}"
    return Starlette(routes=[
        Route("/v1/machines", handler(create), methods=["POST"]),
        Route("/v1/machines", handler(lambda r, b: [_json(m) for m in machines.list()]), methods=["GET"]),
        Route(at, handler(lambda r, b: _json(machines.get(named(r)))), methods=["GET"]),
        Route(at, handler(delete), methods=["DELETE"]),
        Route(f"{at}/wait", handler(lambda r, b: _json(machines.wait_until_ready(
            named(r), b.get("timeout", 180.0)))), methods=["POST"]),
        Route(f"{at}/exec", handler(execute), methods=["POST"]),
        Route(f"{at}/fork", handler(lambda r, b: _json(machines.fork(named(r), _opt_str(b, "new_name")))),
              methods=["POST"]),
        Route(f"{at}/upload", handler(upload), methods=["POST"]),
        Route(f"{at}/download", handler(download), methods=["POST"]),
        Route("/v1/service/stop", handler(stopping), methods=["POST"]),
    ])


def _json(record: Machine) -> dict[str, Any]:
    """A machine as the routes of a coordinator send it (see ``swarmyard.boxd._spawn``)."""
    data = asdict(record)
    data["created_at"] = record.created_at.timestamp()
    return data


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{key} must be a string", field=key)
    return value


def _opt_names(body: dict[str, Any]) -> Sequence[str] | None:
    value = body.get("networks")
    if value is not None and not isinstance(value, list):
        raise InvalidInputError("networks must be a list of names", field="networks")
    return value


def _opt_b64(body: dict[str, Any], key: str) -> bytes | None:
    value = _opt_str(body, key)
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidInputError(f"{key} must be base64", field=key) from None


def stop(root: Path | None) -> bool:
    """Stop the root's service (its machines are deleted as it ends); ``False`` when none was running."""
    place = Place.of(root)
    machines = client(root, start=False)
    if machines is None:
        return False
    try:
        machines._call("POST", "/v1/service/stop")
    finally:
        machines.close()
    with open(place.folder / "serve.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # held by the service until its machines are gone
    return True
