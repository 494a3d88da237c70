"""The live table of ``swarmyard run``: its columns and one row per worker slot."""

from __future__ import annotations

from rich.console import Console

from swarmyard.cli.run import WorkerSpanPrinter
from swarmyard.swarm.coordinator import ProgressRow


def test_live_table_shows_every_column() -> None:
    printer = WorkerSpanPrinter(quiet=False, live=False)
    printer.progress([ProgressRow("worker-0", "risks", "running", 2, 1234, 4_500, "direction: beam"),
                      ProgressRow("lead", "synthesis", "submitted", 1, 90, 0, "")])
    console = Console(width=160, record=True)
    console.print(printer.table())
    text = console.export_text()
    for needle in (*WorkerSpanPrinter.COLUMNS, "worker-0", "running", "1234", "$0.004500", "direction: beam",
                   "synthesis"):
        assert needle in text
