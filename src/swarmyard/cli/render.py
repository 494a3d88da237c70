"""Output for the CLI: data on stdout (tables, or JSON with ``--json``), errors as one line on stderr."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from enum import Enum
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from swarmyard.controls import shown as shown  # what the CLI prints of a worker's or a model's words
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


class ShownFormatter(logging.Formatter):
    """Log lines as ``shown`` prints them: a log line's arguments may be a worker's words (an agent's stderr, a
    task's failure), and its ESC sequences would reach the terminal as they are."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


def print_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=True) + "\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a table on stdout."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        # Text, not str: rich reads a str cell as markup, and a worker's '[link=...]' became an OSC 8 link on the
        # terminal (its '[/x]' a MarkupError)
        table.add_row(*(Text("" if cell is None else shown(str(cell))) for cell in row))
    stdout.print(table)


def print_error(code: str, message: str) -> None:
    """One line on stderr: ``error (code): message``; the message is text, never markup (it may hold ``[...]``)."""
    stderr.print(f"[red]error[/red] ({code}): {escape(shown(message))}", highlight=False, markup=True)


def _click_classes() -> tuple[type[Exception], type[Exception]]:
    """The ``ClickException`` and ``Abort`` of the click that typer runs on.

    Recent typer releases carry their own copy of click (``typer._click``) and older ones use click itself;
    typer's public ``BadParameter`` and ``Abort`` are the right classes in both.
    """
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return click_error, typer.Abort


def exit_code(app: Callable[..., Any], args: Sequence[str] | None = None) -> int:
    """Call a Typer app and say how the process should exit: 0 ok, 1 a swarmyard error or a failed check
    (one line on stderr; the traceback with ``--debug``), 2 usage, 130 Ctrl-C."""
    click_error, abort = _click_classes()
    try:
        # Not standalone: click would turn KeyboardInterrupt into exit 1 and print rich boxes for our errors.
        result = app(args=args, standalone_mode=False)
    except SwarmyardError as exc:
        if state.debug:
            traceback.print_exc()
        else:
            print_error(exc.code, exc.message)
        return 1
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:  # a library's own exit (uvicorn exits 3 when it cannot bind): ours are 0, 1, 2, 130
        if exc.code is None or exc.code in (0, 1, 2, 130):
            return int(exc.code or 0)
        if not isinstance(exc.code, int):
            print_error("exit", str(exc.code))
        return 1
    except abort as exc:
        # click raises Abort from the KeyboardInterrupt it caught; any other abort (a declined prompt) failed
        interrupted = isinstance(exc.__cause__, KeyboardInterrupt)
        if not interrupted:
            stderr.print("aborted", highlight=False)
        return 130 if interrupted else 1
    except click_error as exc:
        exc.show()  # type: ignore[attr-defined]  # every ClickException has show() and exit_code
        code: int = exc.exit_code  # type: ignore[attr-defined]
        return code
    except Exception as exc:  # a bug, not a refusal: still one line and exit 1 unless --debug asks for more
        if state.debug:
            traceback.print_exc()
        else:
            print_error("internal", f"{type(exc).__name__}: {exc} (--debug shows the traceback)")
        return 1
    # Outside standalone mode click returns the code of an explicit ``typer.Exit`` instead of exiting with it,
    # and a command's own return value (always None here) otherwise.
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def run_app(app: Callable[..., Any], args: Sequence[str] | None = None) -> NoReturn:
    """Run a Typer app and exit the process with ``exit_code``'s answer."""
    raise SystemExit(exit_code(app, args))
