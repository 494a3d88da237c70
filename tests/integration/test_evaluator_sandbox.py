"""The evaluator in-process with real bubblewrap: scores, isolation, limits, and the one-shot holdout."""

from __future__ import annotations

import secrets
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from swarmyard.clock import FakeClock
from swarmyard.errors import (
    HoldoutUsedError,
    InvalidInputError,
    PayloadTooLargeError,
    ScoringError,
    ScoringLimitError,
)
from swarmyard.evaluator.bundle import load_bundle
from swarmyard.evaluator.score import verify_score
from swarmyard.evaluator.service import Evaluator

pytestmark = pytest.mark.bwrap

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
GOOD_SORT = b"import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"


def make_bundle(root: Path, script: str, **limits: int) -> Path:
    """A bundle whose scoring entry is ``script``; each split holds a ``which`` file naming itself."""
    limits = {"timeout_s": 10, "cpu_s": 5, "memory_mib": 256, **limits}
    root.mkdir(parents=True)
    lines = "\n".join(f"{k} = {v}" for k, v in limits.items())
    manifest = f"name = 'probe'\n[scoring]\nentry = 'score.py'\n[limits]\n{lines}\n"
    (root / "evaluator.toml").write_text(manifest)
    (root / "score.py").write_text(textwrap.dedent(script))
    for split in ("search", "holdout"):
        (root / split).mkdir()
        (root / split / "which").write_text(split)
    return root


def evaluator(root: Path, state: Path, clock: FakeClock | None = None) -> Evaluator:
    return Evaluator(load_bundle(root), state, clock=clock or FakeClock())


def test_the_example_bundle_scores_and_signs(tmp_path: Path, clock: FakeClock) -> None:
    ev = evaluator(EXAMPLE, tmp_path / "state", clock)
    good = ev.score("goal_a", GOOD_SORT)
    bad = ev.score("goal_a", b"print('nope')\n")
    assert (good.score, bad.score) == (5, 0)
    assert good.split == "search"
    assert good.issued_at == int(clock.now() * 1000)
    assert verify_score(good, ev.public_key)
    assert (tmp_path / "state" / "evaluator.key").stat().st_mode & 0o777 == 0o600


ISOLATION_PROBE = """
    import os, socket, sys
    problems = 0
    if open(sys.argv[2] + "/which").read() != "search":
        problems |= 1                                   # the wrong split is mounted
    if sorted(os.listdir("/eval")) != ["artifact", "data", "score.py"]:
        problems |= 2                                   # anything else of the bundle is visible
    if os.path.exists(BUNDLE) or os.path.exists(BUNDLE + "/holdout/which"):
        problems |= 4                                   # the host's bundle folder is reachable
    if os.environ.get("SWARMYARD_TEST_SECRET") is not None or "PYTEST_CURRENT_TEST" in os.environ:
        problems |= 8                                   # the evaluator's environment leaked in
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=1)
        problems |= 16                                  # the host's network is reachable
    except OSError:
        pass
    try:
        open(sys.argv[1], "ab")
        problems |= 32                                  # the artifact is writable
    except OSError:
        pass
    try:
        open("/usr/probe-write", "w")
        problems |= 64                                  # system folders are writable
    except OSError:
        pass
    open("/tmp/scratch", "w").write("tmp is writable")
    print(problems)
"""


def test_the_sandbox_sees_only_the_artifact_and_the_search_split(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMYARD_TEST_SECRET", "sk-should-never-leak")
    root = tmp_path / "bundle"
    with socket.create_server(("127.0.0.1", 0)) as listener:  # reachable from the host, not the sandbox
        port = listener.getsockname()[1]
        header = f"BUNDLE = {str(root.resolve())!r}\nPORT = {port}\n"
        make_bundle(root, header + textwrap.dedent(ISOLATION_PROBE))
        assert evaluator(root, tmp_path / "state").score("goal_a", b"artifact").score == 0


def test_a_cpu_loop_is_killed_with_a_typed_error(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", "while True:\n    pass\n", cpu_s=1, timeout_s=20)
    started = time.monotonic()
    with pytest.raises(ScoringLimitError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.limit == "cpu_time"
    assert time.monotonic() - started < 15


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # the process ended while we looked
    return found


def test_a_hung_script_hits_the_wall_clock_and_leaves_no_process(tmp_path: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**9):09d}"  # a sleep length unique to this test
    script = f"""
        import os, subprocess
        subprocess.Popen(["/usr/bin/sleep", "{marker}"])        # a grandchild must die too
        os.execv("/usr/bin/sleep", ["/usr/bin/sleep", "{marker}"])
    """
    root = make_bundle(tmp_path / "b", script, timeout_s=1, cpu_s=5)
    started = time.monotonic()
    with pytest.raises(ScoringLimitError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.limit == "wall_time"
    assert time.monotonic() - started < 8
    # SIGKILL reaches the sandbox through --die-with-parent and the PID namespace; the kernel finishes
    # tearing the processes down asynchronously, so allow it a bounded moment
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []


def test_allocating_too_much_is_a_memory_limit_error(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", "data = bytearray(1 << 30)\nprint(len(data))\n", memory_mib=128)
    with pytest.raises(ScoringLimitError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.limit == "memory"


def test_a_flood_of_output_is_cut_off(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", "import sys\nwhile True:\n    sys.stdout.write('9' * 65536)\n",
                       max_output_bytes=1024)
    with pytest.raises(ScoringLimitError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.limit == "output"


def test_a_failing_script_does_not_leak_its_stderr(tmp_path: Path) -> None:
    script = "import sys\nsys.stderr.write(open(sys.argv[2] + '/which').read() + ' SECRET')\nsys.exit(3)\n"
    root = make_bundle(tmp_path / "b", script)
    with pytest.raises(ScoringError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.reason == "exit_status"
    assert "SECRET" not in str(caught.value.to_dict())


@pytest.mark.parametrize("output", ["", "3.5", "seven", "1\n2"])
def test_output_that_is_not_one_integer_is_refused(tmp_path: Path, output: str) -> None:
    root = make_bundle(tmp_path / "b", f"print({output!r})\n")
    with pytest.raises(ScoringError) as caught:
        evaluator(root, tmp_path / "state").score("goal_a", b"x")
    assert caught.value.reason == "bad_output"


def test_bad_input_is_refused_before_anything_runs(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", "print(1)\n", max_artifact_bytes=10)
    ev = evaluator(root, tmp_path / "state")
    with pytest.raises(InvalidInputError) as bad_goal:
        ev.score("not a goal!", b"x")
    assert bad_goal.value.field == "goal"
    with pytest.raises(InvalidInputError) as bad_split:
        ev.score("goal_a", b"x", split="holdout")
    assert bad_split.value.field == "split"
    with pytest.raises(PayloadTooLargeError):
        ev.final_holdout("goal_a", b"x" * 11)
    assert not ev.holdout_used("goal_a")  # a refused call does not spend the holdout


HOLDOUT_SCRIPT = "import sys\nprint(1 if open(sys.argv[2] + '/which').read() == 'holdout' else 0)\n"


def test_the_holdout_answers_once_also_after_a_restart(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", HOLDOUT_SCRIPT)
    first = evaluator(root, tmp_path / "state")
    signed = first.final_holdout("goal_a", b"x")
    assert (signed.split, signed.score) == ("holdout", 1)
    assert verify_score(signed, first.public_key)
    with pytest.raises(HoldoutUsedError) as caught:
        first.final_holdout("goal_a", b"another artifact")
    assert caught.value.goal_id == "goal_a"
    first.close()
    again = evaluator(root, tmp_path / "state")
    assert again.public_key == first.public_key
    with pytest.raises(HoldoutUsedError):
        again.final_holdout("goal_a", b"x")
    assert again.final_holdout("goal_b", b"x").score == 1  # other goals keep their own shot
    assert again.score("goal_a", b"x").score == 0  # the search split stays open


def test_concurrent_holdout_calls_answer_exactly_once(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", HOLDOUT_SCRIPT)
    ev = evaluator(root, tmp_path / "state")
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def call() -> None:
        barrier.wait()
        try:
            ev.final_holdout("goal_a", b"x")
            outcomes.append("scored")
        except HoldoutUsedError:
            outcomes.append("refused")

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused", "refused", "refused", "scored"]


def test_a_failed_holdout_run_still_spends_the_shot(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b", "import sys\nsys.exit(1)\n")
    ev = evaluator(root, tmp_path / "state")
    with pytest.raises(ScoringError):
        ev.final_holdout("goal_a", b"x")
    with pytest.raises(HoldoutUsedError):
        ev.final_holdout("goal_a", b"x")
