"""``swarmyard families list|generate``: the task families and their seeded instances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from swarmyard.cli import render

app = typer.Typer(help="Task families: seeded task instances with their evaluator bundles.", no_args_is_help=True)


@app.command("list")
def list_families(as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """The families a seed can be generated for."""
    from swarmyard.families import FAMILIES

    names = sorted(FAMILIES)
    print(json.dumps({"families": names}) if as_json else "\n".join(names))


@app.command()
def generate(
    name: Annotated[str, typer.Argument(help="The family: reconciliation, polyomino or code.")],
    out: Annotated[Path, typer.Argument(help="A new (or empty) folder to write the instance into.")],
    seed: Annotated[int, typer.Option("--seed", help="The instance's seed: the same seed, the same instance.")],
) -> None:
    """Write the instance of NAME for SEED into OUT: tasks.toml, inputs/ and the evaluator bundle in bundle/."""
    from swarmyard.families import generate as write

    folder = write(name, seed, out)
    render.stderr.print(f"wrote {name} seed {seed} to {folder} (tasks.toml, inputs/, bundle/)", highlight=False)
