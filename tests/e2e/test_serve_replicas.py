"""Three ``swarmyard serve`` replicas over one PostgreSQL store, workers reaching them through one address
(``SWARMYARD_PLANE_URL=http://a,http://b,http://c``), and one replica killed with SIGKILL mid-run.

The replicas are separate processes on their own loopback ports, sharing only the store, the token secret and
the operator token. Four worker slots run the built-in agent (``python -m swarmyard.agents``) one task at a time
on the simulated provider, priced, every slot with the first replica first in its list: all traffic goes there
until it dies, so the kill lands on calls in flight. The test plays the coordinator's part that a ``serve`` does
not, through the door an operator has: every claimed task with a finding is completed through the operator API
(``POST /v1/operator/tasks/{id}/complete`` on a surviving replica; the first one after the kill with
``swarmyard task complete --server`` over the whole list, its dead first replica included), and completing a
done task again with the CLI answers ``already_done`` and changes nothing.

Asserted, by the shared invariant checker (``tests/invariants.py``): every task done exactly once, fencing
tokens unique and no write accepted under a stale token or a lapsed lease, every hold settled, released or
``unknown`` (the killed replica's in-flight holds are marked ``unknown`` by a surviving replica), the envelopes
exact, and ``swarmyard audit verify`` exits 0 with the tables matching, on the log the second replica kept
(``serve --audit-dir``). Also: the killed replica exited by
SIGKILL, the others exit 0 on SIGTERM, agents started after the kill (the dead replica first in their list)
completed tasks, and no agent exit was anything but 0 or 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from tests.invariants import check_run

from rigs.network import free_port as _free_port
from swarmyard.domain import ReservationState, TaskState
from swarmyard.store import SqlStore, open_store

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

TASKS = 30
SLOTS = 4
REPLICAS = 3
KILL_AFTER = 6  # tasks with a finding before the first replica is killed


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "SWARMYARD_STATE_DIR": str(folder / "state")}


@dataclass
class Replica:
    url: str
    proc: subprocess.Popen[str]
    log: Path


@dataclass
class Slots:
    """What the worker slots did."""

    exits: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a slot that failed stops, saying why here
    after_kill_done: int = 0  # agents started after the kill that submitted a finding
    lock: threading.Lock = field(default_factory=threading.Lock)


def _start_replica(folder: Path, store: str, n: int, *extra: str) -> Replica:
    port = _free_port()
    log = folder / f"replica-{n}.log"
    argv = [sys.executable, "-m", "swarmyard.cli", "serve", "--store", store, "--no-socket", "--host", "127.0.0.1",
            "--port", str(port), "--secret-file", str(folder / "secret"), "--operator-token-file",
            str(folder / "operator-token"), "--providers", str(folder / "providers.toml"), "--lease-s", "10",
            "--renew-interval-s", "0", "--rate", "200", "--burst", "400", *extra]
    proc = subprocess.Popen(argv, cwd=folder, env=_env(folder), stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # readiness by polling its health route, bounded
        assert proc.poll() is None, f"replica {n} exited {proc.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"replica {n} did not start: {log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return Replica(url, proc, log)
        except httpx.TransportError:
            pass
        time.sleep(0.1)


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-rep-", dir="/tmp"))
    (path / "state").mkdir(mode=0o700)
    yield path


def _complete_cli(folder: Path, address: str, task_id: str) -> str:
    """``swarmyard task complete`` in a subprocess (exit 0 asserted); the outcome it printed."""
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "task", "complete", task_id, "--server", address,
                           "--operator-token-file", str(folder / "operator-token")], env=_env(folder), cwd=folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = done.stdout.split()
    assert said[0] == task_id and said[2] == "(done)", done.stdout
    return said[1]


def _settle(store: SqlStore, goal_id: str, operator: httpx.Client, outcomes: list[str],
            cli: tuple[Path, str] | None = None) -> int:
    """Complete every claimed task with a finding (what the coordinator does) through the operator API, the
    first with the CLI when ``cli`` (its folder and ``--server``) is given; the number of done tasks."""
    with_finding = {f.task_id for f in store.read_findings(goal_id, limit=10_000)}
    for task in store.list_tasks(goal_id, state=TaskState.CLAIMED):
        if task.id not in with_finding:
            continue
        if cli is not None and not outcomes:
            outcomes.append(_complete_cli(*cli, task.id))
            continue
        answer = operator.post(f"/v1/operator/tasks/{task.id}/complete", json={})
        assert answer.status_code == 200, answer.text
        assert answer.json()["task"]["state"] == "done", answer.text
        outcomes.append(answer.json()["outcome"])
    return len(store.list_tasks(goal_id, state=TaskState.DONE))


def _held_by_first_replica(url: str) -> set[str]:
    """The holds still ``held`` that the first replica to register made."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT id FROM reservations WHERE state = 'held' AND plane_id = "
                            "(SELECT id FROM planes ORDER BY started_at LIMIT 1)").fetchall()
    return {str(r[0]) for r in rows}


def _slot(n: int, address: str, operator: httpx.Client, goal_id: str, folder: Path, killed: threading.Event,
          done: threading.Event, slots: Slots) -> None:
    try:
        _agents(n, address, operator, goal_id, folder, killed, done, slots)
    except BaseException as exc:
        with slots.lock:
            slots.errors.append(f"slot {n}: {exc!r}")


def _agents(n: int, address: str, operator: httpx.Client, goal_id: str, folder: Path, killed: threading.Event,
            done: threading.Event, slots: Slots) -> None:
    while not done.is_set():
        issued = operator.post(f"/v1/operator/goals/{goal_id}/workers", json={"ttl_s": 3600})
        assert issued.status_code in (200, 201), issued.text
        after_kill = killed.is_set()
        env = {**_env(folder), "SWARMYARD_PLANE_URL": address, "SWARMYARD_TOKEN": issued.json()["token"],
               "SWARMYARD_MODEL": "sim-worker", "SWARMYARD_MAX_STEPS": "3", "SWARMYARD_HEARTBEAT_S": "2",
               "SWARMYARD_WORKDIR": str(folder / f"work-{n}")}
        (folder / f"work-{n}").mkdir(exist_ok=True)
        agent = subprocess.run([sys.executable, "-m", "swarmyard.agents"], env=env, cwd=folder, capture_output=True,
                               text=True, timeout=600)
        outcome = json.loads(agent.stdout.strip().splitlines()[-1]) if agent.returncode == 0 else {}
        with slots.lock:
            slots.exits.append(agent.returncode)
            if after_kill and outcome.get("finding_id"):
                slots.after_kill_done += 1
        if outcome.get("ending") == "no_task":
            done.wait(1.0)  # leases of agents that died with the replica run out; poll again


def test_a_replica_killed_mid_run_loses_nothing(folder: Path, pg_url: str) -> None:
    (folder / "providers.toml").write_text("""
[providers.sim]
kind = "simulated"
models = ["sim-worker"]
latency_s = 1.0
[providers.sim.prices."sim-worker"]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
""")
    replicas = [_start_replica(folder, pg_url, 0)]  # the first makes the secret and the operator token
    # the second keeps the store's audit log; it is stopped last
    replicas.append(_start_replica(folder, pg_url, 1, "--audit-dir", str(folder / "audit")))
    replicas += [_start_replica(folder, pg_url, n) for n in range(2, REPLICAS)]
    address = ",".join(r.url for r in replicas)
    token = (folder / "operator-token").read_text().strip()
    store = open_store(pg_url, blob_dir=folder / "blobs")
    operator = httpx.Client(base_url=replicas[1].url, headers={"authorization": f"Bearer {token}"}, timeout=60)
    threads: list[threading.Thread] = []
    done = threading.Event()
    try:
        # the goal through the one address, with the CLI: a list of URLs is a --server too
        created = subprocess.run([sys.executable, "-m", "swarmyard.cli", "goal", "create", "what is in the logs",
                                  "--budget-usd", "1", "--call-cap", "1000", "--server", address,
                                  "--operator-token-file", str(folder / "operator-token")],
                                 env=_env(folder), cwd=folder, capture_output=True, text=True, timeout=120)
        assert created.returncode == 0, created.stderr
        goal_id = created.stdout.strip()
        for i in range(TASKS):
            made = operator.post(f"/v1/operator/goals/{goal_id}/tasks",
                                 json={"title": f"shard {i}", "prompt": f"Read shard {i} of the logs.",
                                       "budget_micro_usd": 20_000, "call_cap": 20})
            assert made.status_code in (200, 201), made.text
        killed, slots = threading.Event(), Slots()
        threads = [threading.Thread(target=_slot, args=(n, address, operator, goal_id, folder, killed, done, slots),
                                    daemon=True) for n in range(SLOTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 900
        # killed once some tasks are done and, every answer taking a second, while model calls are in flight
        while (len({f.task_id for f in store.read_findings(goal_id, limit=10_000)}) < KILL_AFTER
               or not store.list_reservations(goal_id, state=ReservationState.HELD)):
            assert time.monotonic() < deadline, "no progress before the kill"
            assert not slots.errors, slots.errors
            time.sleep(0.05)  # polling the store for progress
        replicas[0].proc.send_signal(signal.SIGKILL)
        assert replicas[0].proc.wait(timeout=60) == -signal.SIGKILL
        killed.set()
        orphans = _held_by_first_replica(pg_url)  # calls whose answer the dead replica will never give
        assert orphans, "the kill landed on no call in flight"
        outcomes: list[str] = []  # what each completion answered
        while _settle(store, goal_id, operator, outcomes, cli=(folder, address)) < TASKS:
            assert not slots.errors, slots.errors
            assert time.monotonic() < deadline, (
                f"the work did not complete: {[(t.title, t.state.value) for t in store.list_tasks(goal_id)]}")
            time.sleep(0.2)  # polling the store for progress
        done.set()
        for t in threads:
            t.join(timeout=600)
            assert not t.is_alive()
        # nothing but the door completed a task, and each once
        assert set(outcomes) <= {"completed", "taken_back"} and len(outcomes) == TASKS, outcomes
        # completing a done task again, through the CLI on the address whose first replica is dead: a no-op
        last = store.list_tasks(goal_id)[-1]
        assert _complete_cli(folder, address, last.id) == "already_done"
        assert store.get_task(last.id) == last
        # the killed replica's holds still held are marked unknown by a live one, once its grace has passed
        while store.list_reservations(goal_id, state=ReservationState.HELD):
            assert time.monotonic() < deadline, "a dead replica's holds were never swept"
            time.sleep(0.5)
    finally:
        done.set()
        operator.close()
        codes = []
        for r in reversed(replicas[1:]):  # one by one, the audit log's keeper last
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
            codes.append(r.proc.wait(timeout=120))
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.kill()
    assert codes == [0] * (REPLICAS - 1), [r.log.read_text()[-2000:] for r in replicas[1:]]
    assert not slots.errors, slots.errors
    assert set(slots.exits) <= {0, 1}, slots.exits
    assert slots.after_kill_done >= 1, "no agent completed a task through the surviving replicas"
    store.close()
    assert len(list((folder / "audit" / "checkpoints").iterdir())) >= 1
    facts = check_run(pg_url, folder, goal_id=goal_id, env=_env(folder))
    assert len(facts.tasks) == TASKS and set(facts.tasks.values()) == {"done"}
    assert facts.holds["held"] == 0 and facts.holds["settled"] >= TASKS
    assert facts.settled > 0
    # exactly the calls in flight at the kill ended unknown: none was sent a second time, no other was lost
    store = open_store(pg_url, blob_dir=folder / "blobs")
    try:
        unknown = {r.id for r in store.list_reservations(goal_id, state=ReservationState.UNKNOWN)}
    finally:
        store.close()
    assert unknown == orphans


def test_the_rate_limit_and_a_revoke_hold_across_replicas(folder: Path, pg_url: str) -> None:
    (folder / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["sim-worker"]\n')
    rate = ("--rate", "0.1", "--burst", "5")
    a = _start_replica(folder, pg_url, 0, *rate)
    b = _start_replica(folder, pg_url, 1, *rate)
    token = (folder / "operator-token").read_text().strip()
    operator = httpx.Client(base_url=a.url, headers={"authorization": f"Bearer {token}"}, timeout=60)
    try:
        goal = operator.post("/v1/operator/goals", json={"objective": "count calls", "budget_micro_usd": 1_000_000,
                                                         "call_cap": 10}).json()["goal"]["id"]
        operator.post(f"/v1/operator/goals/{goal}/tasks", json={"title": "one"}).raise_for_status()
        issued = operator.post(f"/v1/operator/goals/{goal}/workers", json={}).json()
        worker = {"authorization": f"Bearer {issued['token']}"}
        started = time.monotonic()
        claim = httpx.post(f"{a.url}/v1/tools/claim_task", json={}, headers=worker, timeout=60)
        assert claim.status_code == 200, claim.text
        read = {"task_id": claim.json()["task"]["id"], "fencing_token": claim.json()["fencing_token"]}
        statuses = []
        for i in range(11):  # spread over both replicas: one bucket between them
            answer = httpx.post(f"{(b, a)[i % 2].url}/v1/tools/board_read", json=read, headers=worker, timeout=60)
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                assert int(answer.headers["retry-after"]) >= 1
                assert answer.json()["error"]["code"] == "rate_limited"
        refilled = int((time.monotonic() - started) * 0.1)  # what the bucket may have earned meanwhile
        served = 1 + statuses.count(200)
        assert set(statuses) <= {200, 429}
        assert 5 <= served <= 5 + refilled, statuses  # one replica alone would have served 5, both together 10
        # a revoke through one replica (the CLI on its operator API) is refused by the other at the next call
        revoked = subprocess.run([sys.executable, "-m", "swarmyard.cli", "worker", "revoke",
                                  issued["worker"]["id"], "--server", a.url, "--operator-token-file",
                                  str(folder / "operator-token")], env=_env(folder), cwd=folder,
                                 capture_output=True, text=True, timeout=120)
        assert revoked.returncode == 0, revoked.stderr
        refused = httpx.post(f"{b.url}/v1/tools/board_read", json=read, headers=worker, timeout=60)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
        model = httpx.post(f"{b.url}/v1/chat/completions", headers=worker, timeout=60,
                           json={"model": "sim-worker", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "hi"}]})
        assert model.status_code == 401, model.text
    finally:
        operator.close()
        for r in (a, b):
            r.proc.send_signal(signal.SIGTERM)
        codes = [r.proc.wait(timeout=120) for r in (a, b)]
    assert codes == [0, 0]
