"""Output for the CLI: data on stdout (tables, or JSON with ``--json``), errors as one line on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from enum import Enum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from swarmyard.errors import SwarmyardError


class _State:
    debug: bool = False


state = _State()
# Off a terminal rich would wrap tables at 80 columns; data piped to a file reads better unwrapped.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, soft_wrap=True)


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, tuples and bytes as plain JSON values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=True) + "\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a table on stdout."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    stdout.print(table)


def run_app(app: Callable[..., Any]) -> None:
    """Call a Typer app, turning swarmyard errors into one line and exit code 1."""
    try:
        app(standalone_mode=False)
    except SwarmyardError as exc:
        if state.debug:
            raise
        stderr.print(f"[red]error[/red] ({exc.code}): {exc.message}", highlight=False, markup=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(130) from None
    except Exception as exc:  # click's usage errors
        import click

        if isinstance(exc, click.exceptions.UsageError):
            exc.show()
            raise SystemExit(2) from None
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise
