"""The coordinator's steps on a real SQLite store, with a launcher that plays each agent against the store.

The launcher stands in for "an agent in a machine": it claims through the store as the plane would, posts,
submits a finding with citations, and can hang (its exec times out and the fake clock moves past the lease) or
die right after submitting. Policies, the lead, machine cleanup, hung workers and ``--resume`` are checked.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from swarmyard.agents.builtin import Role
from swarmyard.clock import FakeClock
from swarmyard.config import SwarmConfig, loads_config
from swarmyard.domain import Citation, CitationKind, Goal, PostKind, TaskState
from swarmyard.report.data import WorkerSpan
from swarmyard.store import open_store
from swarmyard.store.protocol import Store
from swarmyard.swarm.coordinator import Coordinator, RunState
from swarmyard.swarm.launcher import WorkerSlot


class StoreLauncher:
    """Plays agents directly on the store; records machines made and deleted."""

    def __init__(
        self,
        store: Store,
        clock: FakeClock,
        *,
        hang: set[str] = frozenset(),
        die_after_submit: int = 0,
        crash_at_run: int | None = None,
    ) -> None:
        self.store, self.clock = store, clock
        self.hang = set(hang)
        self.die_after_submit = die_after_submit
        self.crash_at_run = crash_at_run
        self.machines: set[str] = set()
        self.deleted: set[str] = set()
        self.runs = 0
        self.goal: Goal | None = None
        self.lease_s = 30.0

    async def start(self, goal: Goal) -> None:
        self.goal = goal

    def worker_of(self, slot: str) -> str | None:
        return None

    async def run(self, slot: WorkerSlot) -> WorkerSpan:
        assert self.goal is not None
        self.runs += 1
        if self.crash_at_run is not None and self.runs == self.crash_at_run:
            raise KeyboardInterrupt  # the runner is killed mid-run
        self.machines.add(slot.name)
        worker = f"{slot.name}-{self.runs}"
        start = self.clock.now()
        claim = self.store.claim(
            self.goal.id,
            worker,
            self.lease_s,
            task_id=slot.task_id,
            group=None if slot.task_id else slot.group,
        )
        if claim is None:
            return WorkerSpan(worker, None, start, self.clock.now(), "no_task", 0, slot.name)
        if slot.name in self.hang:
            self.hang.discard(slot.name)
            self.clock.advance(self.lease_s + 1)  # the exec timeout outlasts the lease
            return WorkerSpan(worker, claim.task.id, start, self.clock.now(), "timeout", 0, slot.name)
        post = self.store.post(
            claim.task.id, claim.token, PostKind.PROGRESS, f"{worker} on {claim.task.title}", author=worker
        )
        cites = [Citation(CitationKind.POST, str(post.seq))]
        if slot.role is Role.LEAD:
            cites = [Citation(CitationKind.FINDING, f.id) for f in self.store.read_findings(self.goal.id)]
        self.store.submit_finding(
            claim.task.id,
            claim.token,
            author=worker,
            title=f"on {claim.task.title}",
            body=f"{worker} says",
            citations=cites,
        )
        if self.die_after_submit:
            self.die_after_submit -= 1
            self.clock.advance(self.lease_s + 1)  # killed: the lease lapses before anyone notices
            return WorkerSpan(worker, claim.task.id, start, self.clock.now(), "killed", 1, slot.name)
        self.clock.advance(1)
        return WorkerSpan(worker, claim.task.id, start, self.clock.now(), "submitted", 2, slot.name)

    async def close(self) -> None:
        self.deleted |= self.machines


def _config(policy: str, *, workers: int = 3, extra: str = "") -> SwarmConfig:
    return loads_config(f"""
[goal]
objective = "Pick a speech model"
budget_usd = "1"
call_cap = 100
[[tasks.lenses]]
title = "market"
[[tasks.lenses]]
title = "models"
[[tasks.lenses]]
title = "risks"
[policy]
kind = "{policy}"
{extra}
[workers]
count = {workers}
concurrency = 2
""")


def _coordinator(
    tmp_path: Path,
    config: SwarmConfig,
    launcher_kwargs: dict[str, object] | None = None,
    clock: FakeClock | None = None,
    store: Store | None = None,
) -> tuple[Coordinator, StoreLauncher]:
    clock = clock or FakeClock()
    store = store or open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    launcher = StoreLauncher(store, clock, **(launcher_kwargs or {}))  # type: ignore[arg-type]
    return Coordinator(
        config, store, launcher, run_id="run_t", run_dir=tmp_path / "runs" / "run_t", clock=clock
    ), launcher


def _check_run(coordinator: Coordinator, launcher: StoreLauncher, goal_id: str, expected_tasks: int) -> None:
    store = coordinator.store
    tasks = store.list_tasks(goal_id)
    assert len(tasks) == expected_tasks + 1  # plus the lead's
    assert all(t.state is TaskState.DONE for t in tasks)
    findings = store.read_findings(goal_id, limit=1000)
    per_task = Counter(f.task_id for f in findings)
    assert set(per_task) == {t.id for t in tasks}
    assert max(per_task.values()) == 1  # no task produced two findings
    assert all(f.citations for f in findings)
    assert launcher.machines and launcher.deleted == launcher.machines


@pytest.mark.parametrize(("policy", "tasks"), [("independent", 3), ("team", 3), ("explore", 3)])
def test_policies_end_to_end(tmp_path: Path, policy: str, tasks: int) -> None:
    coordinator, launcher = _coordinator(tmp_path, _config(policy))
    result = asyncio.run(coordinator.run())
    assert result.synthesis is not None and result.synthesis.author.startswith("lead")
    assert {c.ref for c in result.synthesis.citations} == {
        f.id for f in coordinator.store.read_findings(result.goal_id) if f.id != result.synthesis.id
    }
    _check_run(coordinator, launcher, result.goal_id, tasks)
    assert result.report is not None and "Pick a speech model" in result.report.markdown.read_text()
    # The run ends with a signed checkpoint over every event, and the report shows its root.
    from swarmyard.audit.verify import verify_run

    verified = verify_run(coordinator.store, coordinator.run_dir / "audit")
    assert verified.size > 0 and result.data.audit_root is not None
    assert result.data.audit_root in result.report.markdown.read_text()
    assert result.data.audit_key is not None and result.data.audit_key in result.report.markdown.read_text()
    groups = {t.group for t in coordinator.store.list_tasks(result.goal_id)} - {"lead"}
    assert groups == (
        {"w0", "w1", "w2"} if policy == "independent" else {policy if policy != "team" else "team"}
    )


def test_groups_policy_broadcasts_between_rounds(tmp_path: Path) -> None:
    coordinator, launcher = _coordinator(
        tmp_path, _config("groups", workers=4, extra="groups = 2\nrounds = 2")
    )
    coordinator.audit_every_n = 5
    result = asyncio.run(coordinator.run())
    _check_run(coordinator, launcher, result.goal_id, 3 * 2 * 2)
    from swarmyard.audit.log import checkpoint_path
    from swarmyard.audit.verify import verify_run

    # one checkpoint after each of the two rounds (each brings more than 5 events), one at the end
    assert checkpoint_path(coordinator.run_dir / "audit", 3).exists()
    assert verify_run(coordinator.store, coordinator.run_dir / "audit").size > 0
    board = coordinator.store.read_board(result.goal_id, limit=1000, kinds=[PostKind.CONSOLIDATION])
    assert {p.group for p in board} == {"g0", "g1"}
    assert all("round 1" in p.body for p in board)


def test_a_hung_worker_loses_its_task_to_another(tmp_path: Path) -> None:
    coordinator, launcher = _coordinator(tmp_path, _config("team"), {"hang": {"worker-0"}})
    result = asyncio.run(coordinator.run())
    _check_run(coordinator, launcher, result.goal_id, 3)
    timed_out = [s for s in result.spans if s.ending == "timeout"]
    assert len(timed_out) == 1
    redone = coordinator.store.get_task(timed_out[0].task_id or "")
    assert redone.state is TaskState.DONE and redone.worker_id != timed_out[0].worker_id
    assert redone.attempts == 2


def test_a_worker_killed_after_submitting_is_not_redone(tmp_path: Path) -> None:
    coordinator, launcher = _coordinator(tmp_path, _config("team"), {"die_after_submit": 1})
    result = asyncio.run(coordinator.run())
    _check_run(coordinator, launcher, result.goal_id, 3)
    killed = [s for s in result.spans if s.ending == "killed"]
    assert len(killed) == 1
    task = coordinator.store.get_task(killed[0].task_id or "")
    # its lease had lapsed: the coordinator took it back to close it rather than hand it to another worker
    assert (task.state, task.worker_id) == (TaskState.DONE, "coordinator")
    assert len([f for f in coordinator.store.read_findings(result.goal_id) if f.task_id == task.id]) == 1


def test_runner_killed_mid_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    clock = FakeClock()
    config = _config("team")
    coordinator, launcher = _coordinator(tmp_path, config, {"crash_at_run": 3, "die_after_submit": 1}, clock)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(coordinator.run())
    assert launcher.deleted == launcher.machines  # machines deleted on Ctrl-C too
    state = RunState.load(tmp_path / "runs" / "run_t" / "run.json")
    before = coordinator.store.read_findings(state.goal_id)
    assert before
    resumed, launcher2 = _coordinator(tmp_path, config, clock=clock, store=coordinator.store)
    result = asyncio.run(resumed.run(resume=True))
    assert result.goal_id == state.goal_id
    after = resumed.store.read_findings(result.goal_id)
    assert {f.id for f in before} <= {f.id for f in after}  # nothing lost
    _check_run(resumed, launcher2, result.goal_id, 3)


def test_resume_without_a_run(tmp_path: Path) -> None:
    from swarmyard.errors import UserError

    coordinator, _ = _coordinator(tmp_path, _config("team"))
    with pytest.raises(UserError, match="no run to resume"):
        asyncio.run(coordinator.run(resume=True))


def test_a_witness_cosigns_every_checkpoint_and_its_loss_is_reported(tmp_path: Path, short_tmp: Path) -> None:
    from conftest import serving_witness
    from swarmyard.audit.verify import verify_run
    from swarmyard.audit.witness import Witness

    clock = FakeClock()
    sock = short_tmp / "w.sock"  # short: Unix socket paths are limited
    witness = Witness.from_files("witness.test", tmp_path / "w.key", tmp_path / "w.json", clock=clock)
    with serving_witness(witness, sock) as client:
        coordinator, _ = _coordinator(tmp_path, _config("team"), clock=clock)
        coordinator.witness = client
        coordinator.audit_every_n = 5  # checkpoints during the run too, each extending the last
        result = asyncio.run(coordinator.run())
        report = verify_run(coordinator.store, coordinator.run_dir / "audit", witness_key=client.verifier())
    assert report.checkpoints >= 2 and report.cosigned == report.checkpoints
    assert result.data.extra["audit witness"] == client.verifier().vkey

    # a witness that refuses at the end (here: another log, with its own key, claims the same origin) must not
    # cost the run its report, which says the last checkpoint is not cosigned; then the run fails
    from swarmyard.errors import AuditError

    with serving_witness(witness, sock) as client:
        coordinator, _ = _coordinator(tmp_path / "second", _config("team"), clock=clock)
        coordinator.witness = client
        with pytest.raises(AuditError, match=r"the witness did not cosign the last checkpoint .*fork or rewrite"):
            asyncio.run(coordinator.run())
    assert "last checkpoint NOT cosigned" in (coordinator.run_dir / "report.md").read_text()


def test_a_run_asking_for_an_unreachable_witness_starts_nothing(tmp_path: Path) -> None:
    from swarmyard.errors import UserError
    from swarmyard.swarm.run import Swarm

    config = _config("team")
    config = config.model_copy(update={"run": config.run.model_copy(update={"runs_dir": str(tmp_path / "runs")})})
    with pytest.raises(UserError, match="witness"):
        Swarm(config, witness=str(tmp_path / "no-such.sock")).run()
    assert not (tmp_path / "runs").exists()


class SlowLauncher(StoreLauncher):
    """Every agent run takes ten seconds of the fake clock."""

    async def run(self, slot: WorkerSlot) -> WorkerSpan:
        span = await super().run(slot)
        self.clock.advance(10)
        return span


def test_groups_rounds_stop_at_the_deadline(tmp_path: Path) -> None:
    config = loads_config("""
[goal]
objective = "Pick a speech model"
budget_usd = "1"
call_cap = 100
deadline_s = 40
[[tasks.lenses]]
title = "market"
[[tasks.lenses]]
title = "models"
[policy]
kind = "groups"
rounds = 5
[[policy.groups]]
prompt = "Argue for it."
[[policy.groups]]
prompt = "Argue against it."
[workers]
count = 2
concurrency = 1
""")
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    launcher = SlowLauncher(store, clock)
    coordinator = Coordinator(config, store, launcher, run_id="run_t", run_dir=tmp_path / "runs" / "run_t",
                              clock=clock)
    result = asyncio.run(coordinator.run())
    titles = Counter(t.title for t in store.list_tasks(result.goal_id) if t.group != "lead")
    # round 1's four tasks (two lenses in two groups) took the 40 s there were: none of the next four rounds
    # was made (their tasks would have stayed pending, unworked)
    assert titles == {"market (round 1)": 2, "models (round 1)": 2}
    prompts = {t.group: t.prompt for t in store.list_tasks(result.goal_id) if t.title == "market (round 1)"}
    assert prompts["g0"].endswith("Your group's formulation: Argue for it.")
    assert prompts["g1"].endswith("Your group's formulation: Argue against it.")
