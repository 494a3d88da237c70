"""``swarmyard run SWARM.toml [--resume RUN] [--quiet] [--sandbox local|process]``: run one swarm."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from swarmyard.cli import render
from swarmyard.config import SandboxKind, load_config
from swarmyard.money import format_usd
from swarmyard.report.data import WorkerSpan


class WorkerSpanPrinter:
    """Progress on stderr: a rich live table on a terminal, else plain lines; nothing with ``--quiet``."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.rows: dict[str, list[str]] = {}
        self.live: Any = None
        if not quiet and sys.stderr.isatty():
            from rich.live import Live

            self.live = Live(self._table(), console=render.stderr, refresh_per_second=4)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title="swarm")
        for column in ("worker", "task", "state", "steps"):
            table.add_column(column)
        for row in self.rows.values():
            table.add_row(*row)
        return table

    def __call__(self, span: WorkerSpan) -> None:
        """Show one finished agent run."""
        if self.quiet:
            return
        row = [span.row, span.task_id or "-", span.ending, str(span.steps)]
        self.rows[span.row] = row
        if self.live is not None:
            self.live.update(self._table())
        else:
            render.stderr.print(f"{span.row} {span.ending} task={span.task_id or '-'} steps={span.steps} "
                                f"({span.ended_at - span.started_at:.1f} s)", highlight=False)


def command(
    swarm_file: Annotated[Path, typer.Argument(help="The swarm file (TOML).")],
    resume: Annotated[str | None, typer.Option("--resume", help="Continue run RUN from the store.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress; only the synthesis.")] = False,
    sandbox: Annotated[SandboxKind | None, typer.Option(
        "--sandbox", help="Machine backend: local (default) or process (no isolation).")] = None,
) -> None:
    """Run a swarm file to its synthesis: print it, then time, calls, tokens and spend."""
    from swarmyard.swarm.swarm import Swarm

    config = load_config(swarm_file)  # a bad file stops here: ConfigError names the field, exit 1
    if sandbox is SandboxKind.PROCESS:
        render.stderr.print("[yellow]warning[/yellow]: --sandbox process runs agents without isolation",
                            markup=True)
    printer = WorkerSpanPrinter(quiet)
    live = printer.live
    if live is not None:
        live.start()
    try:
        result = Swarm(config, sandbox=sandbox).run(resume=resume, on_span=printer)
    finally:
        if live is not None:
            live.stop()
    data = result.data
    print(data.synthesis.body if data.synthesis else "(no synthesis was written)")
    if not quiet:
        tokens = data.input_tokens + data.output_tokens
        where = result.report.html if result.report else "-"
        render.stderr.print(f"run {result.run_id}: {data.wall_s:.1f} s, {data.calls} calls, {tokens} tokens, "
                            f"{format_usd(data.spent_micro_usd)}; report {where}",
                            highlight=False)
