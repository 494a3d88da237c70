"""Entry point: builds the ``swarmyard <noun> <verb>`` app from a table of noun modules."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from swarmyard.cli import render

#: noun -> module exposing ``app`` (a Typer sub-app) or ``command`` (a single command for the noun).
NOUNS: dict[str, str] = {
    "goal": "swarmyard.cli.goal",
    "task": "swarmyard.cli.task",
    "board": "swarmyard.cli.board",
    "budget": "swarmyard.cli.budget",
    "bench": "swarmyard.cli.bench",
    "broker": "swarmyard.cli.broker",
    "evaluator": "swarmyard.cli.evaluator",
    "audit": "swarmyard.cli.audit",
    "witness": "swarmyard.cli.witness",
    "machines": "swarmyard.cli.machines",
    "run": "swarmyard.cli.run",
    "runs": "swarmyard.cli.runs",
    "ui": "swarmyard.cli.ui",
    "campaign": "swarmyard.cli.campaign",
    "serve": "swarmyard.cli.serve",
    "worker": "swarmyard.cli.worker",
    "certs": "swarmyard.cli.certs",
    "mcp": "swarmyard.cli.mcp",
    "families": "swarmyard.cli.families",
}

app = typer.Typer(
    name="swarmyard",
    help="Fan one problem out to a swarm of sandboxed LLM agents, safely, cheaply and measurably.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
) -> None:
    render.state.debug = debug
    # a log line may carry a worker's words (an agent's stderr, why a task failed): printed as `shown` prints them
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(render.ShownFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


def _register() -> None:
    for noun, path in NOUNS.items():
        module = importlib.import_module(path)
        sub = getattr(module, "app", None)
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=noun)
        else:
            app.command(name=noun)(module.command)


_register()


def main() -> None:
    """Run the CLI: exit 0 ok, 1 a swarmyard error or a failed check (one line), 2 usage, 130 Ctrl-C."""
    render.run_app(app)
