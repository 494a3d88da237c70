"""The runner end to end in real bubblewrap sandboxes, on the scripted provider.

Each run goes through everything a user's run does: the swarm file, the in-process control plane on a Unix
socket, one ``local`` machine per worker slot with the in-sandbox relay, the built-in agent, the broker, the
lead, the report and the audit log. The scripted provider answers every worker with a board post, then a
finding that cites it; the lead answers with a synthesis. Afterwards nothing of the run's machines may be
left: no process and no mount that names the run folder, no machine folder on disk.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.broker.providers.scripted import CallTools, ScriptedProvider
from swarmyard.domain import CitationKind, TaskState
from swarmyard.store import open_store
from swarmyard.swarm.coordinator import RunResult
from swarmyard.swarm.swarm import Swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/test installs it)"),
]

WORKER_MODEL = "scripted-worker"
LEAD_MODEL = "scripted-lead"
CLI = "from swarmyard.cli.main import main; main()"
LENSES = ("market size", "strongest open models", "risks")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder with a short path: the plane's Unix socket lives in the run folder (at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sy-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def swarm_file(tmp_path: Path, policy: str, *, workers: int = 3, extra_policy: str = "",
               extra_workers: str = "", lenses: tuple[str, ...] = LENSES) -> Path:
    """A swarm file on the scripted provider whose runs folder is under ``tmp_path``."""
    lens_tables = "".join(f'[[tasks.lenses]]\ntitle = "{t}"\nprompt = "Look at {t}."\n' for t in lenses)
    text = f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 200
deadline_s = 600
{lens_tables}
[policy]
kind = "{policy}"
{extra_policy}
[workers]
count = {workers}
concurrency = 1
exec_timeout_s = 60
max_steps = 6
model = "{WORKER_MODEL}"
{extra_workers}
[lead]
model = "{LEAD_MODEL}"
[providers.script]
kind = "scripted"
models = ["{WORKER_MODEL}", "{LEAD_MODEL}"]
[run]
runs_dir = "{tmp_path / 'runs'}"
sandbox = "local"
"""
    path = tmp_path / "swarm.toml"
    path.write_text(text)
    return path


def worker_replies(tasks: int) -> list[CallTools]:
    """Per task a board post, then a finding citing posts by seq (the agent keeps only those it saw).

    The swarm file runs one agent at a time (``concurrency = 1``) so that the shared script is consumed in
    order: one queue cannot tell concurrent agents apart.
    """
    cite = [str(seq) for seq in range(1, 4 * tasks + 1)]
    replies: list[CallTools] = []
    for i in range(tasks):
        replies.append(CallTools((("board_post", {"body": f"progress note {i}"}),)))
        replies.append(CallTools((("submit_finding", {"title": f"finding {i}", "body": f"what worker {i} found",
                                                      "cite": cite}),)))
    return replies


def scripted(tasks: int) -> ScriptedProvider:
    """Replies for ``tasks`` worker tasks and one lead."""
    synthesis = CallTools((("submit_finding", {"title": "synthesis", "body": "Go: the scouts agree."}),))
    return ScriptedProvider({WORKER_MODEL: worker_replies(tasks), LEAD_MODEL: [synthesis]}, name="script")


def leftovers(run_dir: Path, machine_ids: list[str]) -> list[str]:
    """Anything of the run's machines still alive: processes or mounts naming the run folder, machine disks."""
    mark = str(run_dir.resolve())
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if mark in cmdline:
            found.append(f"process {proc.name}: {cmdline[:200]}")
    found += [f"mount {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if mark in line]
    from swarmyard.machines.supervised import default_root

    found += [f"machine disk {m}" for m in machine_ids if (default_root() / "m" / m).exists()]
    return found


def machine_ids(result: RunResult, run_dir: Path) -> list[str]:
    """The machines the run recorded as created (audit events)."""
    import json

    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        size = store.sequence_events()
        events = store.read_events(0, size)
    finally:
        store.close()
    bodies = [json.loads(e.body) for e in events if e.kind == "machine.created"]
    return [str(body.get("data", body)["machine"]) for body in bodies]


def check_run(result: RunResult, run_dir: Path, *, tasks: int) -> None:
    """Every task claimed and done once, findings cited, a synthesis citing them, no machine left, audit OK."""
    data = result.data
    work = [t for t in data.tasks if t.group != "lead"]
    assert len(work) == tasks
    assert all(t.state is TaskState.DONE for t in data.tasks), [(t.title, t.state) for t in data.tasks]
    per_task = Counter(f.task_id for f in data.findings)
    assert set(per_task) == {t.id for t in data.tasks} and max(per_task.values()) == 1
    # claimed once: no task needed a second attempt on a clean run
    assert all(t.attempts == 1 for t in data.tasks), [(t.title, t.attempts) for t in data.tasks]
    workers = [f for f in data.findings if f.group != "lead"]
    assert all(f.citations and {c.kind for c in f.citations} == {CitationKind.POST} for f in workers)
    assert result.synthesis is not None and result.synthesis.body == "Go: the scouts agree."
    assert {c.ref for c in result.synthesis.citations} == {f.id for f in workers}
    assert result.report is not None and "Go: the scouts agree." in result.report.markdown.read_text()
    assert leftovers(run_dir, machine_ids(result, run_dir)) == []
    verify = subprocess.run(
        [sys.executable, "-c", CLI, "audit", "verify", str(run_dir)],
        capture_output=True, text=True, timeout=60,
    )
    assert verify.returncode == 0 and verify.stdout.startswith("OK "), verify.stdout + verify.stderr
    assert data.audit_root is not None and data.audit_root in verify.stdout


@pytest.mark.parametrize(("policy", "extra", "workers", "tasks"), [
    ("independent", "", 3, 3),
    ("team", "", 3, 3),
    ("explore", "", 3, 3),
    ("groups", "groups = 2\nrounds = 2", 2, 3 * 2 * 2),
])
def test_each_policy_runs_to_a_synthesis_in_real_sandboxes(
    short_tmp: Path, policy: str, extra: str, workers: int, tasks: int
) -> None:
    provider = scripted(tasks)
    result = Swarm.from_file(swarm_file(short_tmp, policy, workers=workers, extra_policy=extra),
                             providers={"script": provider}).run()
    run_dir = short_tmp / "runs" / result.run_id
    check_run(result, run_dir, tasks=tasks)
    groups = {t.group for t in result.data.tasks} - {"lead"}
    expected = {"independent": {"w0", "w1", "w2"}, "team": {"team"}, "explore": {"explore"},
                "groups": {"g0", "g1"}}[policy]
    assert groups == expected
    # every model call went through the broker with a worker's token: the ledger names a worker per call
    assert len(provider.requests) == 2 * tasks + 1
