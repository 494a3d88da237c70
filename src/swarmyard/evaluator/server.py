"""The evaluator's HTTP API on its own Unix socket, and ``serve``: bind, protect, drop privileges, run.

    GET  /v1/health                        {"ok": true, "name": ...}
    GET  /v1/public-key                    {"name": ..., "public_key": base64 of the raw Ed25519 key}
    POST /v1/score?goal=G&split=search     body: the artifact bytes -> SignedScore JSON
    POST /v1/holdout?goal=G                body: the artifact -> SignedScore JSON, once per goal, else 409

Errors are the swarmyard JSON error body with its HTTP status. The socket is bound while still root, so it can
be given to the control plane's user (mode 0660, group of the evaluator), before the process drops to the
evaluator's own user; nothing else listens, so workers reach the evaluator only through the control plane.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from swarmyard.errors import EvaluatorError, InvalidInputError, PayloadTooLargeError, SwarmyardError
from swarmyard.evaluator.bundle import Bundle, load_bundle
from swarmyard.evaluator.identity import (
    EVAL_USER,
    Identity,
    current_identity,
    drop_privileges,
    ensure_system_user,
    protect_tree,
)
from swarmyard.evaluator.service import KEY_FILE, LEDGER_FILE, Evaluator, check_goal
from swarmyard.service_child import bind_socket

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

#: Modules that load lazily on the first request; imported while still root, since after the switch the
#: evaluator's user may not be able to read the interpreter's library folders.
#: What each query parameter may hold (the control plane's id and split patterns).
_QUERY_PATTERNS = {"goal": re.compile(r"[A-Za-z0-9_.:-]{1,200}"), "split": re.compile(r"[a-z_]{1,40}")}
_WARM_IMPORTS = ("anyio._backends._asyncio", "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.off",
                 "uvicorn.loops.asyncio", "h11", "email.utils", "concurrent.futures.thread", "sqlite3",
                 "encodings.idna", "starlette.formparsers")


def create_app(evaluator: Evaluator) -> Starlette:
    """The ASGI app answering for ``evaluator``."""

    async def read_artifact(request: Request) -> bytes:
        limit = evaluator.bundle.limits.max_artifact_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLargeError("artifact", int(declared), limit)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise PayloadTooLargeError("artifact", len(body), limit)
        return bytes(body)

    def query(request: Request, *allowed: str) -> dict[str, str]:
        # each parameter once, none unknown, each matching its pattern: the goal is written to the holdout
        # ledger and signed into the score, so it is an id like every other, never free text
        params = request.query_params
        for name in params:
            if name not in allowed:
                raise InvalidInputError(f"unknown query parameter {name[:40]!r}", field=name[:40])
            if len(params.getlist(name)) > 1:
                raise InvalidInputError(f"the {name} query parameter is given more than once", field=name)
        values = {"split": "search", **params}
        if "goal" not in values:
            raise InvalidInputError("the goal query parameter is required", field="goal")
        for name, value in values.items():
            if not _QUERY_PATTERNS[name].fullmatch(value):
                raise InvalidInputError(f"the {name} query parameter must match {_QUERY_PATTERNS[name].pattern}",
                                        field=name)
        return values

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "name": evaluator.bundle.name})

    async def public_key(request: Request) -> JSONResponse:
        return JSONResponse({"name": evaluator.bundle.name,
                             "public_key": base64.b64encode(evaluator.public_key).decode("ascii")})

    async def score(request: Request) -> JSONResponse:
        values = query(request, "goal", "split")
        goal, split = values["goal"], values["split"]
        artifact = await read_artifact(request)
        # scoring blocks for up to the bundle's timeout: keep it off the event loop
        signed = await anyio.to_thread.run_sync(evaluator.score, goal, artifact, split)
        return JSONResponse(signed.to_dict())

    async def holdout(request: Request) -> JSONResponse:
        goal = query(request, "goal")["goal"]
        artifact = await read_artifact(request)
        signed = await anyio.to_thread.run_sync(evaluator.final_holdout, goal, artifact)
        return JSONResponse(signed.to_dict())

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SwarmyardError)
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    routes = [Route("/v1/health", health), Route("/v1/public-key", public_key),
              Route("/v1/score", score, methods=["POST"]), Route("/v1/holdout", holdout, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={SwarmyardError: on_error})


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``serve`` needs: the bundle, the socket, the state folder and who may connect."""

    bundle: Path
    socket_path: Path
    state_dir: Path
    user: str = EVAL_USER
    socket_mode: int = 0o660
    #: the one goal to answer for (a run's own evaluator); ``None``: any goal
    goal: str | None = None
    #: stop when stdin reaches end of file: the parent holding its other end is gone, even killed with SIGKILL
    exit_with_stdin: bool = False


#: The evaluator's own copy of the bundle, inside its state folder.
BUNDLE_COPY = "bundle"
#: What the state folder may already hold; anything else means it is not ours to hand to another user.
_STATE_FILES = frozenset({KEY_FILE, LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm", "scratch",
                          BUNDLE_COPY, f".{BUNDLE_COPY}.new"})


def _check_state_dir(path: Path) -> None:
    # serve changes the owner of everything in it, so a mistyped --state (/, a home folder) must never pass
    if path.exists():
        if not path.is_dir():
            raise InvalidInputError(f"{path} is not a folder", field="state")
        strangers = sorted(entry.name for entry in path.iterdir() if entry.name not in _STATE_FILES)
        if strangers:
            raise InvalidInputError(f"{path} holds {strangers[0]!r}, which is not evaluator state: "
                                    "give an empty or evaluator-only folder", field="state")


def copy_bundle(source: Bundle, state_dir: Path) -> Path:
    """Copy the checked bundle into ``state_dir/bundle``, replacing an older copy; the source is only read.

    The copy is what the evaluator protects and scores from: the user's folder (a checkout, an example) keeps
    its owner and modes, and a later edit of it changes nothing until the next start.
    """
    target = state_dir / BUNDLE_COPY
    staging = state_dir / f".{BUNDLE_COPY}.new"
    shutil.rmtree(staging, ignore_errors=True)
    # load_bundle refused symbolic links, so nothing is followed out of the tree; modes are set by protect_tree
    shutil.copytree(source.root, staging, symlinks=True, copy_function=shutil.copyfile)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def prepare(options: ServeOptions) -> tuple[Bundle, socket.socket, Identity]:
    """Everything done with the starting user's rights: check the bundle, copy it into the state folder,
    protect the copy and the state, bind the socket. The bundle folder given is never changed."""
    source = load_bundle(options.bundle)
    _check_state_dir(options.state_dir)
    old_umask = os.umask(0o077)  # the copy is private from its first byte, before protect_tree makes it so
    try:
        options.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        copy = copy_bundle(source, options.state_dir)
    finally:
        os.umask(old_umask)
    me = current_identity()
    if me.uid == 0:
        runner = ensure_system_user(options.user)
        protect_tree(options.state_dir, runner)
    else:
        runner = me
        log.warning("not root: the evaluator runs as %s; only file modes (0700) protect the bundle", me.name)
        protect_tree(options.state_dir, None)
    bundle = load_bundle(copy)
    sock = bind_socket(options.socket_path, options.socket_mode, runner.gid, lambda path: EvaluatorError(
        f"another evaluator is already serving on {path}", socket=str(path)))
    for name in _WARM_IMPORTS:
        importlib.import_module(name)
    return bundle, sock, runner


def _check_reachable(runner: Identity, *paths: Path) -> None:
    for path in paths:
        if not os.access(path, os.R_OK | os.X_OK):
            raise EvaluatorError(f"user {runner.name} cannot reach {path}: its parent folders must be "
                                 "searchable by that user (o+x)", path=str(path))


def _exit_at_end_of_stdin(server: uvicorn.Server) -> None:
    # Blocks in its own thread, never on the event loop. Nothing is ever written to this pipe: end of file means
    # every holder of its write end (the run that started this evaluator) has exited, however it died.
    while os.read(0, 4096):
        pass
    log.warning("stdin closed: the process that started this evaluator is gone; stopping")
    server.should_exit = True


def serve(options: ServeOptions) -> None:
    """Run the evaluator until SIGINT/SIGTERM; prints one JSON line on stdout once the socket accepts."""
    import uvicorn

    if options.goal is not None:
        check_goal(options.goal)  # a bad --goal changes nothing: no copy, no owner change, no socket
    me_uid = os.getuid()
    bundle, sock, runner = prepare(options)
    with contextlib.closing(sock):
        if os.getuid() != runner.uid:
            drop_privileges(runner)
        _check_reachable(runner, bundle.root, options.state_dir)
        os.umask(0o077)  # everything the evaluator writes from here on is its own
        evaluator = Evaluator(bundle, options.state_dir, goal=options.goal)
        try:
            config = uvicorn.Config(create_app(evaluator), http="h11", ws="none", lifespan="off",
                                    loop="asyncio", log_config=None, access_log=False,
                                    timeout_graceful_shutdown=5)
            server = uvicorn.Server(config)
            ready = {"socket": str(options.socket_path), "name": bundle.name, "user": runner.name,
                     "uid": runner.uid, "own_user": runner.uid != me_uid, "goal": options.goal, "pid": os.getpid(), "public_key": base64.b64encode(evaluator.public_key).decode("ascii")}
            # the socket is already listening: clients that connect now wait in its backlog
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()
            if options.exit_with_stdin:
                threading.Thread(target=_exit_at_end_of_stdin, args=(server,), name="parent-watch",
                                 daemon=True).start()
            server.run(sockets=[sock])
        finally:
            evaluator.close()
