"""A bundle holding a FIFO, socket or other non-regular file is refused when the swarm file is parsed, as a
config error on evaluator.bundle, before any run folder exists (a FIFO used to fail the run's copy of the
bundle with an internal error after the run had started)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # a short path: a socket's path must fit in 108 bytes
    return short_tmp


def _make_fifo(path: Path) -> None:
    os.mkfifo(path)


def _make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


@pytest.mark.parametrize("make", [_make_fifo, _make_socket], ids=["fifo", "socket"])
def test_a_bundle_with_a_special_file_stops_before_a_run_folder(folder: Path, make: object) -> None:
    shutil.copytree(ROOT / "examples" / "bundles" / "sort-numbers", folder / "bund")
    assert callable(make)
    make(folder / "bund" / "search" / "odd")
    base = (ROOT / "examples" / "three-scouts.toml").read_text().split("# The same file")[0]
    shutil.copytree(ROOT / "examples" / "three-scouts", folder / "three-scouts")  # the sources its lenses name
    (folder / "s.toml").write_text(base + '\n[evaluator]\nbundle = "bund"\n')
    done = subprocess.run(["swarmyard", "run", "s.toml"], cwd=folder, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1, done.stderr[-800:]
    assert "config_error" in done.stderr and "evaluator.bundle" in done.stderr, done.stderr[-800:]
    assert "search/odd" in done.stderr
    assert not (folder / "runs").exists()
