"""What the CLI prints of a worker's or a model's words: no control character reaches the terminal."""

from __future__ import annotations

from swarmyard.cli import render


def test_escape_sequences_and_carriage_returns_are_not_printed_as_they_are() -> None:
    forged = "- \x1b[2J\x1b[H\x1b[32mALL CLEAR\x1b[0m\rcovered\x85 [fnd_a]\n- next\tline"
    said = render.shown(forged)
    assert "\x1b" not in said and "\r" not in said and "\x85" not in said
    assert said == "- \ufffd[2J\ufffd[H\ufffd[32mALL CLEAR\ufffd[0m\ufffdcovered\ufffd [fnd_a]\n- next\tline"
    assert render.shown("plain words, é and 漢字") == "plain words, é and 漢字"
