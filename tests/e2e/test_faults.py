"""Faults injected into real runs, and what must hold after each (the ``faults`` suite).

Every case runs ``python -m swarmyard.cli run`` in a subprocess, in real bubblewrap machines, on the scripted
provider (its replies file is the only test double), injects its fault through the real entries (``kill -9`` of
an agent, of a machine's processes, of the runner; the provider dropping a call), and ends with the same checks
(``tests/invariants.py``): no duplicate claim, no stale write accepted, every hold settled, released or
``unknown``, the envelopes exact, no machine left behind, and ``swarmyard audit verify`` accepting the log and
the tables. The PostgreSQL restart case is ``test_run_pg_restart.py``. Waits are bounded by the run's progress
(a poll of its store), never by a clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from invariants import MachineWatch, RunFacts, check_run, machine_processes, machines_root, store_url_of
from rigs.scripted import tool_call as _tool

pytestmark = [
    pytest.mark.faults,
    pytest.mark.bwrap,
    pytest.mark.slow,
]

T = TypeVar("T")
SYNTHESIS = "Go: the findings agree."


def _finding(n: int | str) -> dict[str, Any]:
    return _tool("submit_finding", title=f"finding {n}", body=f"What lens {n} shows, in brief.")


def _swarm(folder: Path, replies: dict[str, Any], *, lenses: int = 1, concurrency: int = 1,
           max_failures: int = 3, lease_s: float = 120, workers: int | None = None) -> Path:
    """A swarm file on the scripted provider with ``lenses`` tasks, its replies file beside it."""
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "replies.json").write_text(json.dumps(replies))
    tasks = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Look at lens {i}."\n' for i in range(lenses))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "1"
call_cap = 200
deadline_s = 600
{tasks}
[workers]
count = {workers or lenses}
concurrency = {max(concurrency, workers or 0)}
exec_timeout_s = 120
max_steps = 4
max_failures = {max_failures}
lease_s = {lease_s}
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[providers.script.prices.scripted-worker]
input_usd_per_mtok = "3"
output_usd_per_mtok = "15"
[providers.script.prices.scripted-lead]
input_usd_per_mtok = "3"
output_usd_per_mtok = "15"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def _env(folder: Path) -> dict[str, str]:
    """The runner's environment: its own temp folder, so the machines root there is the run's alone."""
    (folder / "tmp").mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "TMPDIR": str(folder / "tmp")}


def _check(run_dir: Path, folder: Path, watch: MachineWatch, *runners: subprocess.Popen[str]) -> RunFacts:
    """Every invariant (tests/invariants.py), the run's machines root being its own."""
    return check_run(store_url_of(run_dir), run_dir, machines=machines_root(folder / "tmp"), exclusive=True,
                     owners=[r.pid for r in runners], seen=watch.stop(), env=_env(folder))


#: Each runner's output files, by pid.
_OUTPUT: dict[int, tuple[Path, Path]] = {}


def _start(folder: Path, swarm: Path, *more: str) -> subprocess.Popen[str]:
    """The runner, its output in files (a pipe nobody reads while the test polls would fill and stall it)."""
    n = len(list(folder.glob("runner-*.out")))
    paths = folder / f"runner-{n}.out", folder / f"runner-{n}.err"
    with paths[0].open("w") as out, paths[1].open("w") as err:
        runner = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), *more], cwd=folder,
                                  env=_env(folder), stdout=out, stderr=err, text=True)
    _OUTPUT[runner.pid] = paths
    return runner


def _output(runner: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = _OUTPUT[runner.pid]
    return out.read_text(), err.read_text()


def _run_dir(folder: Path) -> Path | None:
    runs = folder / "runs"
    found = [p for p in runs.iterdir() if (p / "store.db").exists()] if runs.is_dir() else []
    return found[0] if found else None


def _rows(folder: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of the run's SQLite store, or none while it is not there yet (or busy)."""
    run_dir = _run_dir(folder)
    if run_dir is None:
        return []
    try:
        with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True, timeout=5) as db:
            return db.execute(sql, params).fetchall()
    except sqlite3.Error:
        return []


def _until(runner: subprocess.Popen[str], probe: Callable[[], T | None], what: str) -> T:
    """Poll ``probe`` until it gives something; the run ending first fails the test (progress, not a clock)."""
    pause = threading.Event()
    while True:
        got = probe()
        if got is not None:
            return got
        if runner.poll() is not None:
            err = _output(runner)[1]
            pytest.fail(f"the run ended (exit {runner.returncode}) before {what}: {err[-3000:]}")
        pause.wait(0.05)  # a poll of the run's store, not a wait for a race to end


def _finish(runner: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        runner.wait(timeout=900)
    finally:
        if runner.poll() is None:
            runner.kill()
    return runner.returncode, *_output(runner)


# -- 4. upstream drops ------------------------------------------------------------------------------------------

#: What the worker's first call meets, and how its hold must end (DESIGN: before the bytes leave, released;
#: after they leave and the answer is lost, unknown and never sent again; a full answer without usage is
#: settled from the counted text).
DROPS = {
    "before_send": ({"fail": "before_send"}, ["released", "settled"]),
    "after_send": ({"fail": "after_send"}, ["unknown"]),
    "mid_stream": ({"fail": "mid_stream", "text": "The market is la"}, ["unknown"]),
    "no_usage": ({"say": json.dumps({"action": {"tool": "submit_finding", "args": {
        "title": "market", "body": "Large and growing, by the counted answer."}}}), "usage": False}, ["settled"]),
}


@pytest.mark.parametrize("drop", sorted(DROPS))
def test_an_upstream_drop_ends_each_hold_as_designed_and_is_never_sent_again(short_tmp: Path, drop: str) -> None:
    first, expected = DROPS[drop]
    # What a second request would get: a resend of a lost call (by the broker or the agent) would take it and
    # post RESENT; a fresh call after a failure that never left (before_send) takes it legitimately.
    trap = [_tool("submit_finding", title="market", body="RESENT answer, after the drop.")]
    swarm = _swarm(short_tmp, {"scripted-worker": [first, *trap],
                               "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]},
                   max_failures=1)
    watch = MachineWatch(machines_root(short_tmp / "tmp"))
    runner = _start(short_tmp, swarm)
    code, _, err = _finish(runner)
    assert code == 0, err[-3000:]
    run_dir = _run_dir(short_tmp)
    assert run_dir is not None
    facts = _check(run_dir, short_tmp, watch, runner)
    assert facts.settled > 0  # priced calls: the exact envelopes are not sums of zeros
    # the worker's calls as the provider met them: one hold per request it was given
    assert facts.holds_by_model["scripted-worker"] == expected, facts.holds_by_model
    assert facts.holds_by_model["scripted-lead"] == ["settled"]
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [b for (b,) in db.execute("SELECT body FROM findings")]
        worker = db.execute("SELECT state, actual, output_tokens FROM reservations WHERE model = 'scripted-worker' "
                            "ORDER BY created_at").fetchall()
    resent = any("RESENT" in body for body in bodies)
    assert resent == (drop == "before_send"), bodies  # only a call that never left is asked again
    if drop == "no_usage":
        [(state, actual, output_tokens)] = worker
        assert state == "settled" and actual > 0 and output_tokens > 0, worker  # counted, not free


# -- 2. kill -9 of the runner, then --resume ----------------------------------------------------------------------

RUNNER_LENSES = 8


def test_a_runner_killed_mid_run_is_completed_by_resume(short_tmp: Path) -> None:
    replies = {"scripted-worker": [_finding("n")] * (2 * RUNNER_LENSES),
               "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]}
    swarm = _swarm(short_tmp, replies, lenses=RUNNER_LENSES, concurrency=2)
    root = machines_root(short_tmp / "tmp")
    watch = MachineWatch(root)
    runner = _start(short_tmp, swarm)
    try:
        # mid-run: findings written, tasks still open, machines live
        _until(runner, lambda: True if len(_rows(short_tmp, "SELECT id FROM findings")) >= 2 else None,
               "two findings were written")
        open_tasks = _rows(short_tmp, "SELECT count(*) FROM tasks WHERE state IN ('pending', 'claimed')")
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=120)
        # what the killed runner left: its machines' folders (and cgroups) for the resume's reaper
        left = [p.name for p in (root / "m").iterdir()]
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == -signal.SIGKILL
    assert open_tasks and open_tasks[0][0] > 0, "the run had finished its tasks before the kill"
    assert left, "the killed runner left no machine folder: the reaper would not be exercised"
    run_dir = _run_dir(short_tmp)
    assert run_dir is not None
    resumed = _start(short_tmp, swarm, "--resume", run_dir.name)
    code, out, err = _finish(resumed)
    assert code == 0, err[-3000:]
    assert out.strip() == SYNTHESIS
    # the killed runner's machines (its folders name it as owner) are gone too: the resume reaped them
    facts = _check(run_dir, short_tmp, watch, runner, resumed)
    assert set(left) <= watch.names
    assert sorted(facts.tasks.values()) == ["done"] * (RUNNER_LENSES + 1)
    assert facts.events["task.completed"] == RUNNER_LENSES + 1


# -- 1. kill -9 of a worker mid-task -------------------------------------------------------------------------------


def _events(folder: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(bytes(body)) for (body,) in _rows(folder, "SELECT body FROM events WHERE kind = ? "
                                                                 "ORDER BY id", (kind,))]


def _blocked(root: Path, other_than: str | None = None) -> tuple[str, list[tuple[int, dict[str, str]]]] | None:
    """A machine (folder name, processes with their environments) whose agent (it holds a token) runs a command
    blocked on its FIFO (``cat``)."""
    for name, pids in machine_processes(root).items():
        if name == other_than:
            continue
        procs = []
        waiting = False
        for pid in pids:
            try:
                waiting = waiting or Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"cat\0")
                raw = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            procs.append((pid, dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                                    if "=" in item)))
        if waiting and any("SWARMYARD_TOKEN" in env for _, env in procs):
            return name, procs
    return None


def _unblock(procs: list[tuple[int, dict[str, str]]], fifo: str) -> None:
    """Let the blocked command end: open its FIFO for writing (through the machine's root) and close it."""
    for pid, _ in procs:
        path = Path(f"/proc/{pid}/root") / fifo.lstrip("/")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # not this process's view, or no reader yet
        os.close(fd)
        return
    raise AssertionError(f"no process of the machine has {fifo} open")


@pytest.mark.parametrize("victim", ["agent", "machine", "hung"])
def test_a_worker_killed_mid_task_loses_its_claim_and_another_completes_it(short_tmp: Path, victim: str) -> None:
    """``agent``: the agent is killed (its run ends, the coordinator gives its claim back at once); ``machine``:
    every process of its machine is; ``hung``: the agent is stopped (SIGSTOP), so its run does not end and its
    heartbeats stop: its lease runs out, a second worker's slot claims the task, and the stopped agent is
    killed only after that."""
    # The first agent posts, then blocks in a command until it is killed; the next one posts and blocks too (so
    # the run is still serving when the dead worker's write arrives), and completes the task once let go.
    replies = {"scripted-worker": [_tool("board_post", body="before the kill"),
                                   _tool("shell", command="mkfifo /tmp/wait && cat /tmp/wait"),
                                   _tool("board_post", body="after the kill"),
                                   _tool("shell", command="mkfifo /tmp/go && cat /tmp/go"), _finding(0)],
               "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]}
    # a hung worker's task goes to a second slot once the lease (3 s, renewed each second while alive) runs out
    swarm = _swarm(short_tmp, replies, **({"workers": 2, "lease_s": 3} if victim == "hung" else {}))
    root = machines_root(short_tmp / "tmp")
    watch = MachineWatch(root)
    runner = _start(short_tmp, swarm)
    try:
        posted = _until(runner, lambda: next(iter(_rows(
            short_tmp, "SELECT task_id, fencing_token FROM posts WHERE body = 'before the kill'")), None),
            "the first agent posted")
        task_id, old_token = str(posted[0]), int(posted[1])
        first, procs = _until(runner, lambda: _blocked(root), "the first agent blocked in its command")
        agent_pid, agent_env = next((pid, env) for pid, env in procs if "SWARMYARD_TOKEN" in env)
        for pid in [pid for pid, _ in procs] if victim == "machine" else [agent_pid]:
            with contextlib.suppress(ProcessLookupError):  # the machine's init went first, and took the rest
                os.kill(pid, signal.SIGSTOP if victim == "hung" else signal.SIGKILL)
        # the dead agent's claim ends (given back, or its lease runs out) and another worker claims the task
        _until(runner, lambda: next((e for e in _events(short_tmp, "task.claimed")
                                     if e["task"] == task_id and e["token"] != old_token), None),
               "another worker claimed the task")
        second, held = _until(runner, lambda: _blocked(root, other_than=first),
                              "the second agent blocked in its command")
        # a write under the dead worker's credentials and stale fencing token is refused, and not written
        run_dir = _run_dir(short_tmp)
        assert run_dir is not None
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(run_dir / "plane.sock")),
                          base_url="http://plane") as plane:
            stale = plane.post("/v1/tools/board_post", headers={
                "authorization": f"Bearer {agent_env['SWARMYARD_TOKEN']}"},
                json={"task_id": task_id, "fencing_token": old_token, "body": "stale write"})
        if victim == "hung":
            # its claim ran out, it was not given back (the agent's run had not ended)
            assert not any(e["task"] == task_id and e["token"] == old_token
                           for e in _events(short_tmp, "task.released")), "the hung claim was given back"
            os.kill(agent_pid, signal.SIGKILL)  # stopped, it would hold its slot until its exec timeout
        _unblock(held, "/tmp/go")
        code, out, err = _finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert stale.status_code == 409, stale.text
    assert stale.json()["error"]["code"] == "stale_fencing_token", stale.text  # the task has a newer claim
    assert code == 0, err[-3000:]
    assert out.strip() == SYNTHESIS
    facts = _check(run_dir, short_tmp, watch, runner)
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [b for (b,) in db.execute("SELECT body FROM posts")]
    assert "stale write" not in bodies and "after the kill" in bodies
    claims = [(token, worker) for task, token, worker in facts.claims if task == task_id]
    assert len(claims) >= 2 and claims[0][0] == old_token and claims[-1][1] != claims[0][1], claims
    assert facts.tasks[task_id] == "done"
    # the killed worker's machine, the next try's and the lead's were all made (and none is left)
    assert {first, second} <= watch.names and len(facts.machines) >= 3


# -- the checks themselves: each broken invariant is caught ------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run() -> Iterator[tuple[Path, Path]]:
    """One run that ends well (two lenses on priced scripted calls): (its folder, its run folder)."""
    folder = Path(tempfile.mkdtemp(prefix="sy-f-"))
    try:
        replies = {"scripted-worker": [_tool("board_post", body="a note"), _finding(0), _finding(1)],
                   "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]}
        runner = _start(folder, _swarm(folder, replies, lenses=2))
        code, _, err = _finish(runner)
        assert code == 0, err[-3000:]
        run_dir = _run_dir(folder)
        assert run_dir is not None
        yield folder, run_dir
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _event(db: sqlite3.Connection, kind: str, **body: Any) -> None:
    db.execute("INSERT INTO events (kind, body, created_at) VALUES (?, ?, 0)",
               (kind, json.dumps({"kind": kind, **body}).encode()))


def _break(db: sqlite3.Connection, how: str, machines: Path) -> None:
    goal = db.execute("SELECT id FROM goals").fetchone()[0]
    claims = [json.loads(b) for (b,) in db.execute("SELECT body FROM events WHERE kind = 'task.claimed' ORDER BY id")]
    last = claims[-1]
    match how:
        case "token_twice":  # another task claimed under a token already handed out
            other = next(c for c in claims if c["task"] != last["task"])
            _event(db, "task.claimed", goal=goal, task=other["task"], token=last["token"], worker="w",
                   at_ms=last["at_ms"] + 1, expires_ms=last["expires_ms"] + 1)
        case "completed_twice":
            _event(db, "task.completed", goal=goal, task=last["task"], token=last["token"], at_ms=last["at_ms"])
        case "stale_write":  # a post under a claim that had ended
            _event(db, "board.posted", goal=goal, task=last["task"], token=last["token"], at_ms=last["at_ms"])
        case "hold_open":
            db.execute("UPDATE reservations SET state = 'held' WHERE rowid = (SELECT min(rowid) FROM reservations)")
        case "goal_envelope":
            db.execute("UPDATE goals SET settled = settled + 1")
        case "goal_escrow":  # the goal escrows more than its live slices hold
            db.execute("UPDATE goals SET escrowed = escrowed + 1")
        case "task_envelope":
            db.execute("UPDATE tasks SET settled = settled + 1, budget = budget + 1 WHERE id = ?", (last["task"],))
        case "machine_left":
            machine = next(json.loads(b)["machine"] for (b,) in
                           db.execute("SELECT body FROM events WHERE kind = 'machine.created'"))
            (machines / "m" / machine).mkdir(parents=True)
        case "table_rewritten":  # only the audit log's tables check sees this one
            db.execute("UPDATE findings SET body = 'rewritten' WHERE rowid = 1")


BROKEN = {
    "token_twice": "handed out twice", "completed_twice": "completed more than once",
    "stale_write": "after its claim had ended", "hold_open": "was left held", "goal_envelope": "goal settled",
    "goal_escrow": "goal escrows",
    "task_envelope": r"task \S+ settled", "machine_left": "folder was left", "table_rewritten": "is not what event",
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_the_checks_catch_each_broken_invariant(finished_run: tuple[Path, Path], tmp_path: Path, how: str) -> None:
    folder, run_dir = finished_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.sock"))
    machines = tmp_path / "machines"
    (machines / "m").mkdir(parents=True)
    # the copy passes as it is ...
    check_run(store_url_of(copy), copy, machines=machines, exclusive=True, env=_env(folder))
    with sqlite3.connect(copy / "store.db") as db:
        _break(db, how, machines)
    # ... and fails once broken, on the check that guards what was broken
    with pytest.raises(AssertionError, match=BROKEN[how]):
        check_run(store_url_of(copy), copy, machines=machines, exclusive=True, env=_env(folder))


# -- 4b. upstream drops on a streamed call ---------------------------------------------------------------------


def test_a_streamed_call_dropped_mid_stream_is_unknown_and_one_without_usage_is_settled_from_its_text(
        short_tmp: Path) -> None:
    """The built-in agent asks without streaming, so the streamed calls are made here, by a real HTTP client on
    the run's plane socket under the worker's own token, while its agent holds the claim (blocked in a command)."""
    said = "The market is large and growing."
    replies = {"scripted-worker": [_tool("shell", command="mkfifo /tmp/go && cat /tmp/go"),
                                   {"fail": "mid_stream", "text": "The market is la"},
                                   {"say": said, "usage": False}, _finding(0)],
               "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]}
    swarm = _swarm(short_tmp, replies, max_failures=1)
    root = machines_root(short_tmp / "tmp")
    watch = MachineWatch(root)
    runner = _start(short_tmp, swarm)
    try:
        _, procs = _until(runner, lambda: _blocked(root), "the agent blocked in its command")
        token = next(env["SWARMYARD_TOKEN"] for _, env in procs if "SWARMYARD_TOKEN" in env)
        run_dir = _run_dir(short_tmp)
        assert run_dir is not None
        streams = []
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(run_dir / "plane.sock")), base_url="http://plane",
                          headers={"authorization": f"Bearer {token}"}, timeout=120) as plane:
            # the call that is lost, the same call asked again (the broker must not send it), a new call
            for ask in ("Size the market.", "Size the market.", "Size the market, again."):
                with plane.stream("POST", "/v1/chat/completions", json={
                        "model": "scripted-worker", "stream": True, "max_tokens": 64,
                        "messages": [{"role": "user", "content": ask}]}) as answer:
                    streams.append((answer.status_code, answer.read().decode()))
        _unblock(procs, "/tmp/go")
        code, out, err = _finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert code == 0, err[-3000:]
    assert out.strip() == SYNTHESIS
    (lost_status, lost), (again_status, again), (whole_status, whole) = streams
    # the dropped stream sent what it had, then no end; asked again, it is refused unsent; the new one ended
    assert lost_status == 200 and "The" in lost and "[DONE]" not in lost, lost
    assert again_status == 409 and json.loads(again)["error"]["code"] == "duplicate_of_unknown", again
    assert whole_status == 200 and whole.rstrip().endswith("data: [DONE]"), whole
    facts = _check(run_dir, short_tmp, watch, runner)
    with sqlite3.connect(run_dir / "store.db") as db:
        worker = db.execute("SELECT state, actual, output_tokens FROM reservations WHERE model = 'scripted-worker' "
                            "ORDER BY created_at").fetchall()
    # one hold per request the provider was given: the agent's shell call, the lost stream, the new one, its
    # finding (a resend of the lost stream would have held again and taken the next reply, shifting the rest)
    assert [state for state, _, _ in worker] == ["settled", "unknown", "settled", "settled"], worker
    _, counted_cost, counted_tokens = worker[2]
    assert counted_cost > 0 and counted_tokens >= len(said.split()), worker  # counted from the streamed text
    assert facts.holds["unknown"] == 1
