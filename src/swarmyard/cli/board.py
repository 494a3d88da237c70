"""``swarmyard board read``."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption, ServerOption, StoreOption, TokenFileOption
from swarmyard.cli.target import target_at
from swarmyard.domain import PostKind

app = typer.Typer(help="Read a goal's board.", no_args_is_help=True)


@app.command()
def read(
    goal_id: str,
    after: int = typer.Option(0, "--after", min=0, help="Cursor: the last sequence number already read."),
    limit: int = typer.Option(100, "--limit", min=1),
    group: str | None = typer.Option(None, "--group"),
    kind: list[PostKind] | None = typer.Option(None, "--kind"),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Read posts after a cursor."""
    posts = target_at(store, server, token_file).read_board(goal_id, after=after, limit=limit, group=group, kinds=kind)
    if as_json:
        render.print_json(posts)
        return
    render.print_table(None, ["seq", "kind", "group", "author", "body"],
                       [[p.seq, p.kind.value, p.group, p.author, p.body[:100]] for p in posts])
