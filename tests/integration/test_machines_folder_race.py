"""A process killed while it makes a machine folder (between the mkdir and the owner file) leaves a folder the
next backend on the root can still tell is dead: it is made under a name saying whose it is, then renamed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swarmyard.machines.local import LocalBackend
from swarmyard.machines.pids import start_time

pytestmark = [pytest.mark.bwrap]


def test_a_folder_half_made_by_a_dead_process_is_reaped_and_a_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "m").mkdir(parents=True)
    dead = root / "m" / ".slot_dead.999999999.12345"  # no such pid: its maker is gone
    live = root / "m" / f".slot_live.{os.getpid()}.{start_time(os.getpid())}"  # being made by this process
    for folder in (dead, live):
        folder.mkdir()
        (folder / "disk").mkdir()
    backend = LocalBackend(root, parked=0)
    try:
        assert not dead.exists() and live.exists()
        folder = backend.make_folder("m_made")  # what make_folder leaves: the final name only, with its owner
        assert folder.name == "m_made" and (folder / "owner").read_text().split()[0] == str(os.getpid())
        assert sorted(p.name for p in (root / "m").iterdir()) == [live.name, "m_made"]
    finally:
        backend.close()
