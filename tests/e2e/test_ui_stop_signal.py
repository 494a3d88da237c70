"""A run's dashboard stops cleanly on SIGTERM from the line that says where it is on.

``swarmyard ui RUN_FOLDER`` and ``swarmyard run --ui`` (once its run has ended) print where the dashboard is
and 'press Ctrl-C to stop it', then start the server, whose handlers make SIGTERM a clean stop (exit 0 for
``ui``, the run's own status for ``run --ui``). A supervisor that sent SIGTERM as soon as it read that line
(it stops the dashboard of a run it no longer needs) found the process killed by the signal (status -15, 143 in
a shell): the handlers were installed only once the event loop ran, after the line. Each case here sends
SIGTERM the moment the line is read.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm

pytestmark = [
    pytest.mark.bwrap,
]

SWARMYARD = Path(sys.executable).with_name("swarmyard")


@pytest.fixture(scope="module")
def folder() -> Iterator[tuple[Path, dict[str, str]]]:
    path = Path(tempfile.mkdtemp(prefix="sy-uis-"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(path), "LANG": "C.UTF-8"}
    scripted_swarm(path, agent="builtin", replies="replies.json")
    (path / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [tool_call("submit_finding", title="market", body="Large and growing.")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go: the market is large.")],
    }))
    yield path, env
    shutil.rmtree(path, ignore_errors=True)


def _stopped_at_the_line(command: list[str], env: dict[str, str], cwd: Path, line_has: str) -> int:
    """Start ``command``, send SIGTERM as soon as a stderr line holds ``line_has``, return its exit status."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line_has in line:
                proc.send_signal(signal.SIGTERM)
                break
        assert any(line_has in line for line in seen), "".join(seen)[-3000:]
        return proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_right_after_the_line_ends_run_ui_with_the_run_s_status(
        folder: tuple[Path, dict[str, str]]) -> None:
    path, env = folder
    status = _stopped_at_the_line([str(SWARMYARD), "run", str(path / "conf" / "swarm.toml"), "--ui"], env, path,
                                  "the run has ended; its dashboard stays")
    assert status == 0  # the run wrote its synthesis


def test_sigterm_right_after_the_line_ends_swarmyard_ui_with_status_0(folder: tuple[Path, dict[str, str]]) -> None:
    path, env = folder
    # The module's first test leaves its run in the shared folder; run alone (or on another pytest-xdist worker,
    # which makes the module's folder afresh) this one has no runs folder yet and makes a run of its own first.
    runs = sorted((path / "runs").glob("*"))
    if not runs:
        done = subprocess.run([str(SWARMYARD), "run", str(path / "conf" / "swarm.toml")], cwd=path, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs = sorted((path / "runs").iterdir())
    statuses = [_stopped_at_the_line([str(SWARMYARD), "ui", str(runs[0])], env, path, "press Ctrl-C to stop it")
                for _ in range(5)]
    assert statuses == [0] * 5
