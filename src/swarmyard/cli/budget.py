"""``swarmyard budget show|reconcile``."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption, ServerOption, StoreOption, TokenFileOption
from swarmyard.cli.target import target_at
from swarmyard.errors import UserError
from swarmyard.money import format_usd

app = typer.Typer(help="Inspect envelopes and settle reservations.", no_args_is_help=True)


@app.command()
def show(goal_id: str, store: str = StoreOption, server: str | None = ServerOption,
         token_file: Path = TokenFileOption, as_json: bool = JsonOption) -> None:
    """Show a goal's envelope, its tasks' envelopes and its open reservations."""
    s = target_at(store, server, token_file)
    goal = s.get_goal(goal_id)
    tasks = s.list_tasks(goal_id)
    reservations = s.list_reservations(goal_id)
    if as_json:
        render.print_json({"goal": goal.envelope, "available": goal.envelope.available,
                           "tasks": {t.id: t.envelope for t in tasks}, "reservations": reservations})
        return
    rows = [["goal " + goal.id, format_usd(goal.envelope.limit), format_usd(goal.envelope.reserved),
             format_usd(goal.envelope.settled), format_usd(goal.envelope.available),
             f"{goal.envelope.calls}/{goal.envelope.call_cap}"]]
    rows += [["task " + t.id, format_usd(t.envelope.limit), format_usd(t.envelope.reserved),
              format_usd(t.envelope.settled), format_usd(t.envelope.available),
              f"{t.envelope.calls}/{t.envelope.call_cap or '-'}"] for t in tasks]
    render.print_table("envelopes", ["envelope", "limit", "held", "spent", "available", "calls"], rows)
    open_ = [r for r in reservations if r.state.value in ("held", "unknown")]
    if open_:
        render.print_table("open reservations", ["id", "state", "task", "model", "held"],
                           [[r.id, r.state.value, r.task_id, r.model, format_usd(r.amount)] for r in open_])


@app.command()
def reconcile(
    reservation_id: str,
    actual: int | None = typer.Option(None, "--actual", min=0, help="The real cost in micro-USD."),
    release: bool = typer.Option(False, "--release", help="Nothing was spent: drop the hold."),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Settle an open reservation (``unknown``, or ``held`` by a broker that died) at its real cost, or release it."""
    if (actual is None) == (not release):
        raise UserError("give exactly one of --actual N or --release")
    r = target_at(store, server, token_file).reconcile(reservation_id, None if release else actual)
    if as_json:
        render.print_json(r)
    else:
        render.stdout.print(f"{r.id} {r.state.value} actual={format_usd(r.actual or 0)}")
