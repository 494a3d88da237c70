"""``swarmyard worker list|revoke``: a goal's workers, from the store or a running plane (``--server``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption, StoreOption, store_at
from swarmyard.cli.target import operator_request, path_id

app = typer.Typer(help="List and revoke workers (capability tokens).", no_args_is_help=True)

_Server = typer.Option(None, "--server", envvar="SWARMYARD_SERVER",
                       help="A running control plane (socket path, URL, or replicas' URLs separated by "
                            "commas); uses its operator API.")
_TokenFile = typer.Option(Path("operator-token"), "--operator-token-file",
                          envvar="SWARMYARD_OPERATOR_TOKEN_FILE",
                          help="The operator token written by `swarmyard serve`.")
_COLUMNS = ["id", "group", "revoked", "expires_at"]


def _operator(server: str, token_file: Path, method: str, path: str) -> dict[str, Any]:
    return operator_request(server, token_file, method, path)


def _print(workers: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        render.print_json(workers)
    else:
        rows = [[w["id"], w["group"], w["revoked"], w["expires_at"]] for w in workers]
        render.print_table(None, _COLUMNS, rows)


@app.command(name="list")
def list_(goal_id: str = typer.Argument(..., help="The goal whose workers to list."),
          store: str = StoreOption, server: str | None = _Server,
          operator_token_file: Path = _TokenFile, as_json: bool = JsonOption) -> None:
    """List a goal's workers."""
    if server:
        path = f"/v1/operator/goals/{path_id('goal_id', goal_id)}/workers"
        workers = _operator(server, operator_token_file, "GET", path)["workers"]
    else:
        from swarmyard.plane.models import WorkerView

        s = store_at(store)
        s.get_goal(goal_id)
        workers = [WorkerView.of(w).model_dump(mode="json") for w in s.list_workers(goal_id)]
    _print(workers, as_json)


@app.command()
def revoke(worker_id: str = typer.Argument(..., help="The worker whose token to revoke."),
           store: str = StoreOption, server: str | None = _Server,
           operator_token_file: Path = _TokenFile, as_json: bool = JsonOption) -> None:
    """Revoke a worker's token: its next tool or model call is refused."""
    if server:
        path = f"/v1/operator/workers/{path_id('worker_id', worker_id)}/revoke"
        workers = _operator(server, operator_token_file, "POST", path)["workers"]
    else:
        from swarmyard.plane.models import WorkerView

        worker = store_at(store).revoke_worker(worker_id)
        workers = [WorkerView.of(worker).model_dump(mode="json")]
    _print(workers, as_json)
