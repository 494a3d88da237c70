"""What every fault case asserts once the run is over, read from the store, the host and the audit log.

``check_run(store_url, run_dir)`` (SQLite ``sqlite:///.../store.db`` or ``postgresql://...``) asserts, for the
goal of the run (the store's only goal unless ``goal_id`` is given):

- **no duplicate claim**: fencing tokens are never handed out twice; a task is completed at most once, a done
  task exactly once; nothing is left pending or claimed (``finished``);
- **no stale write accepted**: walking the log in order, every write that carries a fencing token (renewals,
  posts, findings, artifacts, holds, completions) carries the task's current token, while its claim is open and
  its lease (as last renewed) had not expired;
- **every hold closed**: each reservation is ``settled``, ``released`` or ``unknown`` (``allow_unknown``), none
  ``held``;
- **envelopes exact**: the goal's and each task's settled spend is the sum of what their settled holds charged
  (and the reservation events say the same), what they still reserve is the sum of their ``unknown`` holds, their
  call counts are their holds, nothing is over its envelope and no hold was charged past its amount; with
  escrow, the goal's spent + reserved + its live slices stay within its budget, its ``escrowed`` is the sum of
  its live slices, each slice's holds are what it counts, and every slice was returned at most once; a goal that
  caps calls has allocated them to its tasks exactly, and its counted and escrowed calls are within that;
- **no machine left behind**: no folder, cgroup or process of any machine the run made (its
  ``machine.created`` events, and the folder names a :class:`MachineWatch` saw: a machine made in a parked
  launcher is named after its slot), nor a machine folder owned by one of ``owners`` (the run's runner
  processes: this catches a machine killed half made, before its event); with ``exclusive`` (the run had a
  machines root of its own, through its ``TMPDIR``) nothing at all may be left there, no folder and no process
  that mounts one;
- **the audit log verifies**: ``swarmyard audit verify`` exits 0 on the run folder and store, tables matching.

It returns a :class:`RunFacts` so a case can assert more (how many holds ended ``unknown``, which tokens).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What closes a claim: after one of these, no write may carry its token.
_ENDS = {"task.completed", "task.failed", "task.released", "task.cancelled"}
#: A run is over when every task is in one of these.
_FINAL = {"done", "failed", "cancelled"}


@dataclass
class RunFacts:
    """What the checks read, for a case's own assertions."""

    goal_id: str
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> state
    titles: dict[str, str] = field(default_factory=dict)  # task id -> title
    holds: Counter[str] = field(default_factory=Counter)  # reservation state -> count
    holds_by_model: dict[str, list[str]] = field(default_factory=dict)  # model -> states, in order
    claims: list[tuple[str, int, str]] = field(default_factory=list)  # (task, token, worker), in order
    machines: list[str] = field(default_factory=list)
    settled: int = 0
    events: Counter[str] = field(default_factory=Counter)


class _Db:
    """Read-only queries on either engine (``?`` placeholders)."""

    def __init__(self, url: str) -> None:
        self.postgres = url.startswith("postgresql://") or url.startswith("postgres://")
        if self.postgres:
            import psycopg

            self._pg = psycopg.connect(url, connect_timeout=10, autocommit=True)
        elif url.startswith("sqlite:///"):
            path = url.removeprefix("sqlite:///")
            if url.startswith("sqlite:////"):
                path = "/" + path.lstrip("/")
            self._lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        else:
            raise AssertionError(f"not a store URL: {url}")

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            return [tuple(r) for r in self._pg.execute(sql.replace("?", "%s"), list(params)).fetchall()]
        return self._lite.execute(sql, list(params)).fetchall()

    def close(self) -> None:
        if self.postgres:
            self._pg.close()
        else:
            self._lite.close()


def store_url_of(run_dir: Path) -> str:
    """A run folder's own SQLite store."""
    return f"sqlite:///{run_dir / 'store.db'}"


def _events(db: _Db, goal_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    out = []
    for event_id, kind, body in db.rows("SELECT id, kind, body FROM events ORDER BY id"):
        data = json.loads(bytes(body) if not isinstance(body, str) else body)
        if data.get("goal") == goal_id:
            out.append((int(event_id), str(kind), data))
    return out


def check_claims(events: list[tuple[int, str, dict[str, Any]]], facts: RunFacts, *, finished: bool) -> None:
    """No fencing token twice, each task completed once, no write accepted under a stale token or lease."""
    tokens = [int(data["token"]) for _, kind, data in events if kind == "task.claimed"]
    assert len(tokens) == len(set(tokens)), f"a fencing token was handed out twice: {sorted(tokens)}"
    completed = Counter(str(data["task"]) for _, kind, data in events if kind == "task.completed")
    twice = {task: n for task, n in completed.items() if n > 1}
    assert not twice, f"tasks completed more than once: {twice}"
    for task, state in facts.tasks.items():
        if state == "done":
            assert completed[task] == 1, f"task {task} is done without exactly one task.completed event"
        else:
            assert completed[task] == 0, f"task {task} is {state} but was completed"
        if finished:
            assert state in _FINAL, f"task {task} ({facts.titles[task]}) was left {state}"
    # (token, lease expiry in ms, open) of each task's current claim, walked in log order
    current: dict[str, tuple[int, int, bool]] = {}
    for event_id, kind, data in events:
        task = data.get("task")
        if kind == "task.claimed":
            previous = current.get(str(task))
            if previous is not None and previous[2]:
                # a claim may replace an open one only once its lease has run out
                assert data["at_ms"] >= previous[1], (
                    f"event {event_id}: task {task} claimed again (token {data['token']}) while token "
                    f"{previous[0]}'s lease ran to {previous[1]} (at {data['at_ms']})")
            current[str(task)] = (int(data["token"]), int(data["expires_ms"]), True)
            facts.claims.append((str(task), int(data["token"]), str(data["worker"])))
            continue
        token = data.get("token")
        if task is None or token is None or not isinstance(token, int):
            if kind == "task.cancelled" and task is not None and str(task) in current:
                token_now, expiry, _ = current[str(task)]
                current[str(task)] = (token_now, expiry, False)
            continue
        assert str(task) in current, f"event {event_id} ({kind}) wrote task {task} under token {token} never claimed"
        token_now, expiry, open_ = current[str(task)]
        assert token == token_now, f"event {event_id} ({kind}): stale token {token} accepted (current {token_now})"
        assert open_, f"event {event_id} ({kind}): token {token} wrote after its claim had ended"
        assert data["at_ms"] <= expiry, (
            f"event {event_id} ({kind}): token {token} wrote at {data['at_ms']}, after its lease ran out at {expiry}")
        if kind == "task.renewed":
            current[str(task)] = (token_now, int(data["expires_ms"]), True)
        elif kind in _ENDS:
            current[str(task)] = (token_now, expiry, False)


def check_holds_and_envelopes(db: _Db, events: list[tuple[int, str, dict[str, Any]]], facts: RunFacts, *,
                              allow_unknown: bool, allow_overage: bool) -> None:
    """Every hold closed; each envelope's settled and reserved sums are its holds', and within its budget."""
    goal_id = facts.goal_id
    holds = db.rows("SELECT id, task_id, model, amount, actual, overage, state FROM reservations "
                    "WHERE goal_id = ? ORDER BY created_at, id", (goal_id,))
    allowed = {"settled", "released"} | ({"unknown"} if allow_unknown else set())
    charged_by: Counter[str] = Counter()
    reserved_by: Counter[str] = Counter()
    calls_by: Counter[str] = Counter()
    for hold_id, task_id, model, amount, actual, overage, state in holds:
        facts.holds[str(state)] += 1
        facts.holds_by_model.setdefault(str(model), []).append(str(state))
        assert state in allowed, f"hold {hold_id} (task {task_id}, {model}) was left {state}"
        calls_by[str(task_id)] += 1
        if state == "settled":
            charged = int(actual) - int(overage)
            assert 0 <= charged <= int(amount), f"hold {hold_id} charged {charged} of its {amount}"
            if not allow_overage:
                assert int(overage) == 0, f"hold {hold_id} cost {actual}, over its worst case {amount}"
            charged_by[str(task_id)] += charged
        elif state == "unknown":
            reserved_by[str(task_id)] += int(amount)
        else:
            assert actual is None, f"released hold {hold_id} has a cost {actual}"
    settled_events = sum(int(data["charged"]) for _, kind, data in events if kind == "reservation.settled")
    assert settled_events == sum(charged_by.values()), "the reservation events' charges differ from the holds'"
    [(budget, allocated, row_reserved, row_settled, row_calls, escrowed, escrowed_calls, cap)] = db.rows(
        "SELECT budget, allocated, reserved, settled, calls, escrowed, escrowed_calls, call_cap FROM goals "
        "WHERE id = ?", (goal_id,))
    # escrow: what the goal's live slices hold, spent and counted is on their tasks' rows until returned
    [(s_reserved, s_settled, s_calls)] = db.rows(
        "SELECT COALESCE(SUM(slice_reserved), 0), COALESCE(SUM(slice_settled), 0), COALESCE(SUM(slice_calls), 0) "
        "FROM tasks WHERE goal_id = ? AND slice_token IS NOT NULL", (goal_id,))
    reserved, settled, calls = (int(row_reserved) + int(s_reserved), int(row_settled) + int(s_settled),
                                int(row_calls) + int(s_calls))
    check_escrow(db, events, goal_id, int(budget), int(row_reserved), int(row_settled), int(escrowed),
                 int(escrowed_calls), int(cap), int(row_calls))
    facts.settled = int(settled)
    assert int(settled) == sum(charged_by.values()), (
        f"goal settled {settled}, its settled holds charged {sum(charged_by.values())}")
    assert int(reserved) == sum(reserved_by.values()), (
        f"goal reserves {reserved}, its unknown holds hold {sum(reserved_by.values())}")
    assert int(calls) == len(holds), f"goal counted {calls} calls for {len(holds)} holds"
    assert int(reserved) + int(settled) <= int(budget) and int(allocated) <= int(budget), (
        f"goal over its envelope: budget {budget}, allocated {allocated}, reserved {reserved}, settled {settled}")
    for task_id, t_budget, t_reserved, t_settled, t_calls in db.rows(
            "SELECT id, budget, reserved, settled, calls FROM tasks WHERE goal_id = ?", (goal_id,)):
        key = str(task_id)
        assert int(t_settled) == charged_by[key], f"task {key} settled {t_settled}, its holds {charged_by[key]}"
        assert int(t_reserved) == reserved_by[key], f"task {key} reserves {t_reserved}, its holds {reserved_by[key]}"
        assert int(t_calls) == calls_by[key], f"task {key} counted {t_calls} calls for {calls_by[key]} holds"
        assert int(t_reserved) + int(t_settled) <= int(t_budget), f"task {key} over its envelope {t_budget}"


def check_escrow(db: _Db, events: list[tuple[int, str, dict[str, Any]]], goal_id: str, budget: int, reserved: int,
                 settled: int, escrowed: int, escrowed_calls: int, call_cap: int, calls: int) -> None:
    """The budget binds with escrow: the goal's spent + reserved + its live slices <= its budget; the goal's
    ``escrowed`` is the sum of its live slices; each live slice's holds are what it counts, within it; every
    slice carved is returned at most once, and the ones not returned are the live ones."""
    live = db.rows("SELECT id, slice_token, slice, slice_call_cap, slice_reserved, slice_settled, slice_calls "
                   "FROM tasks WHERE goal_id = ? AND slice_token IS NOT NULL", (goal_id,))
    assert escrowed == sum(int(r[2]) for r in live), (
        f"goal escrows {escrowed}, its live slices hold {sum(int(r[2]) for r in live)}")
    assert escrowed_calls == sum(int(r[3]) for r in live), "goal escrows calls its live slices do not carry"
    assert settled + reserved + escrowed <= budget, (
        f"goal over its budget with escrow: settled {settled} + reserved {reserved} + slices {escrowed} > {budget}")
    if call_cap:
        assert calls + escrowed_calls <= call_cap, f"goal over its call cap with escrow: {calls} + {escrowed_calls}"
        # its calls are allocated to its tasks: their own caps (an ended task's, the calls it made) and the calls
        # of those with none; what the goal's row counts and its slices carry is within that
        [(allocated_calls,)] = db.rows("SELECT allocated_calls FROM goals WHERE id = ?", (goal_id,))
        caps = db.rows("SELECT call_cap, calls FROM tasks WHERE goal_id = ?", (goal_id,))
        assert int(allocated_calls) == sum(int(cap) or int(made) for cap, made in caps), (
            f"goal allocates {allocated_calls} calls, its tasks hold {sum(int(c) or int(m) for c, m in caps)}")
        assert calls + escrowed_calls <= int(allocated_calls) <= call_cap, (
            f"goal's calls past their allocation: {calls} + {escrowed_calls} > {allocated_calls} or > {call_cap}")
    for task_id, token, amount, slice_cap, s_reserved, s_settled, s_calls in live:
        assert int(s_reserved) + int(s_settled) <= int(amount), f"task {task_id} over its slice {amount}"
        if call_cap:
            assert int(s_calls) <= int(slice_cap), f"task {task_id} over its slice's {slice_cap} calls"
        holds = db.rows("SELECT amount, actual, overage, state FROM reservations WHERE task_id = ? AND "
                        "slice_token = ?", (task_id, token))
        assert int(s_calls) == len(holds), f"task {task_id}'s slice counted {s_calls} calls for {len(holds)} holds"
        assert int(s_settled) == sum(int(a) - int(o) for _, a, o, st in holds if st == "settled"), (
            f"task {task_id}'s slice settled {s_settled}, its holds differ")
        assert int(s_reserved) == sum(int(a) for a, _, _, st in holds if st in ("held", "unknown")), (
            f"task {task_id}'s slice reserves {s_reserved}, its holds differ")
    carved = Counter((str(d["task"]), int(d["slice_token"])) for _, kind, d in events if kind == "task.slice_carved"
                     and d.get("goal") == goal_id)
    returned = Counter((str(d["task"]), int(d["slice_token"])) for _, kind, d in events if kind == "task.slice_returned"
                       and d.get("goal") == goal_id)
    assert all(n == 1 for n in carved.values()), "a slice was carved twice under one claim"
    assert all(n == 1 for n in returned.values()), f"a slice was returned more than once: {returned}"
    assert set(returned) <= set(carved), "a slice was returned that was never carved"
    assert set(carved) - set(returned) == {(str(r[0]), int(r[1])) for r in live}, (
        "the slices carved and not returned are not the live ones")


def machines_root(tmpdir: Path | None = None) -> Path:
    """Where the ``local`` backend keeps machines for this user: under ``tmpdir`` (a run's ``TMPDIR``; give each
    run its own, so that everything there is the run's), else under this process's temp folder."""
    return (tmpdir or Path(tempfile.gettempdir())) / f"swarmyard-machines-{os.getuid()}"


def _live(pid: Path) -> bool:
    """Whether a process runs (a zombie has exited: it is its parent's, or init's, to reap)."""
    try:
        return (pid / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def machine_processes(root: Path) -> dict[str, list[int]]:
    """Live processes of the machines under ``root``, by machine folder name (a machine id, or the parked
    launcher's slot it was made in): a machine's processes mount their folders from ``root/m/NAME``."""
    marker = f"{root}/m/"
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            mounts = (entry / "mountinfo").read_text()
        except OSError:
            continue  # gone meanwhile
        at = mounts.find(marker)
        if at >= 0 and _live(entry):
            name = mounts[at + len(marker):].split("/", 1)[0].split(" ", 1)[0]
            found.setdefault(name, []).append(int(entry.name))
    return {name: sorted(pids) for name, pids in found.items()}


class MachineWatch:
    """The machine folders that appear under ``root/m`` while a run goes (a thread polls it), so that the
    cgroups of machines made in parked launchers (named after their slot, not their id) are checked too."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError):
                self.names.update(p.name for p in (self.root / "m").iterdir())

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join()
        return self.names


def check_no_machines(machine_ids: Iterable[str], *, root: Path | None = None, owners: Iterable[int] = (),
                      seen: Iterable[str] = (), exclusive: bool = False) -> None:
    """No folder, cgroup or process of these machines (and of the folder names ``seen``); no machine folder
    owned by one of ``owners``. ``exclusive``: ``root`` is the run's own, so nothing at all may be left there."""
    from swarmyard.machines.cgroups import discover, group_folders

    root = root or machines_root()
    names = set(machine_ids) | set(seen)
    hierarchy = discover()
    for name in sorted(names):
        assert not (root / "m" / name).exists(), f"machine {name}'s folder was left in {root / 'm'}"
        left = [str(p) for p in group_folders(hierarchy, name) if p.exists()]
        assert not left, f"machine {name}'s cgroups were left: {left}"
    folders = sorted((root / "m").iterdir()) if (root / "m").is_dir() else []
    if exclusive:
        assert not folders, f"machine folders were left: {[p.name for p in folders]}"
    owned = {int(pid) for pid in owners}
    for folder in folders:
        try:
            pid = int((folder / "owner").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        assert pid not in owned, f"{folder} of runner {pid} was left behind"
    running = machine_processes(root)
    if not exclusive:
        running = {name: pids for name, pids in running.items() if name in names}
    assert not running, f"machine processes are still running: {running}"
    for entry in Path("/proc").iterdir():  # a process that left the machine's mounts but not its cgroups
        if entry.name.isdigit() and _live(entry):
            try:
                cgroup = entry.joinpath("cgroup").read_text()
            except OSError:
                continue
            hit = [name for name in names if f"/swarmyard/{name}\n" in cgroup]
            assert not hit, f"process {entry.name} is still in machine {hit[0]}'s cgroup"


def check_audit(run_dir: Path, store_url: str | None, env: dict[str, str] | None = None) -> None:
    """``swarmyard audit verify`` accepts the run's log and its tables (a folder with no run.json is a
    ``swarmyard serve``'s, its log in ``--audit-dir audit``, kept with no witness)."""
    argv = [sys.executable, "-m", "swarmyard.cli", "audit", "verify", str(run_dir)]
    if not (run_dir / "run.json").exists() and store_url is not None:
        argv = [*argv[:-1], str(run_dir / "audit"), "--store", store_url, "--no-witness"]
    elif store_url is not None and (not store_url.startswith("sqlite:") or not (run_dir / "store.db").exists()):
        argv += ["--store", store_url]  # a run's store elsewhere than in its folder (its swarm file's [run] store)
    verify = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=600)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("OK") and "tables match" in verify.stdout, verify.stdout


def check_run(store_url: str, run_dir: Path, *, goal_id: str | None = None, finished: bool = True,
              allow_unknown: bool = True, allow_overage: bool = False, machines: Path | None = None,
              exclusive: bool = False, owners: Iterable[int] = (), seen: Iterable[str] = (),
              env: dict[str, str] | None = None) -> RunFacts:
    """Every invariant of a run after a fault (see the module's docstring); the facts read, for more.

    ``machines``: the machines root the run used (``machines_root(TMPDIR)``), ``exclusive`` if it was the run's
    own; ``owners``: the pids of the run's runners; ``seen``: machine folder names a ``MachineWatch`` saw."""
    db = _Db(store_url)
    try:
        if goal_id is None:
            goals = [str(g) for (g,) in db.rows("SELECT id FROM goals")]
            assert len(goals) == 1, f"the store holds {len(goals)} goals; name the run's"
            goal_id = goals[0]
        facts = RunFacts(goal_id)
        for task_id, title, state in db.rows("SELECT id, title, state FROM tasks WHERE goal_id = ?", (goal_id,)):
            facts.tasks[str(task_id)] = str(state)
            facts.titles[str(task_id)] = str(title)
        events = _events(db, goal_id)
        facts.events = Counter(kind for _, kind, _ in events)
        check_claims(events, facts, finished=finished)
        check_holds_and_envelopes(db, events, facts, allow_unknown=allow_unknown, allow_overage=allow_overage)
        facts.machines = [str(data["machine"]) for _, kind, data in events if kind == "machine.created"]
    finally:
        db.close()
    check_no_machines(facts.machines, root=machines, owners=owners, seen=seen, exclusive=exclusive)
    check_audit(run_dir, store_url, env)
    return facts
