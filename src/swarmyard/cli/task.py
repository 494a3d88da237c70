"""``swarmyard task list|create|complete``."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption, ServerOption, StoreOption, TokenFileOption, store_at
from swarmyard.cli.target import operator_request, path_id, target_at
from swarmyard.domain import TaskSpec, TaskState
from swarmyard.money import format_usd, usd_to_micro

app = typer.Typer(help="Create and inspect tasks.", no_args_is_help=True)


@app.command(name="list")
def list_(
    goal_id: str,
    state: TaskState | None = typer.Option(None, "--state"),
    group: str | None = typer.Option(None, "--group"),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """List a goal's tasks."""
    target = target_at(store, server, token_file)
    target.get_goal(goal_id)  # an unknown goal is an error, not an empty list
    tasks = target.list_tasks(goal_id, state=state, group=group)
    if as_json:
        render.print_json(tasks)
        return
    render.print_table(None, ["id", "state", "group", "depth", "worker", "token", "budget", "spent", "calls", "title"],
                       [[t.id, t.state.value, t.group, t.depth, t.worker_id, t.fencing_token,
                         format_usd(t.envelope.limit), format_usd(t.envelope.settled), t.envelope.calls, t.title[:50]]
                        for t in tasks])


@app.command()
def create(
    goal_id: str,
    title: str,
    prompt: str = typer.Option("", "--prompt"),
    group: str = typer.Option("main", "--group"),
    budget_usd: str = typer.Option("0", "--budget-usd"),
    call_cap: int = typer.Option(0, "--call-cap", min=0, help="0: only the goal's cap applies."),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
) -> None:
    """Create a top-level task, its envelope carved from the goal's."""
    task = target_at(store, server, token_file).create_task(goal_id, TaskSpec(title, prompt, group, usd_to_micro(budget_usd), call_cap))
    render.stdout.print(task.id)


@app.command()
def complete(
    task_id: str = typer.Argument(..., help="The task to complete; it must have a finding."),
    store: str = StoreOption,
    server: str | None = ServerOption,
    token_file: Path = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Complete a task that has a finding, as a run's coordinator does (a `serve` has none): under its claim,
    or taken back and closed when its lease ran out. A done task stays done and is answered already_done."""
    if server:
        path = f"/v1/operator/tasks/{path_id('task_id', task_id)}/complete"
        answer = operator_request(server, token_file, "POST", path, body={})
        outcome, state = str(answer["outcome"]), str(answer["task"]["state"])
    else:
        from swarmyard.plane.completion import OPERATOR, complete_task

        opened = store_at(store)
        try:
            done, task = complete_task(opened, task_id, OPERATOR)
        finally:
            opened.close()
        outcome, state = done.value, task.state.value
        answer = {"outcome": outcome, "task": render.to_jsonable(task)}
    if as_json:
        render.print_json(answer)
        return
    render.stdout.print(f"{task_id} {outcome} ({state})", highlight=False)
