"""``swarmyard campaign``'s progress on stderr: plain lines off a terminal, a rich bar over the trials' lines on one
(rendered to a console that says it is a terminal), nothing with ``--quiet``. The clock is injected."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from swarmyard.campaign.record import TrialRecord
from swarmyard.cli import campaign, render


def _events(total: int) -> list[Any]:
    out: list[Any] = []
    for i in range(total):
        trial = SimpleNamespace(cell=SimpleNamespace(name="team-4"), seed=i + 1)
        record = TrialRecord(f"team-4#{i + 1}", "team-4", i + 1, f"run_{i}", 7 + i, 1_500, 3, 100, 20, 2.5, None, 1,
                             True)
        out += [SimpleNamespace(trial=trial, done=i, total=total, record=None, skipped=False),
                SimpleNamespace(trial=trial, done=i + 1, total=total, record=record, skipped=False)]
    return out


def _console(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(render, "stderr", Console(file=out, force_terminal=terminal, width=120))
    return out


def test_off_a_terminal_each_trial_is_a_plain_line(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _console(monkeypatch, terminal=False)
    now = [100.0]
    progress = campaign.TrialProgress(2, clock=lambda: now[0])
    assert progress.bar is None
    for event in _events(2):
        now[0] += 65
        progress(event)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "[0/2] 1:05 elapsed, $0.000000 spent: running team-4 seed 1",
        "[1/2] 2:10 elapsed, $0.001500 spent: team-4 seed 1 scored 7 (3 calls, 120 tokens, 2.5 s)",
        "[1/2] 3:15 elapsed, $0.001500 spent: running team-4 seed 2",
        "[2/2] 4:20 elapsed, $0.003000 spent: team-4 seed 2 scored 8 (3 calls, 120 tokens, 2.5 s)",
    ]


def test_on_a_terminal_a_bar_shows_the_trial_running_and_goes_after_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _console(monkeypatch, terminal=True)
    progress = campaign.TrialProgress(2, clock=lambda: 0.0)
    assert progress.bar is not None
    events = _events(2)
    progress(events[0])
    progress.bar.refresh()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "trials" in plain and "0/2" in plain and "running team-4 seed 1" in plain
    for event in events[1:]:
        progress(event)
    assert progress.bar is None  # closed by the last trial's end
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "team-4 seed 1 scored 7" in plain and "team-4 seed 2 scored 8" in plain
    assert ": running team-4" not in plain  # a trial's start is the bar's, not a line


def test_quiet_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _console(monkeypatch, terminal=True)
    progress = campaign.TrialProgress(2, quiet=True)
    assert progress.bar is None
    for event in _events(2):
        progress(event)
    assert out.getvalue() == ""
