"""``swarmyard witness serve|checkpoint``: run the witness that cosigns audit-log checkpoints, and read the last
one it cosigned for a log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from swarmyard.cli import render

app = typer.Typer(help="The witness that cosigns audit checkpoints.", no_args_is_help=True)


@app.command("serve")
def serve(
    home: Annotated[Path | None, typer.Option(
        "--home", help="The witness's home: its key and state private, its key and cosigned checkpoints published "
                       "for `audit verify` (default: the host's; started as root, handed to --user).")] = None,
    key: Annotated[Path | None, typer.Option("--key", help="Ed25519 key file (made 0600 if absent), without "
                                                           "--home.")] = None,
    state: Annotated[Path | None, typer.Option("--state", help="File of the last cosigned checkpoints, without "
                                                               "--home.")] = None,
    socket: Annotated[Path | None, typer.Option("--socket", help="Listen on this Unix socket.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Listen on this port of 127.0.0.1.")] = None,
    name: Annotated[str, typer.Option("--name", help="The witness's key name.")] = "swarmyard-witness",
    log: Annotated[list[str] | None, typer.Option("--log", help="A log verifier key to trust.")] = None,
    pin_first: Annotated[bool, typer.Option("--pin-first/--known-only",
                                            help="Pin the key an unknown log offers on first use.")] = True,
    user: Annotated[str, typer.Option("--user", help="With --home, started as root: the system user to run as "
                                                     "(made if missing).")] = "swarmyard-witness",
    socket_mode: Annotated[str, typer.Option("--socket-mode", help="With --home: the socket's mode (octal); 0660 "
                                             "lets the starting user and the witness's group in.")] = "0660",
    exit_with_stdin: Annotated[bool, typer.Option(
        "--exit-with-stdin", help="Stop when stdin ends: the process that started this one is gone.")] = False,
) -> None:
    """Serve the witness until interrupted.

    With --home (or neither --key nor --state) it serves a home on --socket, as its own user when started as
    root, and prints one JSON line once ready; `swarmyard run` starts one this way for every run.
    """
    from swarmyard.audit.note import Verifier
    from swarmyard.audit.witness import Witness, make_server
    from swarmyard.errors import InvalidInputError, UserError

    if (socket is None) == (port is None):  # before the key file is made: a refused setup changes nothing
        raise InvalidInputError("give one of --socket PATH or --port N", field="socket")
    logs = [Verifier.parse(v) for v in log or []]
    if key is None and state is None:
        from swarmyard.audit.witness_home import default_home
        from swarmyard.audit.witness_service import WitnessServeOptions, serve_home

        if socket is None:
            raise UserError("a witness home is served on a --socket")
        try:
            mode = int(socket_mode, 8)
        except ValueError:
            raise UserError(f"--socket-mode {socket_mode!r} is not an octal mode") from None
        serve_home(WitnessServeOptions(home=home or default_home(), socket_path=socket, name=name, user=user,
                                       socket_mode=mode, logs=logs, trust_on_first_use=pin_first,
                                       exit_with_stdin=exit_with_stdin))
        return
    if home is not None or key is None or state is None:
        raise UserError("give --home, or both --key and --state")
    witness = Witness.from_files(name, key, state, logs=logs,
                                 trust_on_first_use=pin_first)
    server = make_server(witness, socket=socket, port=port)
    where = socket or f"127.0.0.1:{port}"
    render.stderr.print(f"witness {witness.verifier().vkey} on {where}", highlight=False, markup=False)
    server.run()


@app.command("checkpoint")
def checkpoint(
    origin: Annotated[str, typer.Argument(help="The log's origin (its key's name, e.g. swarmyard.run/<id>).")],
    state: Annotated[Path | None, typer.Option("--state", help="Read the witness's state file.")] = None,
    witness: Annotated[str | None, typer.Option("--witness", help="Ask a running witness (URL or socket).")] = None,
    home: Annotated[Path | None, typer.Option("--home", help="Read what a witness home published (the one "
                                                             "`swarmyard run` uses: see `audit verify`).")] = None,
) -> None:
    """Print the last checkpoint the witness cosigned for ORIGIN (for `audit verify --witness-checkpoint`)."""
    from swarmyard.errors import NotFoundError, UserError

    if sum(given is not None for given in (state, witness, home)) != 1:
        raise UserError("give one of --state FILE, --witness ADDRESS or --home DIR")
    if home is not None:
        from swarmyard.audit.witness_home import WitnessHome

        published = WitnessHome(home).published(origin)
        if published is None:
            raise NotFoundError("log", origin)
        note = published
    elif state is not None:
        from swarmyard.audit.witness import WitnessState

        if not state.is_file():
            raise UserError(f"{state}: no witness state file")
        known = WitnessState(state).get(origin)
        if known is None or known.checkpoint is None:
            raise NotFoundError("log", origin)
        note = known.checkpoint
    else:
        from swarmyard.audit.witness import HttpWitnessClient

        assert witness is not None
        client = HttpWitnessClient.at(witness)
        try:
            note = client.latest(origin)
        finally:
            client.close()
    typer.echo(note, nl=False)  # byte for byte: a signed note must not be rewrapped
