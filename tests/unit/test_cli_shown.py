"""What the CLI prints of a worker's or a model's words: no control character reaches the terminal."""

from __future__ import annotations

from swarmyard.cli import render


def test_escape_sequences_and_carriage_returns_are_not_printed_as_they_are() -> None:
    forged = "- \x1b[2J\x1b[H\x1b[32mALL CLEAR\x1b[0m\rcovered\x85 [fnd_a]\n- next\tline"
    said = render.shown(forged)
    assert "\x1b" not in said and "\r" not in said and "\x85" not in said
    assert said == "- \ufffd[2J\ufffd[H\ufffd[32mALL CLEAR\ufffd[0m\ufffdcovered\ufffd [fnd_a]\n- next\tline"
    assert render.shown("plain words, é and 漢字") == "plain words, é and 漢字"


def test_a_log_line_a_progress_line_and_a_live_table_show_a_workers_escape_sequences() -> None:
    import logging

    from rich.console import Console

    from swarmyard.cli.run import WorkerSpanPrinter, summary_line
    from swarmyard.swarm.coordinator import ProgressRow, ProgressSummary

    forged = "\x1b[2J\x1b]0;pwned\x07\x1b[32mALL CLEAR\x1b[0m"
    said = "\ufffd[2J\ufffd]0;pwned\ufffd\ufffd[32mALL CLEAR\ufffd[0m"
    record = logging.LogRecord("swarmyard.swarm.coordinator", logging.WARNING, __file__, 1,
                               "task %s failed: %s", ("a", forged), None)
    line = render.ShownFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == f"WARNING swarmyard.swarm.coordinator: task a failed: {said}"
    summary = ProgressSummary(0, 1, 1, 2, 0, 0, 61.0, errors=(("worker-0", "x", forged),))
    assert summary_line(summary).endswith(f"; errors: worker-0 x: {said}")
    printer = WorkerSpanPrinter(quiet=False, live=False)
    printer.progress([ProgressRow("worker-0", "a", "running", 1, 10, 0, forged)])
    console = Console(width=200, record=True)
    console.print(printer.table())
    text = console.export_text()
    assert "\x1b" not in text and f"{said[:60]}" in text
