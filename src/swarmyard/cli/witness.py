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
    key: Annotated[Path, typer.Option("--key", help="Ed25519 key file (made 0600 if absent).")],
    state: Annotated[Path, typer.Option("--state", help="File of the last cosigned checkpoints.")],
    socket: Annotated[Path | None, typer.Option("--socket", help="Listen on this Unix socket.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Listen on this port of 127.0.0.1.")] = None,
    name: Annotated[str, typer.Option("--name", help="The witness's key name.")] = "swarmyard-witness",
    log: Annotated[list[str] | None, typer.Option("--log", help="A log verifier key to trust.")] = None,
    pin_first: Annotated[bool, typer.Option("--pin-first/--known-only",
                                            help="Pin the key an unknown log offers on first use.")] = True,
) -> None:
    """Serve the witness until interrupted."""
    from swarmyard.audit.note import Verifier
    from swarmyard.audit.witness import Witness, make_server
    from swarmyard.errors import InvalidInputError

    if (socket is None) == (port is None):  # before the key file is made: a refused setup changes nothing
        raise InvalidInputError("give one of --socket PATH or --port N", field="socket")
    logs = [Verifier.parse(v) for v in log or []]
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
) -> None:
    """Print the last checkpoint the witness cosigned for ORIGIN (for `audit verify --witness-checkpoint`)."""
    from swarmyard.errors import NotFoundError, UserError

    if (state is None) == (witness is None):
        raise UserError("give one of --state FILE or --witness ADDRESS")
    if state is not None:
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
