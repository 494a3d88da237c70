"""The keys row of a run's table: a keyless run's 0 is not shown as if a key had been looked for."""

from __future__ import annotations

from swarmyard.report.figures import RunFigures

ROW = "provider keys found in sandboxes"


def _figures(keys_found: int | None, keys_held: bool) -> RunFigures:
    return RunFigures("run", None, 1.0, 1.0, 1, 0, 0, 0, 0, 0, keys_found, keys_held=keys_held)


def test_the_keys_row_says_what_was_looked_for() -> None:
    assert dict(_figures(0, keys_held=False).rows())[ROW] == "0 (no key held)"
    assert dict(_figures(0, keys_held=True).rows())[ROW] == "0"
    assert dict(_figures(2, keys_held=True).rows())[ROW] == "2"
    assert dict(_figures(None, keys_held=False).rows())[ROW] == "not scanned"
    assert _figures(0, keys_held=False).to_dict()["keys_held"] is False
