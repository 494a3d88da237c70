"""Each family's generated bundle scores a known-good and a known-bad artifact in the real scoring sandbox
(bubblewrap), on the search split and once on the holdout; the reconciliation bundle also through a real
``swarmyard evaluator serve`` process and its client."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.clock import FakeClock
from swarmyard.errors import HoldoutUsedError
from swarmyard.evaluator.bundle import load_bundle
from swarmyard.evaluator.client import EvaluatorClient
from swarmyard.evaluator.score import verify_score
from swarmyard.evaluator.service import Evaluator
from swarmyard.families import code, generate, polyomino, reconciliation

pytestmark = [pytest.mark.bwrap]

FULL = 1_000_000


def _artifacts(name: str, seed: int, folder: Path) -> tuple[bytes, bytes]:
    """(known-good, known-bad) artifacts of an instance."""
    if name == "reconciliation":
        truth = reconciliation.answer(seed)
        # the bad one names the first three right and twelve consistent records
        consistent = sorted(set(json.loads((folder / "bundle/holdout/truth.json").read_text())["universe"])
                            - set(truth))[:12]
        return "\n".join(truth).encode(), "\n".join(truth[:3] + consistent).encode()
    if name == "polyomino":
        return polyomino.solution(seed).encode(), b"I could not pack them.\n"
    return code.reference_solution(seed).encode(), (folder / "inputs/repo/solution.py").read_bytes()


@pytest.mark.parametrize("name", ["reconciliation", "polyomino", "code"])
def test_a_family_bundle_scores_good_and_bad_artifacts_in_the_sandbox(tmp_path: Path, name: str) -> None:
    folder = generate(name, 11, tmp_path / "instance")
    good, bad = _artifacts(name, 11, folder)
    ev = Evaluator(load_bundle(folder / "bundle"), tmp_path / "state", clock=FakeClock())
    searched_good, searched_bad = ev.score("goal_a", good), ev.score("goal_a", bad)
    assert searched_good.score == FULL and verify_score(searched_good, ev.public_key)
    assert searched_bad.score < FULL // 2
    held = ev.final_holdout("goal_a", good)
    assert (held.split, held.score) == ("holdout", FULL)
    with pytest.raises(HoldoutUsedError):
        ev.final_holdout("goal_a", bad)
    other = ev.final_holdout("goal_b", bad)
    assert other.score < FULL // 2


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A folder every user can search: serve drops to its own user, which must reach the bundle to copy it."""
    root = Path(tempfile.mkdtemp(prefix="sy-fam-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="serve's user switch needs root")
def test_the_shipped_reconciliation_bundle_through_evaluator_serve(open_root: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "reconciliation" / "seed-1"
    shutil.copytree(shipped / "bundle", open_root / "bundle")
    argv = [sys.executable, "-m", "swarmyard.cli", "evaluator", "serve", str(open_root / "bundle"),
            "--socket", str(open_root / "eval.sock"), "--state", str(open_root / "state")]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "serve did not become ready"
        assert json.loads(proc.stdout.readline())["socket"]
        truth = reconciliation.answer(1)
        with EvaluatorClient(open_root / "eval.sock") as client:
            assert client.score("goal_r", "\n".join(truth).encode()).score == FULL
            assert client.score("goal_r", b"TX-00000 and nothing else").score == 0
            assert client.final_holdout("goal_r", "\n".join(truth[:10]).encode()).score == 2 * 10 * FULL // 25
            with pytest.raises(HoldoutUsedError):
                client.final_holdout("goal_r", "\n".join(truth).encode())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
