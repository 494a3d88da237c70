"""``swarmyard goal create|list|show``."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption, ServerOption, StoreOption, TokenFileOption
from swarmyard.cli.target import target_at
from swarmyard.domain import Goal, GoalSpec
from swarmyard.money import format_usd, usd_to_micro

app = typer.Typer(help="Create and inspect goals.", no_args_is_help=True)


def _row(goal: Goal) -> list[object]:
    env = goal.envelope
    return [goal.id, goal.policy, format_usd(goal.budget_micro_usd), format_usd(env.settled), format_usd(env.reserved),
            f"{env.calls}/{goal.call_cap}", goal.objective[:60]]


_COLUMNS = ["id", "policy", "budget", "spent", "held", "calls", "objective"]


@app.command()
def create(
    objective: str = typer.Argument(..., help="What the swarm should achieve."),
    budget_usd: str = typer.Option(..., "--budget-usd", help="Budget ceiling in USD, e.g. 2.50."),
    call_cap: int = typer.Option(..., "--call-cap", min=0, help="Most model calls for the whole goal."),
    deadline_s: float | None = typer.Option(None, "--deadline-s", min=0, help="Seconds from now."),
    max_depth: int = typer.Option(2, "--max-depth", min=0, help="Deepest delegation allowed."),
    policy: str = typer.Option("team", "--policy", help="independent, team, explore or groups."),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a goal."""
    import time

    s = target_at(store, server, token_file)
    goal = s.create_goal(GoalSpec(objective, usd_to_micro(budget_usd), call_cap,
                                  None if deadline_s is None else time.time() + deadline_s, max_depth, policy))
    if as_json:
        render.print_json(goal)
    else:
        render.stdout.print(goal.id)


@app.command(name="list")
def list_(store: str = StoreOption, server: str | None = ServerOption,
         token_file: Path = TokenFileOption, as_json: bool = JsonOption) -> None:
    """List goals."""
    goals = target_at(store, server, token_file).list_goals()
    if as_json:
        render.print_json(goals)
    else:
        render.print_table(None, _COLUMNS, [_row(g) for g in goals])


@app.command()
def show(goal_id: str, store: str = StoreOption, server: str | None = ServerOption,
         token_file: Path = TokenFileOption, as_json: bool = JsonOption) -> None:
    """Show one goal."""
    goal = target_at(store, server, token_file).get_goal(goal_id)
    if as_json:
        render.print_json(goal)
    else:
        render.print_table(None, _COLUMNS, [_row(goal)])
