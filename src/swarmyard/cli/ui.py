"""``swarmyard ui RUN_FOLDER``: a run's dashboard, read-only, from its folder, until Ctrl-C or SIGTERM.

The page is the live one's (workers under their slot names, trajectories, tasks, board, findings, timeline, errors
and open holds), served on loopback with nothing but the dashboard's routes: no operator action can change the run.
The operator token goes where the run's own did (beside its secrets, outside the run folder), signed with the run's
token secret, so a page signed in to the live run stays signed in.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from swarmyard.cli import render

#: How long the operator token of a finished run's dashboard holds.
TOKEN_TTL_S = 30 * 86400.0


def serve_run(run_dir: Path, host: str, port: int, names: tuple[str, ...], lead: str) -> None:
    """Serve ``run_dir``'s dashboard read-only on ``host``: ``port`` if free, else any (0: any); ``lead`` starts
    the line that says where. Returns on SIGTERM or Ctrl-C."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.errors import UserError
    from swarmyard.plane.run_view import FinishedRun, bind_dashboard, serve_finished
    from swarmyard.plane.server import is_loopback
    from swarmyard.secret_files import write_secret_file
    from swarmyard.swarm.run_secrets import TOKEN_SECRET, run_secrets

    if not is_loopback(host):
        raise UserError(f"--host {host} is beyond loopback: a run's dashboard is served on loopback only")
    run = FinishedRun.open(run_dir)
    try:
        secrets = run_secrets(run.run_id)
        tokens = TokenAuthority(load_or_create_secret(secrets / TOKEN_SECRET), run.store)
        token_file = secrets / "operator-token"
        token_file.unlink(missing_ok=True)  # the live run's expires with its deadline: a fresh one
        write_secret_file(token_file, tokens.issue_operator(ttl_s=TOKEN_TTL_S).encode())
        tcp = bind_dashboard(host, port)
        shown = f"[{host}]" if ":" in host else host
        # From the line that says where on, SIGTERM stops it cleanly: one that comes before the server's own
        # handlers are in place is kept for it (it ended the process with signal 15, not the exit status).
        stopped = threading.Event()
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set()) if main else None
        render.stderr.print(f"{lead} on http://{shown}:{tcp.getsockname()[1]}/ui, read-only (operator token in "
                            f"{token_file}): press Ctrl-C to stop it", highlight=False, markup=False)
        try:
            with contextlib.suppress(KeyboardInterrupt):  # stopping a dashboard is no failure
                serve_finished(run, tokens, host, tcp, names, stopped)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        run.close()


def command(
    run_folder: Annotated[Path, typer.Argument(help="The run's folder (runs/RUN).")],
    host: Annotated[str, typer.Option("--host", help="The loopback address to serve it on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="The TCP port (0: any free one).")] = 0,
    ui_host: Annotated[list[str] | None, typer.Option(
        "--ui-host", help="A name (NAME or NAME:PORT) by which browsers may open the dashboard, beside the address "
        "it listens on (repeatable); any other Host is refused (421).")] = None,
) -> None:
    """Open a run's dashboard, read-only, from its folder: the live page's workers, trajectories, timeline (bounded
    by the run), errors and holds. Serves until Ctrl-C or SIGTERM; the URL and token file go to stderr."""
    serve_run(run_folder, host, port, tuple(ui_host or ()), f"run {run_folder.name}: its dashboard")
