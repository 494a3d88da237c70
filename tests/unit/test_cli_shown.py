"""What the CLI prints of a worker's or a model's words: no control character reaches the terminal."""

from __future__ import annotations

import pytest

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


def test_a_tables_cells_are_text_not_markup_and_an_errors_message_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker's '[link=...]' in a cell became an OSC 8 link on a terminal, its '[/x]' a MarkupError (an internal
    # error of runs show and board read); an error line printed ESC as it was.
    import io

    from rich.console import Console

    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(render, "stdout", Console(file=out, force_terminal=True, width=200))
    monkeypatch.setattr(render, "stderr", Console(file=err, force_terminal=True, width=200))
    cells = ["[link=https://evil.example/m]docs[/link] [blink]now[/blink]", "fix [/x] now"]
    render.print_table(None, ["title", "body"], [cells])
    assert "evil.example" in out.getvalue() and "\x1b]8" not in out.getvalue() and "\x1b[5m" not in out.getvalue()
    assert "[/x]" in out.getvalue() and "[blink]" in out.getvalue()
    render.print_error("config_error", "folder \x1b[2J\x1b]0;pwned\x07 \x9b31mRED \u202eevil")
    assert "\x1b[2J" not in err.getvalue() and "\x1b]0" not in err.getvalue() and "\x9b" not in err.getvalue()
    assert "\u202e" not in err.getvalue() and "\ufffd[2J" in err.getvalue()


def test_bidirectional_controls_are_shown_as_replacement_characters() -> None:
    # a line shown reordered (U+202E ...) is not the line the store holds
    for control in ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
                    "\u200e", "\u200f", "\u061c"):
        assert render.shown(f"a{control}b") == "a\ufffdb"
    assert render.shown("שלום and مرحبا") == "שלום and مرحبا"  # right-to-left words themselves are kept
