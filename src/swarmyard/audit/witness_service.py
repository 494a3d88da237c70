"""``swarmyard witness serve --home DIR``: the witness on a home of its own, as its own user when started as root.

Everything that needs the starting user's rights is done first: the system user ``swarmyard-witness`` is made
if missing, the home's folders are made and handed to it (``swarmyard.audit.witness_home``), the socket is bound
(mode 0660, the starting user's, the witness's group) and the modules a request loads are imported. Then the
process drops to the witness's user for good and only then reads or makes its key, so the key file is the
witness's from its first byte and the control plane's user (root's in ``swarmyard run``, ``swarmyard-plane``
under ``swarmyard serve``) holds no right to it. One JSON line on stdout says it is ready.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from swarmyard.audit.note import Verifier
from swarmyard.audit.witness import Witness, create_app
from swarmyard.audit.witness_home import WitnessHome
from swarmyard.errors import AuditError
from swarmyard.identity import WITNESS_USER, current_identity, drop_privileges, ensure_system_user
from swarmyard.service_child import bind_socket

log = logging.getLogger(__name__)

#: Modules a request loads lazily: imported while still root, since the witness's user may not be able to read
#: the interpreter's library folders (a root-only prefix such as /root/.pyenv).
_WARM_IMPORTS = ("anyio._backends._asyncio", "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.off",
                 "uvicorn.loops.asyncio", "h11", "email.utils", "concurrent.futures.thread", "encodings.idna",
                 "starlette.concurrency", "starlette.formparsers")
DEFAULT_NAME = "swarmyard-witness"


@dataclass(frozen=True, slots=True)
class WitnessServeOptions:
    """What ``serve_home`` needs."""

    home: Path
    socket_path: Path
    name: str = DEFAULT_NAME
    user: str = WITNESS_USER
    socket_mode: int = 0o660
    logs: Sequence[Verifier] = field(default_factory=tuple)
    trust_on_first_use: bool = True
    #: stop when stdin reaches end of file: the run that started this witness is gone, even killed by SIGKILL
    exit_with_stdin: bool = False


def _exit_at_end_of_stdin(server: uvicorn.Server) -> None:
    # nothing is written to this pipe: end of file means the run that started this witness has exited
    while os.read(0, 4096):
        pass
    log.warning("stdin closed: the process that started this witness is gone; stopping")
    server.should_exit = True


def serve_home(options: WitnessServeOptions) -> None:
    """Serve the witness of ``options.home`` on its socket until SIGINT/SIGTERM (or the end of stdin)."""
    me = current_identity()
    runner = ensure_system_user(options.user, error=AuditError) if me.uid == 0 else me
    home = WitnessHome(options.home)
    home.prepare(runner if me.uid == 0 else None)
    sock = bind_socket(options.socket_path, options.socket_mode, runner.gid,
                       lambda path: AuditError(f"another witness is already serving on {path}"))
    with contextlib.closing(sock):
        for name in _WARM_IMPORTS:
            importlib.import_module(name)
        if me.uid != runner.uid:
            drop_privileges(runner, error=AuditError)
        os.umask(0o077)  # the key and the state are the witness's own from their first byte
        witness = Witness.from_home(options.name, home, logs=options.logs,
                                    trust_on_first_use=options.trust_on_first_use)
        config = uvicorn.Config(create_app(witness), http="h11", ws="none", lifespan="off", loop="asyncio",
                                log_config=None, access_log=False, timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        ready = {"socket": str(options.socket_path), "vkey": witness.verifier().vkey, "user": runner.name,
                 "uid": runner.uid, "own_user": runner.uid != me.uid, "home": str(options.home), "pid": os.getpid()}
        sys.stdout.write(json.dumps(ready) + "\n")  # the socket already listens: early clients wait in its backlog
        sys.stdout.flush()
        if options.exit_with_stdin:
            threading.Thread(target=_exit_at_end_of_stdin, args=(server,), name="parent-watch", daemon=True).start()
        server.run(sockets=[sock])
