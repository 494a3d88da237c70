"""``swarmyard evaluator serve|verify|keygen``: run the isolated evaluator and check its signed scores."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Annotated

import typer

from swarmyard.cli import render
from swarmyard.errors import InvalidInputError

app = typer.Typer(help="The isolated evaluator: signed scores and a one-shot holdout.", no_args_is_help=True)


@app.command()
def serve(
    bundle: Annotated[Path, typer.Argument(help="The bundle folder (evaluator.toml, search/, holdout/).")],
    socket_path: Annotated[Path, typer.Option("--socket", help="The Unix socket to listen on.")],
    state: Annotated[Path, typer.Option("--state", help="The evaluator's state folder.")],
    user: Annotated[str, typer.Option("--user", help="The system user to run as when started as root.")] = (
        "swarmyard-eval"),
    goal: Annotated[str | None, typer.Option(
        "--goal", help="Answer for this goal only (the holdout's one-shot key); any goal if not given.")] = None,
    exit_with_stdin: Annotated[bool, typer.Option(
        "--exit-with-stdin", help="Stop when stdin ends: the process that started this one is gone.")] = False,
) -> None:
    """Serve BUNDLE on a Unix socket as the evaluator's own user; prints one JSON line once ready.

    BUNDLE is only read: it is copied into STATE, and the copy is what is protected and scored from.
    """
    from swarmyard.evaluator.server import ServeOptions
    from swarmyard.evaluator.server import serve as run_server

    run_server(ServeOptions(bundle=bundle, socket_path=socket_path, state_dir=state, user=user, goal=goal,
                           exit_with_stdin=exit_with_stdin))


def _read_public_key(value: str) -> bytes:
    """A public key given as base64 text, or a path to a file holding base64 text or the raw 32 bytes."""
    path = Path(value)
    raw: bytes = path.read_bytes() if path.is_file() else value.encode()
    if len(raw) == 32 and path.is_file():
        return raw
    try:
        decoded = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError("the public key is neither base64 nor a key file",
                                field="public_key") from exc
    if len(decoded) != 32:
        raise InvalidInputError("an Ed25519 public key is 32 bytes", field="public_key")
    return decoded


@app.command()
def verify(
    score_file: Annotated[Path, typer.Argument(help="A signed score as JSON ('-' for stdin).")],
    public_key: Annotated[str, typer.Option("--public-key", help="base64 key, or a file holding it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check a signed score against the evaluator's public key; exit 1 if it does not verify."""
    from swarmyard.evaluator.score import SignedScore, verify_score

    text = typer.get_text_stream("stdin").read() if str(score_file) == "-" else score_file.read_text()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f"{score_file} is not JSON", field="score") from exc
    score = SignedScore.from_dict(data)
    valid = verify_score(score, _read_public_key(public_key))
    if as_json:
        render.print_json({"valid": valid, **score.to_dict()})
    elif valid:
        columns = ["goal", "split", "score", "artifact_sha256", "issued_at", "valid"]
        row = [score.goal, score.split, score.score, score.artifact_sha256, score.issued_at, "yes"]
        render.print_table(None, columns, [row])
    else:
        render.stderr.print("[red]invalid[/red]: the signature does not match this score and key")
    if not valid:
        raise typer.Exit(1)


@app.command()
def keygen(
    state: Annotated[Path, typer.Option("--state", help="The evaluator's state folder.")],
) -> None:
    """Create the evaluator's signing key in STATE if absent and print its public key (base64)."""
    from swarmyard.evaluator.service import KEY_FILE
    from swarmyard.secret_files import load_or_create_ed25519, public_bytes

    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = load_or_create_ed25519(state / KEY_FILE)
    typer.echo(base64.b64encode(public_bytes(key)).decode("ascii"))
